package ckstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"github.com/molt-sh/molt/internal/testutil/btrfstest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/ckstore/storetest"
)

// TestLocal runs the conformance suite against the local backend, on a
// plain directory (nothing in it needs btrfs or root).
func TestLocal(t *testing.T) {
	storetest.Run(t, func(t *testing.T) ckstore.Backend { return ckstore.NewLocal(t.TempDir()) })
}

// stored makes a committed local artifact of one image and returns its
// store, directory and objects.
func stored(t *testing.T) (*ckstore.Store, string, []ckstore.Object) {
	t.Helper()
	l := ckstore.NewLocal(t.TempDir())
	s := ckstore.New(l)
	id := "ck0123456789"
	w, err := s.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.FS(id), 0o700); err != nil {
		t.Fatal(err)
	}
	staging := t.TempDir()
	// Pages all different: on a filesystem without reflinks (a plain
	// temporary directory) no page can be shared.
	pages := make([]byte, 3*4096)
	if _, err := rand.Read(pages); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(staging, "pages-1.img"), pages, 0o600); err != nil {
		t.Fatal(err)
	}
	objs, _, err := w.StoreImages(context.Background(), staging, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mf := ckstore.Manifest{Format: ckstore.Format, ID: id, Sandbox: "sb0123456789", Kind: "full", Objects: objs}
	if _, err := w.Commit(mf); err != nil {
		t.Fatal(err)
	}
	s.Remember(id, objs)
	return s, l.Dir(id), objs
}

// TestLocalQuickVerifySeesWritesInPlace: the quick verification trusts
// an object only while it is as it was hashed; a write into the file
// (what corruption through the filesystem is) moves its ctime, and the
// object is hashed again.
func TestLocalQuickVerifySeesWritesInPlace(t *testing.T) {
	s, dir, objs := stored(t)
	if err := s.Verify("ck0123456789", objs, false); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "images", "pages-1.img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupt!"), 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := s.Verify("ck0123456789", objs, false); err == nil || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("quick verify after a write in place: %v", err)
	}
}

// TestLocalRefusesPlantedLinks: an object replaced by a symbolic link
// (to a copy of its own bytes elsewhere) is not followed.
func TestLocalRefusesPlantedLinks(t *testing.T) {
	s, dir, objs := stored(t)
	obj := filepath.Join(dir, "images", "pages-1.img")
	elsewhere := filepath.Join(t.TempDir(), "pages-1.img")
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(elsewhere, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(obj); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, obj); err != nil {
		t.Fatal(err)
	}
	for _, thorough := range []bool{false, true} {
		if err := s.Verify("ck0123456789", objs, thorough); err == nil {
			t.Fatalf("verified (thorough %v) through a planted link", thorough)
		}
	}
	// A link in place of the images directory is not followed either.
	if err := os.RemoveAll(filepath.Join(dir, "images")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(elsewhere), filepath.Join(dir, "images")); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify("ck0123456789", objs, true); err == nil {
		t.Fatal("verified through a planted directory link")
	}
}

// TestLocalBtrfs runs the conformance suite against the local backend on
// btrfs, where pages are shared by reflink and deletes meet subvolumes.
func TestLocalBtrfs(t *testing.T) {
	dir := btrfstest.Dir(t)
	n := 0
	storetest.Run(t, func(t *testing.T) ckstore.Backend {
		n++
		d := filepath.Join(dir, fmt.Sprint(n))
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return ckstore.NewLocal(d)
	})
}

// TestPageIndexSharesTheLineage: a checkpoint whose pages its parent
// holds writes only the new ones; the index follows parents up to
// LineageDepth full checkpoints.
func TestPageIndexSharesTheLineage(t *testing.T) {
	s := ckstore.New(ckstore.NewLocal(btrfstest.Dir(t)))
	pages := make([]byte, 64*4096)
	if _, err := rand.Read(pages); err != nil {
		t.Fatal(err)
	}
	refs := map[string]ckstore.Ref{}
	lookup := func(id string) (ckstore.Ref, bool) { r, ok := refs[id]; return r, ok }
	write := func(id, parent string) int64 {
		t.Helper()
		w, err := s.Create(id)
		if err != nil {
			t.Fatal(err)
		}
		staging := t.TempDir()
		if err := os.WriteFile(filepath.Join(staging, "pages-1.img"), pages, 0o600); err != nil {
			t.Fatal(err)
		}
		objs, written, err := w.StoreImages(context.Background(), staging, s.PageIndex(parent, lookup), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		refs[id] = ckstore.Ref{ID: id, Parent: parent, Full: true, Objects: objs}
		return written
	}
	if w := write("ck0000000001", ""); w < int64(len(pages)) {
		t.Fatalf("first checkpoint wrote %d bytes of %d", w, len(pages))
	}
	pages[0] ^= 1 // one page changes
	if w := write("ck0000000002", "ck0000000001"); w > 2*4096 {
		t.Fatalf("child checkpoint wrote %d bytes; its parent holds all but one page", w)
	}
	// An fs checkpoint in between is passed through.
	refs["ck0000000003"] = ckstore.Ref{ID: "ck0000000003", Parent: "ck0000000002"}
	if x := s.PageIndex("ck0000000003", lookup); x.Len() < 64 {
		t.Fatalf("index through an fs checkpoint: %d pages", x.Len())
	}
	if x := s.PageIndex("ck0000000009", lookup); x.Len() != 0 {
		t.Fatalf("index of an unknown head: %d pages", x.Len())
	}
}

// BenchmarkVerifyQuick is the verification on a rollback's path: every
// object stat'ed, none hashed again.
func BenchmarkVerifyQuick(b *testing.B) {
	s, id, objs := committed40(b)
	b.ResetTimer()
	for b.Loop() {
		if err := s.Verify(id, objs, false); err != nil {
			b.Fatal(err)
		}
	}
}

// committed40 is a committed checkpoint of 40 small objects, hashed by
// its store: what a quick verification and open of a checkpoint of an
// idle session go through.
func committed40(b *testing.B) (*ckstore.Store, string, []ckstore.Object) {
	s := ckstore.New(ckstore.NewLocal(b.TempDir()))
	id := "ck0123456789"
	w, err := s.Create(id)
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(s.FS(id), 0o700); err != nil {
		b.Fatal(err)
	}
	staging := b.TempDir()
	for i := range 40 {
		if err := os.WriteFile(filepath.Join(staging, fmt.Sprintf("core-%d.img", i)), []byte(fmt.Sprint(i)), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	objs, _, err := w.StoreImages(context.Background(), staging, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.Commit(ckstore.Manifest{Format: ckstore.Format, ID: id, Sandbox: "sb0123456789", Kind: "full", Objects: objs}); err != nil {
		b.Fatal(err)
	}
	s.Remember(id, objs)
	return s, id, objs
}

// BenchmarkOpenQuick is what a restore pays before CRIU starts: the
// manifest check and the quick verification of 40 objects (compare with
// BenchmarkVerifyQuick for the manifest's share).
func BenchmarkOpenQuick(b *testing.B) {
	s, id, objs := committed40(b)
	r := s.Reader(id)
	b.ResetTimer()
	for b.Loop() {
		if _, err := r.Open(objs, false); err != nil {
			b.Fatal(err)
		}
	}
}

// TestLocalOpenSeesManifestChanges: Open reads the manifest again once it
// changed since it was last found sound (its version), so a manifest
// replaced or removed after a successful open is still refused; an
// unchanged one is not read again.
func TestLocalOpenSeesManifestChanges(t *testing.T) {
	s, dir, objs := stored(t)
	r := s.Reader("ck0123456789")
	if _, err := r.Open(objs, false); err != nil {
		t.Fatal(err)
	}
	mfPath := filepath.Join(dir, ckstore.ManifestFile)
	b, err := os.ReadFile(mfPath)
	if err != nil {
		t.Fatal(err)
	}
	// Another checkpoint's manifest put in its place.
	other := strings.Replace(string(b), `"ck0123456789"`, `"ckabcdefabcd"`, 1)
	if err := os.WriteFile(mfPath, []byte(other), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Open(objs, false); err == nil {
		t.Fatal("opened with another checkpoint's manifest after a sound open")
	}
	if err := os.WriteFile(mfPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Open(objs, false); err != nil {
		t.Fatalf("open with its own manifest back: %v", err)
	}
	if err := os.Remove(mfPath); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Open(objs, false); err == nil {
		t.Fatal("opened without a manifest after a sound open")
	}
}
