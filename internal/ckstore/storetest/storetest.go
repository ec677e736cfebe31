// Package storetest is the conformance suite of ckstore backends: every
// Backend runs it (as containerd's snapshotters run
// core/snapshots/testsuite), so that what the engine relies on holds
// whatever stores the bytes: what is written reads back the same, an
// artifact without its manifest is not complete, verification refuses
// damaged objects and manifests, no name from a manifest or a caller
// leaves its checkpoint, and writers of different checkpoints do not
// meet.
package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/pagestore"
)

// Run runs the suite against backends newBackend makes: an empty one
// for each subtest.
func Run(t *testing.T, newBackend func(t *testing.T) ckstore.Backend) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, ckstore.Backend)
	}{
		{"RoundTrip", roundTrip},
		{"CommitAtomicity", commitAtomicity},
		{"VerifyRefusesCorrupt", verifyRefusesCorrupt},
		{"VerifyRefusesTruncated", verifyRefusesTruncated},
		{"VerifyRefusesMissing", verifyRefusesMissing},
		{"VerifyRefusesTamperedManifest", verifyRefusesTamperedManifest},
		{"HostileNames", hostileNames},
		{"HostileManifest", hostileManifest},
		{"Delete", deleteArtifact},
		{"ConcurrentWriters", concurrentWriters},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newBackend(t)) })
	}
}

// image is one file of a staged dump.
type image struct {
	name string
	data []byte
}

// images returns a dump's worth of images, different for each seed: a
// multi-page one with a partial last page, a one-page one and a small
// one.
func images(t *testing.T, seed string) []image {
	t.Helper()
	pages := make([]byte, 3*pagestore.PageSize+100)
	if _, err := rand.Read(pages); err != nil {
		t.Fatal(err)
	}
	one := bytes.Repeat([]byte(seed[:1]), pagestore.PageSize)
	return []image{
		{"pages-1.img", pages},
		{"mm-1.img", one},
		{"core-1.img", []byte("core of " + seed)},
	}
}

// stage writes imgs into a fresh staging directory.
func stage(t *testing.T, imgs []image) string {
	t.Helper()
	dir := t.TempDir()
	for _, im := range imgs {
		if err := os.WriteFile(filepath.Join(dir, im.name), im.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func manifest(id string, objs []ckstore.Object) ckstore.Manifest {
	return ckstore.Manifest{
		Format: ckstore.Format, ID: id, Sandbox: "sb0123456789", Kind: "full", Image: "debian",
		Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Molt: "test", Kernel: "test", Arch: "test",
		Objects: objs,
	}
}

// fsSnapshot stands in for the engine's snapshot of the files, which a
// local artifact holds and verification requires.
func fsSnapshot(t *testing.T, b ckstore.Backend, id string) {
	t.Helper()
	if l, ok := b.(ckstore.LocalBackend); ok {
		if err := os.Mkdir(filepath.Join(l.Dir(id), ckstore.FSDir), 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

// write makes a committed artifact of checkpoint id and returns its
// store, objects and images.
func write(t *testing.T, s *ckstore.Store, id string) ([]ckstore.Object, []image) {
	t.Helper()
	objs, imgs := store(t, s, id)
	if _, err := s.Writer(id).Commit(manifest(id, objs)); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return objs, imgs
}

// store makes an artifact of checkpoint id with objects but no manifest.
func store(t *testing.T, s *ckstore.Store, id string) ([]ckstore.Object, []image) {
	t.Helper()
	imgs := images(t, id)
	w, err := s.Create(id)
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	fsSnapshot(t, s.Backend(), id)
	objs, _, err := w.StoreImages(context.Background(), stage(t, imgs), nil, nil, nil)
	if err != nil {
		t.Fatalf("store images of %s: %v", id, err)
	}
	return objs, imgs
}

func read(t *testing.T, b ckstore.Backend, id, name string) []byte {
	t.Helper()
	r, err := b.Open(id, name)
	if err != nil {
		t.Fatalf("open %s of %s: %v", name, id, err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// replace puts data in place of object name of checkpoint id.
func replace(t *testing.T, b ckstore.Backend, id, name string, data []byte) {
	t.Helper()
	if err := b.Remove(id, name); err != nil {
		t.Fatalf("remove %s: %v", name, err)
	}
	src := filepath.Join(t.TempDir(), "replacement")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(context.Background(), id, name, src, ckstore.PutOptions{}); err != nil {
		t.Fatalf("put %s: %v", name, err)
	}
}

func roundTrip(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id := "ck0000000001"
	objs, imgs := write(t, s, id)

	var names []string
	for _, o := range objs {
		names = append(names, o.Path)
	}
	want := []string{"images/core-1.img", "images/mm-1.img", "images/pages-1.img", "pagehash/pages-1.img"}
	if !slices.Equal(names, want) {
		t.Fatalf("objects %v, want %v (sorted; a hash file for the multi-page image only)", names, want)
	}
	for _, im := range imgs {
		got := read(t, b, id, "images/"+im.name)
		if !bytes.Equal(got, im.data) {
			t.Fatalf("%s reads back %d bytes, not the %d stored", im.name, len(got), len(im.data))
		}
		o := objs[slices.Index(names, "images/"+im.name)]
		if o.Size != int64(len(im.data)) || o.SHA256 != sum(im.data) {
			t.Fatalf("%s recorded as %+v", im.name, o)
		}
		if fi, err := b.Stat(id, o.Path); err != nil || fi.Size != o.Size {
			t.Fatalf("stat %s: %+v %v", o.Path, fi, err)
		}
	}
	if h := read(t, b, id, "pagehash/pages-1.img"); len(h) != 4*pagestore.HashSize {
		t.Fatalf("hash file of 3 whole pages and a part: %d bytes, want 4 hashes", len(h))
	}

	mf, err := s.ReadManifest(id)
	if err != nil {
		t.Fatalf("read the manifest back: %v", err)
	}
	if wantMF := manifest(id, objs); !mfEqual(mf, wantMF) {
		t.Fatalf("manifest reads back as %+v, want %+v", mf, wantMF)
	}
	if ids, err := s.List(); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("list: %v %v, want %s", ids, err, id)
	}
	if got, why := s.Complete(id); why != "" && !strings.Contains(why, "file snapshot") {
		t.Fatalf("complete: %s", why)
	} else if why == "" && got.ID != id {
		t.Fatalf("complete: manifest of %q", got.ID)
	}
	for _, thorough := range []bool{true, false, false} {
		if err := s.Verify(id, objs, thorough); err != nil {
			t.Fatalf("verify (thorough %v): %v", thorough, err)
		}
	}
	if _, ok := b.(ckstore.LocalBackend); ok {
		r, err := s.Reader(id).Open(objs, true)
		if err != nil {
			t.Fatalf("open for restore: %v", err)
		}
		for _, im := range imgs {
			got, err := os.ReadFile(filepath.Join(r.Images, im.name))
			if err != nil || !bytes.Equal(got, im.data) {
				t.Fatalf("CRIU's view of %s: %d bytes, %v", im.name, len(got), err)
			}
		}
	}
	if _, err := s.Create(id); err == nil {
		t.Fatalf("a second create of %s succeeded", id)
	}
}

func mfEqual(a, b ckstore.Manifest) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

func commitAtomicity(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id := "ck0000000002"
	objs, _ := store(t, s, id)
	if ids, err := s.List(); err != nil || slices.Contains(ids, id) {
		t.Fatalf("list before the commit: %v %v", ids, err)
	}
	if _, err := s.ReadManifest(id); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("manifest before the commit: %v, want not exist", err)
	}
	if _, why := s.Complete(id); why == "" {
		t.Fatal("an artifact without its manifest is complete")
	}
	if _, err := s.Reader(id).Open(objs, true); err == nil {
		t.Fatal("opened for restore before the commit")
	}
	if ids, err := b.List(); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("backend list (every artifact): %v %v", ids, err)
	}
	// A manifest names its own checkpoint only.
	if _, err := s.Writer(id).Commit(manifest("ck0000000099", objs)); err == nil {
		t.Fatal("committed another checkpoint's manifest")
	}
	if _, err := s.Writer(id).Commit(manifest(id, objs)); err != nil {
		t.Fatal(err)
	}
	if ids, err := s.List(); err != nil || !slices.Contains(ids, id) {
		t.Fatalf("list after the commit: %v %v", ids, err)
	}
	if _, ok := b.(ckstore.LocalBackend); ok {
		if _, err := s.Reader(id).Open(objs, true); err != nil {
			t.Fatalf("open for restore after the commit: %v", err)
		}
	}
}

// refused checks that verification of id, quick and thorough, fails
// naming object name and what.
func refused(t *testing.T, s *ckstore.Store, id string, objs []ckstore.Object, name, what string) {
	t.Helper()
	for _, thorough := range []bool{false, true} {
		err := s.Verify(id, objs, thorough)
		if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), what) {
			t.Fatalf("verify (thorough %v) of %s with %s: %v", thorough, name, what, err)
		}
		if _, err := s.Reader(id).Open(objs, thorough); err == nil {
			t.Fatalf("opened for restore with %s %s", name, what)
		}
	}
}

func verifyRefusesCorrupt(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id := "ck0000000003"
	objs, imgs := write(t, s, id)
	if err := s.Verify(id, objs, true); err != nil { // stamps the objects
		t.Fatal(err)
	}
	bad := bytes.Clone(imgs[0].data)
	bad[100] ^= 0xff
	replace(t, b, id, "images/"+imgs[0].name, bad)
	refused(t, s, id, objs, imgs[0].name, "corrupted")
}

func verifyRefusesTruncated(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id := "ck0000000004"
	objs, imgs := write(t, s, id)
	s.Remember(id, objs)
	replace(t, b, id, "images/"+imgs[0].name, imgs[0].data[:pagestore.PageSize])
	refused(t, s, id, objs, imgs[0].name, "truncated")
}

func verifyRefusesMissing(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id := "ck0000000005"
	objs, _ := write(t, s, id)
	s.Remember(id, objs)
	if err := b.Remove(id, "images/core-1.img"); err != nil {
		t.Fatal(err)
	}
	refused(t, s, id, objs, "core-1.img", "missing")
	if _, why := s.Complete(id); why == "" {
		t.Fatal("an artifact missing an object is complete")
	}
}

// A manifest changed on disk: objects it lists as other than stored
// are refused once it is read back (as a rebuild reads it), and so is a
// manifest naming another checkpoint.
func verifyRefusesTamperedManifest(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id := "ck0000000006"
	objs, _ := write(t, s, id)

	mf := manifest(id, slices.Clone(objs))
	mf.Objects[0].SHA256 = strings.Repeat("0", 64)
	put(t, b, id, mf)
	got, err := s.ReadManifest(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(id, got.Objects, true); err == nil || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("verify against a manifest with another hash: %v", err)
	}

	mf = manifest(id, slices.Clone(objs))
	mf.Objects[0].Size++
	put(t, b, id, mf)
	if _, why := s.Complete(id); why == "" {
		t.Fatal("complete with a manifest listing another size")
	}
	got, _ = s.ReadManifest(id)
	if err := s.Verify(id, got.Objects, true); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("verify against a manifest with another size: %v", err)
	}

	put(t, b, id, manifest("ck0000000007", objs))
	if _, why := s.Complete(id); why == "" {
		t.Fatal("complete with a manifest naming another checkpoint")
	}
	if _, err := s.Reader(id).Open(objs, true); err == nil {
		t.Fatal("opened for restore with a manifest naming another checkpoint")
	}
}

func put(t *testing.T, b ckstore.Backend, id string, mf ckstore.Manifest) {
	t.Helper()
	enc, err := mf.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.PutManifest(id, enc); err != nil {
		t.Fatal(err)
	}
}

var hostileIDs = []string{"", ".", "..", "../ck0000000001", "a/b", "/etc", "ck\x00", strings.Repeat("a", 100)}

var badNames = []string{"", ".", "..", "../ck0000000001/images/core-1.img", "/etc/passwd", "images/../../x", "images//core-1.img", "images/./core-1.img"}

// hostileNames: no ID or object name a caller passes leaves the
// checkpoint's artifact, and each is refused as an invalid argument.
func hostileNames(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	other := "ck0000000001"
	otherObjs, _ := write(t, s, other)
	id := "ck0000000008"
	write(t, s, id)
	before, err := b.List()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "x")
	if err := os.WriteFile(src, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	invalid := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid argument", what, err)
		}
	}
	for _, bad := range hostileIDs {
		invalid(fmt.Sprintf("create %q", bad), b.Create(bad))
		_, err := b.Put(context.Background(), bad, "images/x", src, ckstore.PutOptions{})
		invalid(fmt.Sprintf("put into %q", bad), err)
		_, err = b.Open(bad, "manifest.json")
		invalid(fmt.Sprintf("open in %q", bad), err)
		_, err = b.Stat(bad, "manifest.json")
		invalid(fmt.Sprintf("stat in %q", bad), err)
		invalid(fmt.Sprintf("remove in %q", bad), b.Remove(bad, "manifest.json"))
		invalid(fmt.Sprintf("put manifest of %q", bad), b.PutManifest(bad, []byte("{}")))
		_, err = b.Manifest(bad)
		invalid(fmt.Sprintf("manifest of %q", bad), err)
		invalid(fmt.Sprintf("delete %q", bad), b.Delete(bad))
	}
	for _, bad := range badNames {
		_, err := b.Put(context.Background(), id, bad, src, ckstore.PutOptions{})
		invalid(fmt.Sprintf("put %q", bad), err)
		_, err = b.Open(id, bad)
		invalid(fmt.Sprintf("open %q", bad), err)
		_, err = b.Stat(id, bad)
		invalid(fmt.Sprintf("stat %q", bad), err)
		invalid(fmt.Sprintf("remove %q", bad), b.Remove(id, bad))
	}
	after, err := b.List()
	if err != nil || !slices.Equal(sorted(before), sorted(after)) {
		t.Fatalf("artifacts %v after hostile names, %v before (%v)", after, before, err)
	}
	if err := s.Verify(other, otherObjs, true); err != nil {
		t.Fatalf("the other checkpoint after hostile names: %v", err)
	}
	// A record naming another checkpoint's object, hash and size right,
	// does not verify through it.
	o := otherObjs[0]
	o.Path = "../" + other + "/" + o.Path
	if err := s.Verify(id, []ckstore.Object{o}, true); err == nil {
		t.Fatal("verified an object outside the checkpoint")
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// hostileManifest: a manifest on disk whose objects lie outside the
// checkpoint, or that is not one manifest of a known format, is not
// read, listed or completed.
func hostileManifest(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	write(t, s, "ck0000000001")
	id := "ck0000000009"
	objs, _ := write(t, s, id)
	sane := manifest(id, objs)
	enc, _ := sane.Encode()
	escape := strings.Replace(string(enc), `"images/core-1.img"`, `"../ck0000000001/images/core-1.img"`, 1)
	absolute := strings.Replace(string(enc), `"images/core-1.img"`, `"/etc/passwd"`, 1)
	for name, raw := range map[string]string{
		"object outside":     escape,
		"object absolute":    absolute,
		"newer format":       strings.Replace(string(enc), `"format": 1`, `"format": 2`, 1),
		"ID outside":         strings.Replace(string(enc), `"id": "`+id+`"`, `"id": "../`+id+`"`, 1),
		"two manifests":      string(enc) + string(enc),
		"not JSON":           "\x00\x01",
		"truncated manifest": string(enc[:len(enc)/2]),
	} {
		if raw == string(enc) {
			t.Fatalf("%s: the manifest was not changed", name)
		}
		if err := b.PutManifest(id, []byte(raw)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReadManifest(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: read as %v", name, err)
		}
		if _, why := s.Complete(id); why == "" {
			t.Errorf("%s: complete", name)
		}
		if ids, _ := s.List(); slices.Contains(ids, id) {
			t.Errorf("%s: listed", name)
		}
		if _, err := s.Reader(id).Open(objs, true); err == nil {
			t.Errorf("%s: opened for restore", name)
		}
	}
}

func deleteArtifact(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	id, keep, partial := "ck0000000010", "ck0000000011", "ck0000000012"
	objs, _ := write(t, s, id)
	keepObjs, _ := write(t, s, keep)
	store(t, s, partial)
	for _, d := range []string{id, partial} {
		if err := s.Delete(d); err != nil {
			t.Fatalf("delete %s: %v", d, err)
		}
	}
	ids, err := b.List()
	if err != nil || slices.Contains(ids, id) || slices.Contains(ids, partial) || !slices.Contains(ids, keep) {
		t.Fatalf("artifacts after delete: %v %v", ids, err)
	}
	if _, err := b.Manifest(id); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("manifest of a deleted checkpoint: %v", err)
	}
	if _, err := b.Open(id, objs[0].Path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("object of a deleted checkpoint: %v", err)
	}
	if err := s.Verify(id, objs, false); err == nil {
		t.Fatal("a deleted checkpoint verifies")
	}
	if err := s.Delete(id); err != nil {
		t.Fatalf("delete again: %v", err)
	}
	if err := s.Verify(keep, keepObjs, true); err != nil {
		t.Fatalf("the checkpoint kept: %v", err)
	}
	// The ID can be used again.
	write(t, s, id)
}

func concurrentWriters(t *testing.T, b ckstore.Backend) {
	s := ckstore.New(b)
	const n = 8
	type result struct {
		objs []ckstore.Object
		imgs []image
		err  error
	}
	res := make([]result, n)
	stagings := make([]string, n)
	all := make([][]image, n)
	for i := range n {
		all[i] = images(t, fmt.Sprintf("%d-writer", i))
		stagings[i] = stage(t, all[i])
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("ck00000000%02d", 20+i)
			w, err := s.Create(id)
			if err != nil {
				res[i].err = err
				return
			}
			if l, ok := b.(ckstore.LocalBackend); ok {
				if err := os.Mkdir(filepath.Join(l.Dir(id), ckstore.FSDir), 0o700); err != nil {
					res[i].err = err
					return
				}
			}
			objs, _, err := w.StoreImages(context.Background(), stagings[i], nil, nil, nil)
			if err == nil {
				_, err = w.Commit(manifest(id, objs))
			}
			if err == nil {
				err = s.Verify(id, objs, false)
			}
			res[i] = result{objs: objs, imgs: all[i], err: err}
		})
	}
	wg.Wait()
	ids, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		id := fmt.Sprintf("ck00000000%02d", 20+i)
		if r.err != nil {
			t.Fatalf("writer %d: %v", i, r.err)
		}
		if !slices.Contains(ids, id) {
			t.Fatalf("%s not listed: %v", id, ids)
		}
		if err := s.Verify(id, r.objs, true); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		for _, im := range r.imgs {
			if got := read(t, b, id, "images/"+im.name); !bytes.Equal(got, im.data) {
				t.Fatalf("%s: %s holds another writer's bytes", id, im.name)
			}
		}
	}
}
