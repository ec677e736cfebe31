package image

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var mtime = time.Unix(1700000000, 123456789)

type ent struct {
	h    tar.Header
	body string
}

func entry(typ byte, name string, mode int64) ent {
	return ent{h: tar.Header{Typeflag: typ, Name: name, Mode: mode, ModTime: mtime, Format: tar.FormatPAX}}
}

func file(name string, mode int64, body string) ent {
	e := entry(tar.TypeReg, name, mode)
	e.body = body
	return e
}

func dir(name string, mode int64) ent { return entry(tar.TypeDir, name, mode) }

func symlink(name, target string) ent {
	e := entry(tar.TypeSymlink, name, 0o777)
	e.h.Linkname = target
	return e
}

func hardlink(name, target string) ent {
	e := entry(tar.TypeLink, name, 0o644)
	e.h.Linkname = target
	return e
}

func (e ent) xattr(name, value string) ent {
	e.h.PAXRecords = map[string]string{xattrPrefix + name: value}
	return e
}

func (e ent) owner(uid, gid int) ent {
	e.h.Uid, e.h.Gid = uid, gid
	return e
}

func tarball(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.h
		h.Size = int64(len(e.body))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sandbox returns an empty destination and, next to it, an empty sentinel
// directory that hostile archives aim at.
func sandbox(t *testing.T) (dst, outside string) {
	t.Helper()
	parent := t.TempDir()
	dst, outside = filepath.Join(parent, "dst"), filepath.Join(parent, "outside")
	for _, d := range []string{dst, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dst, outside
}

// untouched fails t if anything was written next to dst or into outside.
func untouched(t *testing.T, outside string) {
	t.Helper()
	if names := dirNames(t, outside); len(names) != 0 {
		t.Errorf("written outside the destination: %v", names)
	}
	if names := dirNames(t, filepath.Dir(outside)); !slices.Equal(names, []string{"dst", "outside"}) {
		t.Errorf("written next to the destination: %v", names)
	}
}

func dirNames(t *testing.T, d string) []string {
	t.Helper()
	entries, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func xattrs(t *testing.T, p string) map[string]string {
	t.Helper()
	buf := make([]byte, xattrMax)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatalf("llistxattr %s: %v", p, err)
	}
	m := map[string]string{}
	for _, a := range strings.Split(string(buf[:n]), "\x00") {
		if a == "" {
			continue
		}
		v := make([]byte, xattrMax)
		k, err := unix.Lgetxattr(p, a, v)
		if err != nil {
			t.Fatalf("lgetxattr %s %s: %v", p, a, err)
		}
		m[a] = string(v[:k])
	}
	return m
}

// compareTrees fails t unless the trees at a and b hold the same entries
// with the same type, mode, owner, mtime, size, link target, xattrs and
// link count; with contents, regular files must also be equal.
func compareTrees(t *testing.T, a, b string, contents bool) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(a, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n++
		rel, _ := filepath.Rel(a, p)
		q := filepath.Join(b, rel)
		sa, sb := lstat(t, p), lstat(t, q)
		if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Nlink != sb.Nlink {
			t.Errorf("%s: mode %o uid %d gid %d nlink %d, want %o %d %d %d", rel,
				sb.Mode, sb.Uid, sb.Gid, sb.Nlink, sa.Mode, sa.Uid, sa.Gid, sa.Nlink)
		}
		if sa.Mtim != sb.Mtim {
			t.Errorf("%s: mtime %v, want %v", rel, sb.Mtim, sa.Mtim)
		}
		switch sa.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			if sa.Size != sb.Size {
				t.Errorf("%s: size %d, want %d", rel, sb.Size, sa.Size)
			} else if contents {
				da, _ := os.ReadFile(p)
				db, _ := os.ReadFile(q)
				if !bytes.Equal(da, db) {
					t.Errorf("%s: contents differ", rel)
				}
			}
		case unix.S_IFLNK:
			ta, _ := os.Readlink(p)
			tb, _ := os.Readlink(q)
			if ta != tb {
				t.Errorf("%s: link target %q, want %q", rel, tb, ta)
			}
		}
		if xa, xb := xattrs(t, p), xattrs(t, q); !maps.Equal(xa, xb) {
			t.Errorf("%s: xattrs %v, want %v", rel, xb, xa)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	m := 0
	if err := filepath.WalkDir(b, func(string, fs.DirEntry, error) error { m++; return nil }); err != nil {
		t.Fatal(err)
	}
	if m != n {
		t.Errorf("%s has %d entries, want %d", b, m, n)
	}
}
