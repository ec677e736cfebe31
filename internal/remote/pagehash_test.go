package remote

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/pagestore"
)

// TestUploadByPageHashes: an upload names the pages the store has by
// the checkpoint's hash file without reading them, reads the others and
// checks each against the file, and stores what reading every page
// stores; a hash file or a new page that is not what the checkpoint
// says fails it.
func TestUploadByPageHashes(t *testing.T) {
	ctx := context.Background()
	b, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, b, keyring(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 1024
	pages := randomPages(t, n)
	if _, _, err := s.Upload(ctx, artifact(t, "ck0000000001", pages, "a")); err != nil {
		t.Fatal(err)
	}
	next := bytes.Clone(pages)
	copy(next[3*pagestore.PageSize:], randomPages(t, 2))

	// One run of two new pages is read, besides the hash file and the
	// small objects; reading every page (the baseline) reads them all.
	byHash, stH, err := s.Upload(ctx, artifact(t, "ck0000000002", next, "b"))
	if err != nil {
		t.Fatal(err)
	}
	s.readWhole = true
	whole, stW, err := s.Upload(ctx, artifact(t, "ck0000000003", next, "b"))
	s.readWhole = false
	if err != nil {
		t.Fatal(err)
	}
	if stW.ReadBytes < int64(len(next)) {
		t.Fatalf("reading every page read %d bytes, fewer than the image's %d", stW.ReadBytes, len(next))
	}
	// The tree's files are read by both (a fresh tree each time).
	if pagesRead := stH.ReadBytes - (stW.ReadBytes - int64(len(next))); pagesRead != 2*pagestore.PageSize {
		t.Fatalf("by the hash file, the image's pages read: %d bytes, want the 2 new pages (%d); whole %+v, by hash %+v",
			pagesRead, 2*pagestore.PageSize, stW, stH)
	}
	if stH.UploadedBytes < 2*pagestore.PageSize || stH.Chunks != stW.Chunks {
		t.Fatalf("uploads of the same content: whole %+v, by hash %+v", stW, stH)
	}
	// The same recipe, and the same bytes fetched.
	img := func(r Recipe) Object {
		for _, o := range r.Objects {
			if o.Name == "images/pages-1.img" {
				// Each extent with its pack's name (the recipes list
				// their packs in their own orders).
				o.Extents = slices.Clone(o.Extents)
				for i := range o.Extents {
					o.Extents[i].Pack, o.Extents[i].P = r.Packs[o.Extents[i].P], 0
				}
				return o
			}
		}
		t.Fatal("no page image in the recipe")
		return Object{}
	}
	if a, b := img(whole), img(byHash); !reflect.DeepEqual(a, b) {
		t.Fatalf("the image's recipe by hash differs:\n%+v\n%+v", b, a)
	}
	fetched := func(id string) []byte {
		r, err := s.Recipe(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		if _, err := s.FetchObjects(ctx, r, dir); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, "images/pages-1.img"))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if !bytes.Equal(fetched("ck0000000002"), next) {
		t.Fatal("the image uploaded by its hash file fetches other bytes")
	}

	// A new page whose bytes are not those its hash says: refused.
	src := artifact(t, "ck0000000004", randomPages(t, 8), "c")
	flip(t, filepath.Join(src.Dir, "images/pages-1.img"), 5*pagestore.PageSize+9)
	if _, _, err := s.Upload(ctx, src); !errors.Is(err, errCorrupt) {
		t.Fatalf("a damaged new page: %v", err)
	}
	// A hash file that is not the one the checkpoint lists: refused.
	src = artifact(t, "ck0000000005", randomPages(t, 8), "d")
	flip(t, filepath.Join(src.Dir, ckstore.PageHashDir, "pages-1.img"), 40)
	if _, _, err := s.Upload(ctx, src); !errors.Is(err, errCorrupt) {
		t.Fatalf("a damaged hash file: %v", err)
	}
	for _, id := range []string{"ck0000000004", "ck0000000005"} {
		if _, err := s.Recipe(ctx, id); err == nil {
			t.Fatalf("a refused upload left recipe %s", id)
		}
	}
	// A page the store has is not read: rotted here after the dump, the
	// store still gets the page the checkpoint's record says.
	src = artifact(t, "ck0000000006", next, "e")
	flip(t, filepath.Join(src.Dir, "images/pages-1.img"), 700*pagestore.PageSize)
	if _, _, err := s.Upload(ctx, src); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fetched("ck0000000006"), next) {
		t.Fatal("the store got the rotted page")
	}
}

func flip(t *testing.T, file string, off int64) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[off] ^= 0x40
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
