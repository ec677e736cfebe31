package fsnap_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pool"
	"github.com/molt-sh/molt/internal/testutil"
)

// One pool serves every test of the package; TestMain removes it.
var shared struct {
	once sync.Once
	root string
	pool *pool.Pool
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.pool != nil {
		if err := shared.pool.Unmount(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	if shared.root != "" {
		os.RemoveAll(shared.root)
	}
	os.Exit(code)
}

// btrfsDir returns a fresh, empty directory on btrfs.
func btrfsDir(t testing.TB) string {
	t.Helper()
	testutil.RequireRoot(t)
	shared.once.Do(func() {
		if shared.root, shared.err = os.MkdirTemp("", "fsnap-test-"); shared.err == nil {
			shared.pool, shared.err = pool.Open(context.Background(), pool.Config{Root: shared.root, Size: 2 << 30})
		}
	})
	if shared.err != nil {
		t.Fatalf("btrfs pool for tests: %v", shared.err)
	}
	dir, err := os.MkdirTemp(filepath.Join(shared.pool.Dir, "tmp"), strings.ReplaceAll(t.Name(), "/", "_"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantContent(t *testing.T, path, want string) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || string(got) != want {
		t.Errorf("read %s = %q, %v; want %q", path, got, err, want)
	}
}

func wantSubvolume(t *testing.T, path string, want bool) {
	t.Helper()
	if got, err := fsnap.IsSubvolume(path); err != nil || got != want {
		t.Errorf("IsSubvolume(%s) = %v, %v; want %v", path, got, err, want)
	}
}

func wantReadonly(t *testing.T, path string, want bool) {
	t.Helper()
	if got, err := fsnap.Readonly(path); err != nil || got != want {
		t.Errorf("Readonly(%s) = %v, %v; want %v", path, got, err, want)
	}
}

func TestSubvolume(t *testing.T) {
	dir := btrfsDir(t)
	sub := filepath.Join(dir, "sub")
	if err := fsnap.CreateSubvolume(sub); err != nil {
		t.Fatal(err)
	}
	wantSubvolume(t, sub, true)
	wantSubvolume(t, dir, false)
	wantReadonly(t, sub, false)
	if ok, err := fsnap.IsBtrfs(sub); err != nil || !ok {
		t.Errorf("IsBtrfs(%s) = %v, %v; want true", sub, ok, err)
	}
	write(t, filepath.Join(sub, "a"), "a")
	wantSubvolume(t, filepath.Join(sub, "a"), false)

	if err := fsnap.CreateSubvolume(sub); !errors.Is(err, fs.ErrExist) {
		t.Errorf("CreateSubvolume on an existing path = %v, want fs.ErrExist", err)
	}
	if err := fsnap.CreateSubvolume(filepath.Join(dir, "missing", "sub")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CreateSubvolume under a missing parent = %v, want fs.ErrNotExist", err)
	}
	if err := fsnap.CreateSubvolume("/"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("CreateSubvolume(/) = %v, want ErrInvalidArgument", err)
	}
	if err := fsnap.CreateSubvolume(filepath.Join(dir, strings.Repeat("n", 256))); !errors.Is(err, unix.ENAMETOOLONG) {
		t.Errorf("CreateSubvolume with a 256-byte name = %v, want ENAMETOOLONG", err)
	}

	// A plain directory is not a subvolume and cannot be deleted as one.
	if err := fsnap.DeleteSubvolume(filepath.Join(sub, "a")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("DeleteSubvolume of a file = %v, want ErrInvalidArgument", err)
	}

	if err := fsnap.DeleteSubvolume(sub); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sub); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat after delete: %v, want fs.ErrNotExist", err)
	}
	if err := fsnap.DeleteSubvolume(sub); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("DeleteSubvolume of a missing path = %v, want fs.ErrNotExist", err)
	}
}

func TestSnapshot(t *testing.T) {
	dir := btrfsDir(t)
	src, rw, ro := filepath.Join(dir, "src"), filepath.Join(dir, "rw"), filepath.Join(dir, "ro")
	if err := fsnap.CreateSubvolume(src); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(src, "etc", "hostname"), "v1")
	write(t, filepath.Join(src, "gone"), "gone")

	if err := fsnap.Snapshot(src, rw, false); err != nil {
		t.Fatal(err)
	}
	if err := fsnap.Snapshot(src, ro, true); err != nil {
		t.Fatal(err)
	}
	wantSubvolume(t, rw, true)
	wantSubvolume(t, ro, true)
	wantReadonly(t, rw, false)
	wantReadonly(t, ro, true)
	wantContent(t, filepath.Join(ro, "etc", "hostname"), "v1")

	// The read-only snapshot rejects writes of any kind.
	if err := os.WriteFile(filepath.Join(ro, "new"), nil, 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("create in read-only snapshot = %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(ro, "etc", "hostname"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Errorf("overwrite in read-only snapshot = %v, want EROFS", err)
	}
	if err := os.Remove(filepath.Join(ro, "gone")); !errors.Is(err, unix.EROFS) {
		t.Errorf("remove in read-only snapshot = %v, want EROFS", err)
	}

	// Snapshots and source are isolated from each other's changes.
	write(t, filepath.Join(src, "etc", "hostname"), "v2")
	write(t, filepath.Join(src, "added"), "added")
	if err := os.Remove(filepath.Join(src, "gone")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(rw, "etc", "hostname"), "rw")
	for _, snap := range []string{rw, ro} {
		if _, err := os.Stat(filepath.Join(snap, "added")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("file added to the source after the snapshot is in %s: %v", snap, err)
		}
		wantContent(t, filepath.Join(snap, "gone"), "gone")
	}
	wantContent(t, filepath.Join(ro, "etc", "hostname"), "v1")
	wantContent(t, filepath.Join(rw, "etc", "hostname"), "rw")
	wantContent(t, filepath.Join(src, "etc", "hostname"), "v2")

	// A snapshot of a read-only snapshot is writable unless asked otherwise.
	rw2 := filepath.Join(dir, "rw2")
	if err := fsnap.Snapshot(ro, rw2, false); err != nil {
		t.Fatal(err)
	}
	wantReadonly(t, rw2, false)
	write(t, filepath.Join(rw2, "new"), "new")

	if err := fsnap.SetReadonly(ro, false); err != nil {
		t.Fatal(err)
	}
	wantReadonly(t, ro, false)
	write(t, filepath.Join(ro, "new"), "new")
	for range 2 { // setting the flag that is already set is a no-op
		if err := fsnap.SetReadonly(ro, true); err != nil {
			t.Fatal(err)
		}
	}
	wantReadonly(t, ro, true)

	if err := fsnap.Snapshot(src, rw, false); !errors.Is(err, fs.ErrExist) {
		t.Errorf("Snapshot onto an existing path = %v, want fs.ErrExist", err)
	}
	if err := fsnap.Snapshot(filepath.Join(src, "etc"), filepath.Join(dir, "x"), false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Snapshot of a plain directory = %v, want ErrInvalidArgument", err)
	}
	if err := fsnap.Snapshot(filepath.Join(dir, "missing"), filepath.Join(dir, "x"), false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Snapshot of a missing source = %v, want fs.ErrNotExist", err)
	}
	if err := fsnap.Snapshot(src, filepath.Join(dir, "missing", "x"), false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Snapshot into a missing directory = %v, want fs.ErrNotExist", err)
	}

	for _, sub := range []string{ro, rw, rw2, src} {
		if err := fsnap.DeleteSubvolume(sub); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(sub); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("stat %s after delete: %v, want fs.ErrNotExist", sub, err)
		}
	}
	if err := fsnap.SyncFS(dir); err != nil {
		t.Error(err)
	}
}

func TestDeleteNested(t *testing.T) {
	dir := btrfsDir(t)
	outer, inner := filepath.Join(dir, "outer"), filepath.Join(dir, "outer", "inner")
	for _, sub := range []string{outer, inner} {
		if err := fsnap.CreateSubvolume(sub); err != nil {
			t.Fatal(err)
		}
	}
	// A snapshot does not descend into nested subvolumes.
	snap := filepath.Join(dir, "snap")
	if err := fsnap.Snapshot(outer, snap, false); err != nil {
		t.Fatal(err)
	}
	wantSubvolume(t, filepath.Join(snap, "inner"), false)

	// Deleting the outer one deletes the nested one too.
	for _, sub := range []string{outer, snap} {
		if err := fsnap.DeleteSubvolume(sub); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Lstat(inner); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("nested subvolume %s still there: %v", inner, err)
	}
}

// A subvolume still mounted elsewhere, as the root of a sandbox that has
// not been torn down yet, is deleted; the mount keeps it until unmounted.
func TestDeleteMounted(t *testing.T) {
	dir := btrfsDir(t)
	sub, target := filepath.Join(dir, "sub"), t.TempDir()
	if err := fsnap.CreateSubvolume(sub); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(sub, "f"), "f")
	if err := unix.Mount(sub, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(target, 0)
	if err := fsnap.DeleteSubvolume(sub); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sub); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat %s after delete: %v, want fs.ErrNotExist", sub, err)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Errorf("unmount the deleted subvolume: %v", err)
	}
}

func TestReflink(t *testing.T) {
	dir := btrfsDir(t)
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte(rand.Text()+strings.Repeat("x", 3<<20)), 0o600); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir() // not btrfs here: no reflink, so a copy
	cases := []struct{ name, src, dst string }{
		{"clone", src, filepath.Join(dir, "clone")},
		{"across filesystems", src, filepath.Join(other, "copy")},
		{"without reflink", filepath.Join(other, "copy"), filepath.Join(other, "copy2")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data, err := os.ReadFile(c.src)
			if err != nil {
				t.Fatal(err)
			}
			if err := fsnap.Reflink(c.src, c.dst, 0o664); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(c.dst)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("content of %s differs from %s (%v)", c.dst, c.src, err)
			}
			if fi, err := os.Stat(c.dst); err != nil || fi.Mode() != 0o664 {
				t.Errorf("mode of %s = %v, %v; want 0664 whatever the umask", c.dst, fi.Mode(), err)
			}
			f, err := os.OpenFile(c.dst, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("changed"), 1<<20); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if got, err := os.ReadFile(c.src); err != nil || !bytes.Equal(got, data) {
				t.Errorf("writing the copy changed the source %s (%v)", c.src, err)
			}
			before, err := os.ReadFile(c.dst)
			if err != nil {
				t.Fatal(err)
			}
			if err := fsnap.Reflink(c.src, c.dst, 0o600); !errors.Is(err, fs.ErrExist) {
				t.Errorf("Reflink onto an existing file = %v, want fs.ErrExist", err)
			}
			if got, err := os.ReadFile(c.dst); err != nil || !bytes.Equal(got, before) {
				t.Errorf("failed Reflink changed %s (%v)", c.dst, err)
			}
		})
	}
	if err := fsnap.Reflink(dir, filepath.Join(dir, "d"), 0o600); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Reflink of a directory = %v, want ErrInvalidArgument", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "d")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed Reflink left its destination behind: %v", err)
	}
}

func TestNotBtrfs(t *testing.T) {
	dir := t.TempDir()
	if ok, err := fsnap.IsBtrfs(dir); err != nil || ok {
		t.Skipf("IsBtrfs(%s) = %v, %v: temp dir is on btrfs", dir, ok, err)
	}
	wantSubvolume(t, dir, false)
	if err := fsnap.CreateSubvolume(filepath.Join(dir, "sub")); err == nil {
		t.Error("CreateSubvolume on a non-btrfs directory succeeded")
	}
	if err := fsnap.Snapshot(dir, filepath.Join(dir, "snap"), false); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Snapshot of a non-btrfs directory = %v, want ErrInvalidArgument", err)
	}
	if _, err := fsnap.Readonly(dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Readonly of a non-btrfs directory = %v, want ErrInvalidArgument", err)
	}
	if err := fsnap.SetReadonly(dir, true); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("SetReadonly of a non-btrfs directory = %v, want ErrInvalidArgument", err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fsnap.DeleteSubvolume(plain); err == nil {
		t.Error("DeleteSubvolume of a non-btrfs directory succeeded")
	}
	if _, err := os.Stat(plain); err != nil {
		t.Errorf("failed DeleteSubvolume removed %s: %v", plain, err)
	}
	if err := fsnap.SyncFS(dir); err != nil {
		t.Error(err)
	}
}

func TestMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	other := filepath.Join(t.TempDir(), "other")
	for name, err := range map[string]error{
		"IsBtrfs":         second(fsnap.IsBtrfs(missing)),
		"IsSubvolume":     second(fsnap.IsSubvolume(missing)),
		"CreateSubvolume": fsnap.CreateSubvolume(filepath.Join(missing, "sub")),
		"Snapshot":        fsnap.Snapshot(missing, other, false),
		"DeleteSubvolume": fsnap.DeleteSubvolume(missing),
		"SetReadonly":     fsnap.SetReadonly(missing, true),
		"Readonly":        second(fsnap.Readonly(missing)),
		"SyncFS":          fsnap.SyncFS(missing),
		"Reflink":         fsnap.Reflink(missing, other, 0o600),
	} {
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s of a missing path = %v, want fs.ErrNotExist", name, err)
		} else if !strings.Contains(err.Error(), missing) {
			t.Errorf("%s: error %q does not name the path", name, err)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// BenchmarkSnapshot compares a snapshot of a subvolume holding 2000 files
// of 0.5 to 4 KiB with cp -a of the same tree on the same filesystem. cp
// from coreutils 9 reflinks file data by default, so the baseline copies
// only metadata, as a copy-on-write-aware tool would.
func BenchmarkSnapshot(b *testing.B) {
	dir := btrfsDir(b)
	src := filepath.Join(dir, "src")
	if err := fsnap.CreateSubvolume(src); err != nil {
		b.Fatal(err)
	}
	block := make([]byte, 4096)
	for i := range 2000 {
		rand.Read(block)
		path := filepath.Join(src, fmt.Sprintf("d%02d", i/50), fmt.Sprintf("f%04d", i))
		write(b, path, string(block[:512+i%8*512]))
	}
	if err := fsnap.SyncFS(src); err != nil {
		b.Fatal(err)
	}

	b.Run("snapshot", func(b *testing.B) {
		dsts := btrfsDir(b)
		n := 0
		for b.Loop() {
			if err := fsnap.Snapshot(src, filepath.Join(dsts, strconv.Itoa(n)), false); err != nil {
				b.Fatal(err)
			}
			n++
		}
		b.StopTimer()
		for i := range n {
			if err := fsnap.DeleteSubvolume(filepath.Join(dsts, strconv.Itoa(i))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cp-a", func(b *testing.B) {
		dsts := btrfsDir(b)
		n := 0
		for b.Loop() {
			if out, err := exec.Command("cp", "-a", src, filepath.Join(dsts, strconv.Itoa(n))).CombinedOutput(); err != nil {
				b.Fatalf("cp -a: %v: %s", err, out)
			}
			n++
		}
		b.StopTimer()
		if err := os.RemoveAll(dsts); err != nil {
			b.Fatal(err)
		}
	})
	if err := fsnap.DeleteSubvolume(src); err != nil {
		b.Fatal(err)
	}
}

// TestSubvolumeUUID: the UUID is the one btrfs-progs shows, differs
// between a subvolume and its snapshot (which names it as its source), and follows a subvolume through
// an exchange of two paths.
func TestSubvolumeUUID(t *testing.T) {
	dir := btrfsDir(t)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := fsnap.CreateSubvolume(a); err != nil {
		t.Fatal(err)
	}
	if err := fsnap.Snapshot(a, b, false); err != nil {
		t.Fatal(err)
	}
	ua, err := fsnap.SubvolumeUUID(a)
	if err != nil {
		t.Fatal(err)
	}
	ub, err := fsnap.SubvolumeUUID(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(ua) != 32 || ua == ub {
		t.Fatalf("uuids %q and %q: want two different 32-digit ones", ua, ub)
	}
	if of, err := fsnap.SnapshotOf(b); err != nil || of != ua {
		t.Fatalf("b is a snapshot of %q, %v; want %s", of, err, ua)
	}
	if of, err := fsnap.SnapshotOf(a); err != nil || of != "" {
		t.Fatalf("a, created empty, is a snapshot of %q, %v; want none", of, err)
	}
	if path, err := exec.LookPath("btrfs"); err == nil {
		out, err := exec.Command(path, "subvolume", "show", a).CombinedOutput()
		if err != nil {
			t.Fatalf("btrfs subvolume show: %v: %s", err, out)
		}
		var shown string
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "UUID:" {
				shown = strings.ReplaceAll(f[1], "-", "")
			}
		}
		if shown != ua {
			t.Fatalf("uuid %s, btrfs-progs shows %q", ua, shown)
		}
	}
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	if got, err := fsnap.SubvolumeUUID(b); err != nil || got != ua {
		t.Fatalf("after the exchange b is %q, %v; want %s", got, err, ua)
	}
	if err := os.Mkdir(filepath.Join(a, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := fsnap.SubvolumeUUID(filepath.Join(a, "d")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("uuid of a plain directory: %v, want ErrInvalidArgument", err)
	}
}
