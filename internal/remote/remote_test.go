package remote

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/pagestore"
)

func keyring(t testing.TB) *ckstore.Keyring {
	t.Helper()
	k, err := ckstore.LoadKeyring(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// artifact writes a checkpoint's objects and a file tree and returns
// its Source.
func artifact(t testing.TB, id string, pages []byte, note string) Source {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o700); err != nil {
		t.Fatal(err)
	}
	var objs []ckstore.Object
	// The pages' hashes, as a full checkpoint keeps them.
	var hashes []byte
	for _, h := range pagestore.Sums(pages, pagestore.PageSize) {
		hashes = append(hashes, h[:]...)
	}
	if err := os.MkdirAll(filepath.Join(dir, ckstore.PageHashDir), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"images/pages-1.img": pages, "images/core-1.img": []byte("core " + id), ckstore.PageHashDir + "/pages-1.img": hashes} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		objs = append(objs, ckstore.Object{Path: name, Size: int64(len(b)), SHA256: hex.EncodeToString(s[:])})
	}
	tree := t.TempDir()
	big := make([]byte, 3<<20+17)
	for i := range big {
		big[i] = byte(i * 7)
	}
	for name, b := range map[string][]byte{"etc/hostname": []byte("sb\n"), "var/big": big, "note": []byte(note)} {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("etc/hostname", filepath.Join(tree, "link")); err != nil {
		t.Fatal(err)
	}
	return Source{Checkpoint: id, Sandbox: "sb0000000001", Record: []byte(`{"id":"` + id + `"}`),
		Manifest: []byte(`{"manifest":"` + id + `"}`), Dir: dir, Objects: objs, Tree: tree}
}

func randomPages(t testing.TB, n int) []byte {
	b := make([]byte, n*4096)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestUploadFetch(t *testing.T) {
	ctx := context.Background()
	b, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k := keyring(t)
	s, err := Open(ctx, b, k)
	if err != nil {
		t.Fatal(err)
	}
	pages := randomPages(t, 512)
	src := artifact(t, "ck0000000001", pages, "first")
	_, st, err := s.Upload(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if st.UploadedBytes < int64(len(pages)) {
		t.Fatalf("first upload wrote %d bytes, less than its %d bytes of pages", st.UploadedBytes, len(pages))
	}
	// The next checkpoint changes one page: only it and what changed in
	// the tree go up.
	next := bytes.Clone(pages)
	copy(next[4096*100:], randomPages(t, 1))
	src2 := artifact(t, "ck0000000002", next, "second")
	_, st2, err := s.Upload(ctx, src2)
	if err != nil {
		t.Fatal(err)
	}
	if st2.UploadedBytes > 64<<10 {
		t.Fatalf("second upload wrote %d bytes for one changed page and one changed file (%+v)", st2.UploadedBytes, st2)
	}
	// A store opened afresh (another daemon) shares what is there too.
	s2, err := Open(ctx, b, k)
	if err != nil {
		t.Fatal(err)
	}
	src3 := artifact(t, "ck0000000003", next, "second")
	if _, st3, err := s2.Upload(ctx, src3); err != nil || st3.UploadedBytes > 16<<10 {
		t.Fatalf("a fresh store uploaded %d bytes of known content: %v", st3.UploadedBytes, err)
	}

	r, err := s2.Recipe(ctx, "ck0000000002")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := s2.FetchObjects(ctx, r, dir); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "images/pages-1.img"))
	if err != nil || !bytes.Equal(got, next) {
		t.Fatalf("fetched pages differ from the uploaded ones (%v)", err)
	}
	tree := t.TempDir()
	if err := s2.FetchTree(ctx, r, tree); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"note": "second", "etc/hostname": "sb\n"} {
		if b, err := os.ReadFile(filepath.Join(tree, name)); err != nil || string(b) != want {
			t.Fatalf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if l, err := os.Readlink(filepath.Join(tree, "link")); err != nil || l != "etc/hostname" {
		t.Fatalf("link: %q, %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(tree, "var/big")); err != nil || fi.Size() != 3<<20+17 {
		t.Fatalf("var/big: %v, %v", fi, err)
	}
}

func TestRefusesDamage(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	b, _ := objstore.NewDir(root)
	k := keyring(t)
	s, err := Open(ctx, b, k)
	if err != nil {
		t.Fatal(err)
	}
	src := artifact(t, "ck0000000001", randomPages(t, 64), "x")
	r, _, err := s.Upload(ctx, src)
	if err != nil {
		t.Fatal(err)
	}

	// A host that does not trust the signer refuses the recipe.
	other, _ := Open(ctx, b, keyring(t))
	if _, err := other.Recipe(ctx, "ck0000000001"); !errors.Is(err, ckstore.ErrUntrusted) {
		t.Fatalf("untrusted signer: %v", err)
	}
	// An edited recipe fails its signature.
	key := filepath.Join(root, recipeKey("ck0000000001"))
	orig, _ := os.ReadFile(key)
	edited := strings.Replace(string(orig), `"sandbox":"sb0000000001"`, `"sandbox":"sb0000000002"`, 1)
	os.WriteFile(key, []byte(edited), 0o600)
	if _, err := s.Recipe(ctx, "ck0000000001"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("edited recipe: %v", err)
	}
	os.WriteFile(key, orig, 0o600)
	// A flipped byte in a pack is found as the object is fetched.
	pack := filepath.Join(root, packKey(r.Packs[r.Objects[0].Extents[0].P]))
	pb, _ := os.ReadFile(pack)
	pb[r.Objects[0].Extents[0].Off] ^= 1
	os.WriteFile(pack, pb, 0o600)
	if _, err := s.FetchObjects(ctx, r, t.TempDir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("flipped byte: %v", err)
	}
	// A local object that is not what the checkpoint lists is not uploaded.
	src2 := artifact(t, "ck0000000002", randomPages(t, 4), "y")
	os.WriteFile(filepath.Join(src2.Dir, "images/core-1.img"), []byte("other"), 0o600)
	if _, _, err := s.Upload(ctx, src2); err == nil {
		t.Fatal("a damaged local object was uploaded")
	}
	if _, err := s.Recipe(ctx, "ck0000000002"); err == nil {
		t.Fatal("a failed upload left a recipe")
	}
	// Hostile recipes: names that leave the checkpoint, extents beyond
	// their sizes, other layouts.
	for _, mut := range []func(*Recipe){
		func(r *Recipe) { r.Objects[0].Name = "../../etc/passwd" },
		func(r *Recipe) { r.Objects[0].Size++ },
		func(r *Recipe) { r.Objects[0].Extents[0].P = 99 },
		func(r *Recipe) { r.Layout = 2 },
		func(r *Recipe) { r.Packs[0] = "../x" },
		func(r *Recipe) { r.Tree.Cuts = editCuts(t, r.Tree, func(c []int32) []int32 { c[0] += 512; return c }) }, // beyond the tree's size
		func(r *Recipe) { r.Tree.Cuts = editCuts(t, r.Tree, func(c []int32) []int32 { return c[1:] }) },          // short of it
		func(r *Recipe) { r.Tree.Cuts = "" },
		func(r *Recipe) { r.Tree.Cuts += "!" },
		func(r *Recipe) { r.Objects[0].Cuts = encodeCuts([]int32{512}) },
	} {
		h := r
		tree := *r.Tree
		h.Tree = &tree
		h.Objects = append([]Object(nil), r.Objects...)
		h.Objects[0].Extents = append([]Extent(nil), r.Objects[0].Extents...)
		h.Packs = append([]string(nil), r.Packs...)
		mut(&h)
		if err := s.putSigned(ctx, recipeKey("ck0000000001"), &h); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recipe(ctx, "ck0000000001"); err == nil {
			t.Fatalf("hostile recipe %+v (tree %+v) accepted", h.Objects[0], h.Tree)
		}
	}
	// The tree's chunks cut elsewhere (lengths that still add up): its
	// hash over the chunks' hashes differs, found as it is fetched.
	h := r
	tree := *r.Tree
	tree.Cuts = editCuts(t, r.Tree, func(c []int32) []int32 { return append([]int32{c[0] + c[1]}, c[2:]...) })
	h.Tree = &tree
	if err := s.FetchTree(ctx, h, t.TempDir()); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a tree cut elsewhere: %v", err)
	}
	if err := s.FetchTree(ctx, r, t.TempDir()); err != nil {
		t.Fatalf("the tree as uploaded: %v", err)
	}
}

// TestTreeReuse: a sandbox's next upload reads only the files that
// changed since its last one (by inode, size, mode, mtime and ctime),
// and what it stores fetches back to the new tree; files changed close
// before the snapshot are not remembered.
func TestTreeReuse(t *testing.T) {
	ctx := context.Background()
	b, _ := objstore.NewDir(t.TempDir())
	s, err := Open(ctx, b, keyring(t))
	if err != nil {
		t.Fatal(err)
	}
	src := artifact(t, "ck0000000001", randomPages(t, 4), "one")
	upload := func(id string, snapshot time.Time) (Recipe, Stats) {
		t.Helper()
		src.Parent, src.Checkpoint, src.Snapshot = src.Checkpoint, id, snapshot
		r, st, err := s.Upload(ctx, src)
		if err != nil {
			t.Fatal(err)
		}
		return r, st
	}
	fetched := func(r Recipe, name string) string {
		t.Helper()
		dst := t.TempDir()
		if err := s.FetchTree(ctx, r, dst); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// Files written just now: too close to a snapshot taken now.
	upload("ck0000000001", time.Now())
	if _, st := upload("ck0000000002", time.Now()); st.ReusedBytes != 0 {
		t.Fatalf("reused %d bytes of files changed within %v of the snapshot", st.ReusedBytes, racyWindow)
	}
	later := time.Now().Add(time.Hour)
	r1, _ := upload("ck0000000003", later)
	big := int64(3<<20 + 17)
	r2, st := upload("ck0000000004", later)
	if st.ReusedBytes < big {
		t.Fatalf("an unchanged tree reused %d bytes, want var/big's %d at least (%+v)", st.ReusedBytes, big, st)
	}
	if r2.Tree.SHA256 != r1.Tree.SHA256 || r2.Tree.Size != r1.Tree.Size {
		t.Fatalf("the same tree stored as %s (%d bytes), then as %s (%d bytes)", r1.Tree.SHA256, r1.Tree.Size, r2.Tree.SHA256, r2.Tree.Size)
	}
	// Changed in place, same size, its times put back: ctime moved.
	p := filepath.Join(src.Tree, "var/big")
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("CHANGED"), 1<<20+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	r3, st := upload("ck0000000005", later)
	if st.ReusedBytes >= big {
		t.Fatalf("a changed file was taken from the cache (%+v)", st)
	}
	if got := fetched(r3, "var/big"); got[1<<20+5:1<<20+12] != "CHANGED" {
		t.Fatalf("the fetched var/big lacks the change")
	}
	if got := fetched(r1, "var/big"); got[1<<20+5:1<<20+12] == "CHANGED" {
		t.Fatalf("the earlier checkpoint's var/big has the later change")
	}
	// A checkpoint whose parent is not the last one uploaded (taken
	// after a rollback) reuses nothing: its files changed from another
	// tree.
	src.Checkpoint = "ck0000000003"
	if _, st := upload("ck0000000006", later); st.ReusedBytes != 0 {
		t.Fatalf("a checkpoint after a rollback reused %d bytes", st.ReusedBytes)
	}
	// Nor does another sandbox's.
	src.Sandbox = "sb0000000002"
	if _, st := upload("ck0000000007", later); st.ReusedBytes != 0 {
		t.Fatalf("another sandbox reused %d bytes", st.ReusedBytes)
	}
}

// editCuts returns the tree's chunk lengths changed by edit, encoded.
func editCuts(t *testing.T, tree *Object, edit func([]int32) []int32) string {
	t.Helper()
	c, err := decodeCuts(tree.Cuts, tree.Size)
	if err != nil {
		t.Fatal(err)
	}
	return encodeCuts(edit(c))
}

func TestSandboxDoc(t *testing.T) {
	ctx := context.Background()
	b, _ := objstore.NewDir(t.TempDir())
	s, _ := Open(ctx, b, keyring(t))
	if _, err := s.Sandbox(ctx, "sb0000000001"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing sandbox: %v", err)
	}
	d := SandboxDoc{Sandbox: "sb0000000001", Head: "ck0000000001", Record: []byte(`{}`), Epoch: 3}
	if err := s.PutSandbox(ctx, d, ""); err != nil {
		t.Fatal(err)
	}
	got, v, err := s.SandboxVersion(ctx, "sb0000000001")
	if err != nil || got.Head != d.Head || got.Epoch != 3 || v == "" {
		t.Fatalf("%+v, %q, %v", got, v, err)
	}
	// A document is written only over the version read.
	if err := s.PutSandbox(ctx, d, ""); !errors.Is(err, objstore.ErrChanged) {
		t.Fatalf("a new document over one: %v, want the object changed", err)
	}
	got.Owner = "ed25519:one"
	if err := s.PutSandbox(ctx, got, v); err != nil {
		t.Fatal(err)
	}
	got.Owner = "ed25519:two"
	if err := s.PutSandbox(ctx, got, v); !errors.Is(err, objstore.ErrChanged) || !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a document over a version replaced: %v, want the object changed", err)
	}
	if cur, err := s.Sandbox(ctx, d.Sandbox); err != nil || cur.Owner != "ed25519:one" {
		t.Fatalf("owner %q (%v), want the first writer's", cur.Owner, err)
	}
	if ids, err := s.Sandboxes(ctx); err != nil || len(ids) != 1 || ids[0] != d.Sandbox {
		t.Fatalf("%v, %v", ids, err)
	}
}
