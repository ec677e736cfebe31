package pagestore

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/molt-sh/molt/internal/testutil/btrfstest"
	"golang.org/x/sys/unix"
)

func randomPages(n int) []byte {
	b := make([]byte, n*PageSize)
	rand.Read(b)
	return b
}

// usedBytes is the space the filesystem reports used, after a commit.
func usedBytes(t testing.TB, dir string) int64 {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

func TestStoreSharesKnownPages(t *testing.T) {
	dir := btrfstest.Dir(t)
	staging := t.TempDir()
	first := randomPages(1024) // 4 MiB
	second := append([]byte(nil), first...)
	copy(second[10*PageSize:], randomPages(3))    // 3 pages changed
	copy(second[500*PageSize:], randomPages(1))   // 1 more
	second = append(second, make([]byte, 100)...) // a partial last page

	x := NewIndex()
	write := func(name string, b []byte) Result {
		t.Helper()
		src := filepath.Join(staging, name)
		if err := os.WriteFile(src, b, 0o600); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, name)
		res, err := Store(src, dst, x)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("%s: stored content differs from the source", name)
		}
		return res
	}
	r1 := write("one.img", first)
	if r1.Shared != 0 || r1.Written != int64(len(first)) {
		t.Fatalf("first store: %+v", r1)
	}
	before := usedBytes(t, dir)
	r2 := write("two.img", second)
	if r2.Pages != 1025 || r2.Shared != 1020 || r2.Written != 4*PageSize+100 {
		t.Fatalf("second store: pages %d shared %d written %d", r2.Pages, r2.Shared, r2.Written)
	}
	if r2.Reflinks > 4 {
		t.Fatalf("%d reflinks for 3 runs of shared pages", r2.Reflinks)
	}
	if grew := usedBytes(t, dir) - before; grew > 1<<20 {
		t.Fatalf("the second image took %d bytes of space; want about its 5 new pages", grew)
	}
	// Deleting the first image keeps the second intact.
	if err := os.Remove(filepath.Join(dir, "one.img")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "two.img"))
	if !bytes.Equal(got, second) {
		t.Fatal("second image changed when the first was deleted")
	}
}

func TestStoreSharesRepeatsWithinAnImage(t *testing.T) {
	dir := btrfstest.Dir(t)
	src := filepath.Join(t.TempDir(), "zeros.img")
	b := append(randomPages(2), make([]byte, 64*PageSize)...)
	if err := os.WriteFile(src, b, 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := Store(src, filepath.Join(dir, "zeros.img"), NewIndex())
	if err != nil {
		t.Fatal(err)
	}
	if res.Written != 3*PageSize || res.Shared != 63 {
		t.Fatalf("zero pages not shared: %+v", res)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "zeros.img"))
	if !bytes.Equal(got, b) {
		t.Fatal("content differs")
	}
}

func TestIndexFromHashFile(t *testing.T) {
	x := NewIndex()
	hf := filepath.Join(t.TempDir(), "h")
	if err := os.WriteFile(hf, make([]byte, 3*HashSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := x.AddHashFile("f", hf); err == nil {
		t.Fatal("a hash file of the wrong size was accepted")
	}
	if err := os.WriteFile(hf, bytes.Repeat([]byte{1}, 2*HashSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := x.AddHashFile("f", hf); err != nil || x.Len() != 1 {
		t.Fatalf("index of two equal pages: len %d, %v", x.Len(), err)
	}
}

func TestStoreSharesSmallFilesWhole(t *testing.T) {
	dir := btrfstest.Dir(t)
	staging := t.TempDir()
	x := NewIndex()
	b := []byte("a small image, shorter than a page")
	src := filepath.Join(staging, "small")
	if err := os.WriteFile(src, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r1, err := Store(src, filepath.Join(dir, "one"), x)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Store(src, filepath.Join(dir, "two"), x)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Written != int64(len(b)) || r2.Written != 0 || r2.Shared != 1 || r1.Sum != r2.Sum {
		t.Fatalf("first %+v, second %+v", r1, r2)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "two"))
	if !bytes.Equal(got, b) {
		t.Fatalf("shared small file holds %q", got)
	}
}

// TestStoreWithYields: the yield function sees every written byte, in
// steps, and an error from it ends the store without leaving dst.
func TestStoreWithYields(t *testing.T) {
	dir := btrfstest.Dir(t)
	src := filepath.Join(t.TempDir(), "pages.img")
	if err := os.WriteFile(src, randomPages(1000), 0o600); err != nil {
		t.Fatal(err)
	}
	var calls int
	var sum int64
	res, err := StoreWith(src, filepath.Join(dir, "a"), NewIndex(), func(n int64) error {
		calls++
		sum += n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if sum != res.Written || calls < 1000/yieldEvery {
		t.Fatalf("yield saw %d bytes in %d calls; written %d", sum, calls, res.Written)
	}
	stop := errors.New("paused for good")
	if _, err := StoreWith(src, filepath.Join(dir, "b"), NewIndex(), func(int64) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("store with a failing yield: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b")); !os.IsNotExist(err) {
		t.Fatalf("a failed store left its file: %v", err)
	}
}
