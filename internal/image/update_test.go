package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUpdater turns an existing tree into the one its entries describe:
// kept files stay (same inode), put ones replace, what is neither goes,
// a directory loses the xattrs its entry lacks, ".wh." names are files,
// a hard link may not name a file the update did not put or keep, and
// nothing outside the tree is touched.
func TestUpdater(t *testing.T) {
	dst, outside := sandbox(t)
	for p, body := range map[string]string{"keep": "kept", "change": "old", "gone": "x", "d/in": "in", "sub/gone/deep": "deep"} {
		if err := os.MkdirAll(filepath.Join(dst, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(filepath.Join(dst, "sub"), "user.stale", []byte("v"), 0); err != nil {
		t.Skipf("user xattrs: %v", err)
	}
	var before unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "keep"), &before); err != nil {
		t.Fatal(err)
	}
	x, err := NewUpdater(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	tr := tar.NewReader(bytes.NewReader(tarball(t,
		dir("./", 0o755), file("change", 0o600, "new"), file("d", 0o644, "a file now"),
		file(".wh.keep", 0o644, "a file"), dir("sub/", 0o700), file("keep", 0o644, "kept"))))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "keep" {
			if err := x.Keep(h); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := x.Put(h, tr); err != nil {
			t.Fatal(err)
		}
	}
	// A hard link to a file the update neither put nor kept is refused
	// (it is still there: the prune comes at Finish).
	link, sub := hardlink("l", "gone").h, dir("sub/", 0o700).h
	if err := x.Put(&link, nil); err == nil {
		t.Fatal("a hard link to a file of the old tree was made")
	}
	if err := x.Keep(&sub); err == nil {
		t.Fatal("a directory was kept")
	}
	if err := x.Finish(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"change": "new", "d": "a file now", ".wh.keep": "a file", "keep": "kept"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"gone", "sub/gone", "l"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it gone", p, err)
		}
	}
	var after unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "keep"), &after); err != nil || after.Ino != before.Ino {
		t.Errorf("keep: inode %d, was %d (%v): want it left in place", after.Ino, before.Ino, err)
	}
	if _, err := unix.Getxattr(filepath.Join(dst, "sub"), "user.stale", make([]byte, 16)); !errors.Is(err, unix.ENODATA) {
		t.Errorf("sub's stale xattr: %v, want it removed", err)
	}
	untouched(t, outside)
}
