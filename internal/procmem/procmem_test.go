package procmem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPages reads this process's own pages: every page of an anonymous
// mapping it wrote, and the written page of a private file mapping, but
// not the unwritten pages of that mapping nor those of a shared one.
func TestPages(t *testing.T) {
	if f, err := os.Open("/proc/self/pagemap"); err != nil {
		t.Skipf("no pagemap: %v", err)
	} else {
		f.Close()
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	// fill writes page i of tag into dst in place: a page built on the
	// heap would leave a copy of it there, which the read would find.
	fill := func(dst []byte, tag string, i int) {
		clear(dst[:PageSize])
		copy(dst, tag)
		copy(dst[32:], nonce[:])
		binary.LittleEndian.PutUint64(dst[64:], uint64(i))
	}
	page := func(tag string, i int) []byte { // for the checks, after the read
		b := make([]byte, PageSize)
		fill(b, tag, i)
		return b
	}
	const n = 2048 // 8 MiB
	anon, err := unix.Mmap(-1, 0, n*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	for i := range n {
		fill(anon[i*PageSize:], "anon", i)
	}
	file := func(flags int) []byte {
		p := filepath.Join(t.TempDir(), "f")
		b := make([]byte, 16*PageSize)
		for i := range 16 {
			fill(b[i*PageSize:], "file", i)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		clear(b)
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		m, err := unix.Mmap(int(f.Fd()), 0, len(b), unix.PROT_READ|unix.PROT_WRITE, flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(m) })
		var sink byte
		for i := range 16 {
			sink += m[i*PageSize] // fault every page in
		}
		_ = sink
		return m
	}
	priv := file(unix.MAP_PRIVATE)
	fill(priv[3*PageSize:], "written", 3)
	shared := file(unix.MAP_SHARED)
	fill(shared[5*PageSize:], "shared", 5)

	seen := map[[32]byte]bool{}
	st, err := Pages(context.Background(), os.Getpid(), make([]byte, 1<<20), func(b []byte) error {
		for i := 0; i < len(b); i += PageSize {
			seen[sha256.Sum256(b[i:i+PageSize])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	has := func(b []byte) bool { return seen[sha256.Sum256(b)] }
	for i := range n {
		if !has(page("anon", i)) {
			t.Fatalf("anonymous page %d not read (%+v)", i, st)
		}
	}
	if !has(page("written", 3)) {
		t.Fatal("the written page of a private file mapping not read")
	}
	if has(page("file", 4)) {
		t.Fatal("an unwritten page of a private file mapping read (the file has it)")
	}
	if has(page("shared", 5)) {
		t.Fatal("a page of a shared mapping read")
	}
	if st.Pages < n || st.Mappings == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPagesGone: a process that does not exist is an error, not an
// empty read.
func TestPagesGone(t *testing.T) {
	if _, err := Pages(context.Background(), 1<<22+12345, make([]byte, PageSize), func([]byte) error { return nil }); err == nil {
		t.Fatal("read the pages of no process")
	}
}

// TestPagesBounded: a process that maps a vast region it never touches
// costs a scan the caller's context ends.
func TestPagesBounded(t *testing.T) {
	const vast = 64 << 40 // 64 TiB of address space
	m, err := unix.Mmap(-1, 0, vast, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Skipf("cannot map 64 TiB: %v", err)
	}
	defer unix.Munmap(m)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Pages(ctx, os.Getpid(), make([]byte, 1<<20), func([]byte) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the read went on %v after its context ended", took)
	}
}
