package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
)

// diskBytes is what the tree at dir takes on disk, counted by the blocks
// of its files.
func diskBytes(t *testing.T, dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}

// FuzzImportTar imports arbitrary bytes as an image archive. Nothing is
// ever written outside the destination; an archive that is not one (or
// breaks a rule) is refused as invalid_argument, so an importer can tell
// a bad archive from a failing host; and what the import writes on disk
// is bounded by the archive's size (a sparse entry's holes stay holes: a
// 2 KiB archive once wrote 8 GiB of zeros), and it stops when its context
// ends.
func FuzzImportTar(f *testing.F) {
	// Seeds: testdata/fuzz/FuzzImportTar (tar and gzip archives, an
	// archive made by tar(1), escapes, a sparse file of 1 GiB).
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		dst, outside := filepath.Join(parent, "dst"), filepath.Join(parent, "outside")
		for _, d := range []string{dst, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		err := ImportTar(ctx, bytes.NewReader(data), dst)
		if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			// The host refusing a valid request (an xattr the file
			// system does not take) is not the archive's fault.
			var errno syscall.Errno
			if !errors.As(err, &errno) {
				t.Fatalf("refused as %v, not invalid_argument", err)
			}
		}
		if ctx.Err() != nil && err == nil {
			t.Fatalf("import finished without error after its context ended")
		}
		if names := dirNames(t, outside); len(names) != 0 {
			t.Fatalf("written outside the destination: %v", names)
		}
		if names := dirNames(t, parent); !slices.Equal(names, []string{"dst", "outside"}) {
			t.Fatalf("written next to the destination: %v", names)
		}
		// 256 bytes on disk per byte of (uncompressed) archive is far
		// more than any archive needs: each entry costs 512 bytes of
		// header, and its data is in the archive.
		size := int64(len(data))
		if zr, err := gzip.NewReader(bytes.NewReader(data)); err == nil {
			n, _ := io.Copy(io.Discard, io.LimitReader(zr, 1<<30))
			size = max(size, n)
		}
		if n, limit := diskBytes(t, dst), size*256+1<<20; n > limit {
			t.Fatalf("a %d-byte archive took %d bytes on disk", size, n)
		}
		// The tree must be removable by its owner, whatever the modes.
		filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
}

// sparseSeed is the corpus's sparse-1GiB archive: one old-GNU sparse
// entry "big" of 1 GiB declared, whose map holds 512 bytes of data.
func sparseSeed(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("testdata/fuzz/FuzzImportTar/sparse-1GiB")
	if err != nil {
		t.Fatal(err)
	}
	// The corpus file holds the archive as a Go string literal.
	lit := bytes.TrimSpace(bytes.SplitN(data, []byte("\n"), 2)[1])
	s, err := strconv.Unquote(string(bytes.TrimSuffix(bytes.TrimPrefix(lit, []byte("[]byte(")), []byte(")"))))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A sparse entry keeps its declared size and data, and its holes stay
// holes.
func TestImportSparse(t *testing.T) {
	s := sparseSeed(t)
	dst, _ := sandbox(t)
	if err := ImportTar(t.Context(), strings.NewReader(s), dst); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dst, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if fi.Size() != 1<<30 {
		t.Fatalf("size %d, want 1 GiB", fi.Size())
	}
	head := make([]byte, 1024)
	if _, err := f.ReadAt(head, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(head, append(bytes.Repeat([]byte("x"), 512), make([]byte, 512)...)) {
		t.Fatalf("contents %q", head)
	}
	if n := diskBytes(t, dst); n > 1<<20 {
		t.Fatalf("a 1 GiB file of 512 bytes of data took %d bytes on disk", n)
	}
}

// A sparse entry whose map does not match its data (data the map does not
// reference, or a map past the data) is a malformed archive, refused as
// invalid_argument like any other. The fuzzer found the first.
func TestImportSparseMismatch(t *testing.T) {
	s := sparseSeed(t)
	// The seed's one entry holds 512 bytes of data, all of them mapped.
	for _, tc := range []struct {
		name string
		size int // the entry's size field
	}{
		{"unreferenced data", 1024},
		{"missing data", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := []byte(s[:512])
			copy(h[124:136], fmt.Sprintf("%011o\x00", tc.size))
			copy(h[148:156], "        ")
			var sum int
			for _, c := range h {
				sum += int(c)
			}
			copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
			archive := append(h, bytes.Repeat([]byte("y"), tc.size)...)
			archive = append(archive, make([]byte, 2*512)...)
			err := ImportTar(t.Context(), bytes.NewReader(archive), t.TempDir())
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("import: %v, want invalid_argument", err)
			}
			t.Log(err)
		})
	}
}

// A source that fails is the host's fault, not the archive's: its error
// is not invalid_argument, and it reaches the caller.
func TestImportSourceFails(t *testing.T) {
	s := sparseSeed(t)
	// The source fails in the middle of the entry's data.
	r := io.MultiReader(strings.NewReader(s[:600]), iotest.ErrReader(syscall.EIO))
	err := ImportTar(t.Context(), r, t.TempDir())
	if !errors.Is(err, syscall.EIO) || errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("import: %v, want EIO and not invalid_argument", err)
	}
}
