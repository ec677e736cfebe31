package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"github.com/klauspost/compress/zstd"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

func goodArchive(t *testing.T) []byte {
	return tarball(t,
		ent{h: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "made by a test"}}},
		dir("./", 0o755),
		dir("bin/", 0o755),
		file("bin/tool", 0o4755, "#!/bin/sh\necho tool\n").xattr("user.molt", "hello"),
		symlink("bin/sh", "/usr/bin/bash"),
		symlink("bin/conf", "../etc/conf"),
		file("etc/conf", 0o640, "key=value\n"),
		hardlink("etc/conf.hard", "etc/conf"),
		entry(tar.TypeFifo, "./run/fifo", 0o620),
		dir("./tmp/", 0o1777),
		dir("data/", 0o2750).xattr("user.molt", "dir"),
		file("data/empty", 0o600, ""),
	)
}

func TestImportTar(t *testing.T) {
	dst, outside := sandbox(t)
	if err := ImportTar(t.Context(), bytes.NewReader(goodArchive(t)), dst); err != nil {
		t.Fatal(err)
	}
	untouched(t, outside)
	checkGoodTree(t, dst)
}

func TestImportTarGzip(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(goodArchive(t))
	zw.Close()
	dst, _ := sandbox(t)
	if err := ImportTar(t.Context(), &buf, dst); err != nil {
		t.Fatal(err)
	}
	checkGoodTree(t, dst)
}

func TestImportTarZstd(t *testing.T) {
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := zw.EncodeAll(goodArchive(t), nil)
	dst, _ := sandbox(t)
	if err := ImportTar(t.Context(), bytes.NewReader(b), dst); err != nil {
		t.Fatal(err)
	}
	checkGoodTree(t, dst)
}

func checkGoodTree(t *testing.T, dst string) {
	t.Helper()
	for _, c := range []struct {
		name string
		mode uint32
		body string
	}{
		{".", unix.S_IFDIR | 0o755, ""},
		{"bin", unix.S_IFDIR | 0o755, ""},
		{"bin/tool", unix.S_IFREG | 0o4755, "#!/bin/sh\necho tool\n"},
		{"bin/sh", unix.S_IFLNK | 0o777, ""},
		{"etc", unix.S_IFDIR | 0o755, ""}, // created for etc/conf, no entry of its own
		{"etc/conf", unix.S_IFREG | 0o640, "key=value\n"},
		{"run/fifo", unix.S_IFIFO | 0o620, ""},
		{"tmp", unix.S_IFDIR | 0o1777, ""},
		{"data", unix.S_IFDIR | 0o2750, ""},
		{"data/empty", unix.S_IFREG | 0o600, ""},
	} {
		p := filepath.Join(dst, c.name)
		st := lstat(t, p)
		if st.Mode != c.mode {
			t.Errorf("%s: mode %o, want %o", c.name, st.Mode, c.mode)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			if b, _ := os.ReadFile(p); string(b) != c.body {
				t.Errorf("%s: contents %q, want %q", c.name, b, c.body)
			}
		}
		if c.name != "etc" && (st.Mtim.Sec != mtime.Unix() || st.Mtim.Nsec != int64(mtime.Nanosecond())) {
			t.Errorf("%s: mtime %v, want %v", c.name, time.Unix(st.Mtim.Unix()), mtime)
		}
	}
	for link, want := range map[string]string{"bin/sh": "/usr/bin/bash", "bin/conf": "../etc/conf"} {
		if got, err := os.Readlink(filepath.Join(dst, link)); err != nil || got != want {
			t.Errorf("%s -> %q (%v), want %q", link, got, err, want)
		}
	}
	if a, b := lstat(t, filepath.Join(dst, "etc/conf")), lstat(t, filepath.Join(dst, "etc/conf.hard")); a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("etc/conf.hard is not a hard link of etc/conf (inodes %d, %d; nlink %d)", a.Ino, b.Ino, a.Nlink)
	}
	for name, want := range map[string]string{"bin/tool": "hello", "data": "dir"} {
		if got := xattrs(t, filepath.Join(dst, name))["user.molt"]; got != want {
			t.Errorf("%s: xattr user.molt = %q, want %q", name, got, want)
		}
	}
}

func TestImportTarRefusesHostileEntries(t *testing.T) {
	for _, c := range []struct {
		name string
		ents func(outside string) []ent
		want string
	}{
		{"dotdot", func(string) []ent { return []ent{file("../outside/evil", 0o644, "x")} }, `entry "../outside/evil": path escapes the root`},
		{"inner dotdot", func(string) []ent { return []ent{dir("a/", 0o755), file("a/../../outside/evil", 0o644, "x")} }, "path escapes the root"},
		{"absolute", func(o string) []ent { return []ent{file(o+"/evil", 0o644, "x")} }, "absolute path"},
		{"char device", func(string) []ent { return []ent{entry(tar.TypeChar, "null", 0o666)} }, `entry "null": device nodes are not allowed`},
		{"block device", func(string) []ent { return []ent{entry(tar.TypeBlock, "sda", 0o660)} }, "device nodes are not allowed"},
		{"hard link absolute", func(o string) []ent { return []ent{hardlink("h", o+"/x")} }, "absolute path"},
		{"hard link dotdot", func(string) []ent { return []ent{hardlink("h", "../outside/x")} }, "path escapes the root"},
		{"hard link unknown", func(string) []ent { return []ent{hardlink("h", "nothing")} }, "does not name an earlier entry"},
		{"hard link forward", func(string) []ent { return []ent{hardlink("h", "f"), file("f", 0o644, "x")} }, "does not name an earlier entry"},
		{"hard link to directory", func(string) []ent { return []ent{dir("d/", 0o755), hardlink("h", "d")} }, "is a directory"},
		{"hard link through symlink", func(o string) []ent { return []ent{symlink("l", o), hardlink("h", "l/x")} }, "does not name an earlier entry"},
		{"symlink escape", func(string) []ent { return []ent{dir("a/", 0o755), symlink("a/b", "../../outside")} }, `entry "a/b": symlink target "../../outside" escapes the root`},
		{"symlink to parent", func(string) []ent { return []ent{symlink("l", "..")} }, "escapes the root"},
		{"symlinked parent", func(o string) []ent { return []ent{symlink("link", o), file("link/passwd", 0o644, "x")} }, `entry "link/passwd": parent "link" goes through a symlink`},
		{"symlinked grandparent", func(o string) []ent { return []ent{symlink("link", o), dir("link/sub/", 0o755)} }, "goes through a symlink"},
		{"symlinked parent inside", func(string) []ent {
			return []ent{dir("d/", 0o755), symlink("link", "d"), file("link/f", 0o644, "x")}
		}, "goes through a symlink"},
		{"symlinked parent of hard link", func(o string) []ent {
			return []ent{file("f", 0o644, "x"), symlink("link", o), hardlink("link/h", "f")}
		}, "goes through a symlink"},
		{"file below file", func(string) []ent { return []ent{file("f", 0o644, "x"), file("f/g", 0o644, "x")} }, "is not a directory"},
		{"file over directory", func(string) []ent { return []ent{dir("d/", 0o755), file("d", 0o644, "x")} }, "would replace a directory"},
		{"root not a directory", func(string) []ent { return []ent{symlink("./", "/")} }, "the root must be a directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst, outside := sandbox(t)
			err := ImportTar(t.Context(), bytes.NewReader(tarball(t, c.ents(outside)...)), dst)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want ErrInvalidArgument with %q", err, c.want)
			}
			untouched(t, outside)
			if c.name == "symlinked parent inside" {
				if names := dirNames(t, filepath.Join(dst, "d")); len(names) != 0 {
					t.Errorf("written through the symlink into d: %v", names)
				}
			}
		})
	}
}

// Entries may replace a planted symlink; they must replace the link, not
// write where it points.
func TestImportTarReplacesSymlinks(t *testing.T) {
	dst, outside := sandbox(t)
	archive := tarball(t,
		symlink("f", outside+"/f"), file("f", 0o644, "data"),
		symlink("d", outside), dir("d/", 0o755),
		symlink("p", outside+"/p"), entry(tar.TypeFifo, "p", 0o644),
		symlink("s", outside+"/s"), hardlink("h", "s"),
	)
	if err := ImportTar(t.Context(), bytes.NewReader(archive), dst); err != nil {
		t.Fatal(err)
	}
	untouched(t, outside)
	for name, typ := range map[string]uint32{"f": unix.S_IFREG, "d": unix.S_IFDIR, "p": unix.S_IFIFO, "h": unix.S_IFLNK} {
		if st := lstat(t, filepath.Join(dst, name)); st.Mode&unix.S_IFMT != typ {
			t.Errorf("%s: type %o, want %o", name, st.Mode&unix.S_IFMT, typ)
		}
	}
}

func TestImportTarBadInput(t *testing.T) {
	good := goodArchive(t)
	inputs := map[string][]byte{
		"empty":    nil,
		"garbage":  bytes.Repeat([]byte("not a tar file "), 100),
		"bad gzip": append([]byte{0x1f, 0x8b}, good...),
		"bad zstd": append([]byte{0x28, 0xb5, 0x2f, 0xfd}, good...),
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(good)
	zw.Close()
	corrupt := bytes.Clone(gz.Bytes())
	corrupt[len(corrupt)/2] ^= 0xff
	inputs["corrupt gzip"] = corrupt
	// Cut at every block boundary and inside every block, up to just
	// before the end-of-archive marker is complete.
	for n := 0; n < len(good); n += 256 {
		inputs[fmt.Sprintf("truncated at %d", n)] = good[:n]
	}
	inputs["truncated in the end marker"] = good[:len(good)-1]
	for name, input := range inputs {
		t.Run(name, func(t *testing.T) {
			dst, outside := sandbox(t)
			if err := ImportTar(t.Context(), bytes.NewReader(input), dst); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("got %v, want ErrInvalidArgument", err)
			}
			untouched(t, outside)
		})
	}
}

func TestImportDestination(t *testing.T) {
	archive := goodArchive(t)
	dst, _ := sandbox(t)
	os.WriteFile(filepath.Join(dst, "x"), nil, 0o644)
	if err := ImportTar(t.Context(), bytes.NewReader(archive), dst); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("non-empty destination: got %v, want ErrFailedPrecondition", err)
	}
	if err := ImportTar(t.Context(), bytes.NewReader(archive), filepath.Join(dst, "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing destination: got %v, want ErrNotFound", err)
	}
	if err := ImportTar(t.Context(), bytes.NewReader(archive), filepath.Join(dst, "x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("file as destination: got %v, want ErrInvalidArgument", err)
	}
	if err := ImportDir(t.Context(), filepath.Dir(dst), dst); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("destination inside source: got %v, want ErrInvalidArgument", err)
	}
}

func TestImportCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	dst, _ := sandbox(t)
	if err := ImportTar(ctx, bytes.NewReader(goodArchive(t)), dst); !errors.Is(err, context.Canceled) {
		t.Errorf("ImportTar: got %v, want context.Canceled", err)
	}
	src := makeTree(t)
	dst, _ = sandbox(t)
	if err := ImportDir(ctx, src, dst); !errors.Is(err, context.Canceled) {
		t.Errorf("ImportDir: got %v, want context.Canceled", err)
	}
}

// makeTree builds a source tree with every kind of entry an image holds.
func makeTree(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "usr/bin"), 0o755))
	must(os.WriteFile(filepath.Join(src, "usr/bin/tool"), []byte("tool"), 0o755))
	must(os.Chmod(filepath.Join(src, "usr/bin/tool"), 0o4755))
	must(os.Link(filepath.Join(src, "usr/bin/tool"), filepath.Join(src, "usr/bin/tool2")))
	must(os.Symlink("usr/bin", filepath.Join(src, "bin")))
	must(os.Symlink("/usr/bin/tool", filepath.Join(src, "usr/bin/abs")))
	must(unix.Mkfifo(filepath.Join(src, "fifo"), 0o640))
	must(os.Mkdir(filepath.Join(src, "tmp"), 0o755))
	must(os.Chmod(filepath.Join(src, "tmp"), 0o1777))
	must(os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("0123456789abcdef"), 1<<16), 0o600))
	must(unix.Setxattr(filepath.Join(src, "big"), "user.molt", []byte("file"), 0))
	must(unix.Setxattr(filepath.Join(src, "usr"), "user.molt", []byte("dir"), 0))
	// Times last, directories after their contents.
	for _, p := range []string{"usr/bin/tool", "big", "usr/bin", "usr", "tmp", "."} {
		must(os.Chtimes(filepath.Join(src, p), mtime, mtime.Add(time.Duration(len(p)))))
	}
	must(unix.Lutimes(filepath.Join(src, "bin"), []unix.Timeval{{Sec: 1}, {Sec: 2}}))
	return src
}

func TestImportDir(t *testing.T) {
	src := makeTree(t)
	dst, outside := sandbox(t)
	if err := ImportDir(t.Context(), src, dst); err != nil {
		t.Fatal(err)
	}
	untouched(t, outside)
	compareTrees(t, src, dst, true)
}

func TestImportDirRefusesEscapingSymlink(t *testing.T) {
	src := makeTree(t)
	os.Symlink("../../etc", filepath.Join(src, "usr/escape"))
	dst, outside := sandbox(t)
	err := ImportDir(t.Context(), src, dst)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `entry "usr/escape"`) {
		t.Errorf("got %v, want ErrInvalidArgument naming usr/escape", err)
	}
	untouched(t, outside)
}

func TestImport(t *testing.T) {
	src := makeTree(t)
	dst, _ := sandbox(t)
	if err := Import(t.Context(), src, dst); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, src, dst, true)

	archive := filepath.Join(t.TempDir(), "a.tar")
	os.WriteFile(archive, goodArchive(t), 0o644)
	dst, _ = sandbox(t)
	if err := Import(t.Context(), archive, dst); err != nil {
		t.Fatal(err)
	}
	checkGoodTree(t, dst)

	if err := Import(t.Context(), filepath.Join(src, "missing"), dst); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing source: got %v, want ErrNotFound", err)
	}
}

// The cache format round-trips a tree through writeCache and ImportTar.
func TestCacheRoundTrip(t *testing.T) {
	src := makeTree(t)
	file := filepath.Join(t.TempDir(), "cache", "k.tar")
	if err := writeCache(t.Context(), src, file); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dst, _ := sandbox(t)
	if err := ImportTar(t.Context(), f, dst); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, src, dst, true)
}

func TestWriteCacheLeavesNothingOnFailure(t *testing.T) {
	src := makeTree(t)
	dir := filepath.Join(t.TempDir(), "cache")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := writeCache(ctx, src, filepath.Join(dir, "k.tar")); !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
	if names := dirNames(t, dir); len(names) != 0 {
		t.Errorf("cache dir holds %v after a failed write", names)
	}
}

func TestImportOwnership(t *testing.T) {
	testutil.RequireRoot(t)
	dst, _ := sandbox(t)
	archive := tarball(t,
		dir("d/", 0o2755).owner(1234, 5678),
		file("d/suid", 0o6755, "x").owner(1234, 5678),
		symlink("d/link", "/nowhere").owner(1234, 5678).xattr("trusted.molt", "link"),
		entry(tar.TypeFifo, "d/fifo", 0o600).owner(1234, 5678),
	)
	if err := ImportTar(t.Context(), bytes.NewReader(archive), dst); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"d", "d/suid", "d/link", "d/fifo"} {
		if st := lstat(t, filepath.Join(dst, name)); st.Uid != 1234 || st.Gid != 5678 {
			t.Errorf("%s: owner %d:%d, want 1234:5678", name, st.Uid, st.Gid)
		}
	}
	// chown clears setuid and setgid: they must be set after it.
	if st := lstat(t, filepath.Join(dst, "d/suid")); st.Mode&0o7777 != 0o6755 {
		t.Errorf("d/suid: mode %o, want 6755", st.Mode&0o7777)
	}
	if got := xattrs(t, filepath.Join(dst, "d/link"))["trusted.molt"]; got != "link" {
		t.Errorf("d/link: xattr trusted.molt = %q, want %q", got, "link")
	}

	src := makeTree(t)
	for _, p := range []string{"usr/bin/tool", "bin", "fifo", "usr"} {
		if err := os.Lchown(filepath.Join(src, p), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(src, "usr/bin/tool"), 0o4755)
	dst, _ = sandbox(t)
	if err := ImportDir(t.Context(), src, dst); err != nil {
		t.Fatal(err)
	}
	compareTrees(t, src, dst, true)
}

func TestImportDirRefusesDevices(t *testing.T) {
	testutil.RequireRoot(t)
	src := makeTree(t)
	if err := unix.Mknod(filepath.Join(src, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	dst, outside := sandbox(t)
	err := ImportDir(t.Context(), src, dst)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `entry "null": device nodes are not allowed`) {
		t.Errorf("got %v, want ErrInvalidArgument naming null", err)
	}
	untouched(t, outside)
}
