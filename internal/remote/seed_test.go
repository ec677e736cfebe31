package remote

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/testutil/btrfstest"
)

// TestFetchSeedsTreeMemory: a tree fetched over its base (on btrfs, as a
// resume fetches it: a snapshot of the image) has the store remember
// the base's files it kept, so the sandbox's next upload from this host
// takes their chunks unread; a file changed since (same size and mtime,
// only its ctime moved) is read again, and what the upload stores is
// the tree as it is. Files that changed close before the fetch are not
// remembered.
func TestFetchSeedsTreeMemory(t *testing.T) {
	ctx := context.Background()
	dir := btrfstest.Dir(t)
	b, k, up := dirStore(t)
	tmpBase, tmpChanged := baseAndChanged(t)
	base := filepath.Join(dir, "base")
	if err := fsnap.CreateSubvolume(base); err != nil {
		t.Fatal(err)
	}
	copyTree(t, tmpBase, base)
	src := artifact(t, "ck0000000001", randomPages(t, 4), "x")
	src.Tree = tmpChanged
	if _, _, err := up.Upload(ctx, src); err != nil {
		t.Fatal(err)
	}

	// Another daemon resumes it: the tree fetched over a snapshot of the
	// base. Just made, the base's files are too new to remember; the
	// clock moved on, they are old enough.
	for _, later := range []time.Duration{0, time.Minute} {
		s, err := Open(ctx, b, k)
		if err != nil {
			t.Fatal(err)
		}
		s.clock = func() time.Time { return time.Now().Add(later) }
		r, err := s.Recipe(ctx, "ck0000000001")
		if err != nil {
			t.Fatal(err)
		}
		fetched := filepath.Join(dir, "fetched"+later.String())
		if err := fsnap.Snapshot(base, fetched, false); err != nil {
			t.Fatal(err)
		}
		st, err := s.FetchTreeOver(ctx, r, fetched, Base{Dir: base, Key: "base"})
		if err != nil {
			t.Fatal(err)
		}
		if later == 0 {
			if st.Remembered != 0 {
				t.Fatalf("remembered %d files changed just before the fetch", st.Remembered)
			}
			continue
		}
		// 39 small files and the same-big one were kept (f03 changed).
		if st.Remembered < 40 || st.Remembered > st.KeptEntries {
			t.Fatalf("remembered %d files; %+v", st.Remembered, st)
		}

		// The sandbox runs on a snapshot of it and changes f05 in place:
		// same size, same mtime.
		root := filepath.Join(dir, "root")
		if err := fsnap.Snapshot(fetched, root, false); err != nil {
			t.Fatal(err)
		}
		f05 := filepath.Join(root, "usr/lib/f05")
		fi, err := os.Stat(f05)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f05, bytes.Repeat([]byte{'z'}, int(fi.Size())), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f05, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		next := filepath.Join(dir, "ck2")
		if err := fsnap.Snapshot(root, next, true); err != nil {
			t.Fatal(err)
		}
		src2 := artifact(t, "ck0000000002", randomPages(t, 4), "x")
		src2.Tree, src2.Parent, src2.Snapshot = next, "ck0000000001", s.now()
		_, st2, err := s.Upload(ctx, src2)
		if err != nil {
			t.Fatal(err)
		}
		if st2.ReusedBytes < 2<<20 {
			t.Fatalf("the next upload took %d bytes unread, want the kept files' (%+v)", st2.ReusedBytes, st2)
		}
		r2, err := s.Recipe(ctx, "ck0000000002")
		if err != nil {
			t.Fatal(err)
		}
		plain := t.TempDir()
		if err := s.FetchTree(ctx, r2, plain); err != nil {
			t.Fatal(err)
		}
		if got, want := listing(t, plain), listing(t, next); !slices.Equal(got, want) {
			t.Fatalf("the upload after the seeded one stored another tree:\n%s", diffLines(got, want))
		}
		if got, _ := os.ReadFile(filepath.Join(plain, "usr/lib/f05")); !bytes.Equal(got, bytes.Repeat([]byte{'z'}, int(fi.Size()))) {
			t.Fatalf("f05 as stored: %q", got[:min(len(got), 16)])
		}
	}
}
