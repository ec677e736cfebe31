package criu

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// hasherScript holds heap bytes of random data and answers every
// connection with the SHA-256 of that memory as it reads it then, and
// the one it computed at the start.
const hasherScript = `
import hashlib, os, socket, sys
os.closerange(3, 1 << 16)
heap = bytearray(os.urandom(int(sys.argv[1])))
first = hashlib.sha256(heap).hexdigest()
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(8)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
while True:
    c, _ = s.accept()
    c.sendall(("%s %s\n" % (hashlib.sha256(heap).hexdigest(), first)).encode())
    c.close()
`

func askHashes(t *testing.T, port int) (now, first string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		t.Fatalf("answer %q", line)
	}
	return f[0], f[1]
}

// TestLazyRestoreFromPageServer: a lazy restore whose lazy pages are
// not in the images directory at all (they are zeroed there) but come
// through ServePages, as a resume from the store serves them: the
// restored process reads back exactly the memory it had.
func TestLazyRestoreFromPageServer(t *testing.T) {
	tool, ctx := lazyTool(t)
	images, dumpWork, restoreWork := dirs3(t)
	portFile := filepath.Join(t.TempDir(), "port")
	c := startScript(t, hasherScript, strconv.Itoa(24<<20), portFile)
	port := waitPort(t, portFile)
	now, first := askHashes(t, port)
	if now != first {
		t.Fatalf("the process's memory changed before the dump: %s, %s", now, first)
	}
	if _, err := tool.Dump(ctx, DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork}); err != nil {
		t.Fatal(err)
	}
	c.kill()

	pm, err := ReadPageMap(images)
	if err != nil {
		t.Fatal(err)
	}
	var lazy uint64
	for _, r := range pm.Lazy() {
		lazy += r.Pages
	}
	if lazy < (24<<20)/PageSize {
		t.Fatalf("%d lazy pages, fewer than the heap's", lazy)
	}
	// The served copy of each page image; the images directory keeps
	// only the pages a restore reads itself.
	served := map[string][]byte{}
	for img := range pm.Pages() {
		p := filepath.Join(images, img)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		served[img] = b
		kept := make([]byte, len(b))
		for _, r := range pm.Eager() {
			if r.Image == img {
				lo, hi := r.Index*PageSize, (r.Index+r.Pages)*PageSize
				copy(kept[lo:hi], b[lo:hi])
			}
		}
		if err := os.WriteFile(p, kept, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ours, theirs := socketPair(t)
	var pages atomic.Uint64
	served1 := make(chan error, 1)
	go func() {
		served1 <- ServePages(ours, pm, func(img string, index uint64, n int, buf []byte) error {
			b, ok := served[img]
			if !ok || (index+uint64(n))*PageSize > uint64(len(b)) {
				return fmt.Errorf("no pages %d+%d of %s", index, n, img)
			}
			copy(buf, b[index*PageSize:])
			pages.Add(uint64(n))
			return nil
		})
	}()
	rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true, LazyPages: true, PageServer: theirs})
	theirs.Close()
	if err != nil {
		t.Fatal(err)
	}
	adopt(t, rs.Pid)
	if now, first2 := askHashes(t, port); now != first || first2 != first {
		t.Fatalf("restored memory hashes to %s (recorded %s), want %s", now, first2, first)
	}
	select {
	case err := <-rs.LazyDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("lazy-pages daemon still running after 30 s")
	}
	if err := <-served1; err != nil {
		t.Fatal(err)
	}
	if got := pages.Load(); got != lazy {
		t.Errorf("served %d pages, want every lazy page (%d)", got, lazy)
	}
	t.Logf("restore returned in %.1f ms; %d lazy pages served", rs.Stats.TotalMS, pages.Load())
}

// TestPageServerRefuses: a request the page map has no run for, and a
// source that fails, end the serving with an error (and the daemon's
// restore with it) rather than with wrong pages.
func TestPageServerRefuses(t *testing.T) {
	pm := &PageMap{tasks: map[uint64][]PageRun{7: {{Vaddr: 0x10000, Pages: 4, Image: "pages-1.img", Index: 2, Lazy: true}}}}
	if img, idx, ok := pm.Find(7, 0x11000, 3); !ok || img != "pages-1.img" || idx != 3 {
		t.Fatalf("Find: %q %d %v", img, idx, ok)
	}
	for _, q := range [][3]uint64{{7, 0x11000, 4}, {7, 0xf000, 1}, {8, 0x10000, 1}, {7, 0x10800, 1}, {7, 0x14000, 1}, {7, 0x10000, 0}} {
		if _, _, ok := pm.Find(q[0], q[1], q[2]); ok {
			t.Errorf("Find(%d, %#x, %d) found pages", q[0], q[1], q[2])
		}
	}
	request := func(pid, vaddr, n uint64) []byte {
		b := make([]byte, psiSize)
		b[0] = psIovGet
		for i, v := range []uint64{n, vaddr, pid} {
			for j := 0; j < 8; j++ {
				b[8+8*i+j] = byte(v >> (8 * j))
			}
		}
		return b
	}
	bad := errors.New("bad page")
	for name, tc := range map[string]struct {
		req []byte
		src PageSource
	}{
		"unknown pages": {request(7, 0x20000, 1), func(string, uint64, int, []byte) error { return nil }},
		"source fails":  {request(7, 0x10000, 2), func(string, uint64, int, []byte) error { return bad }},
		"unknown cmd":   {make([]byte, psiSize), func(string, uint64, int, []byte) error { return nil }},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := socketPair(t)
			if _, err := b.Write(tc.req); err != nil {
				t.Fatal(err)
			}
			if err := ServePages(a, pm, tc.src); err == nil {
				t.Fatal("served")
			} else {
				t.Log(err)
			}
		})
	}
	// A good request, then the daemon's goodbye.
	a, b := socketPair(t)
	closeReq := make([]byte, psiSize)
	closeReq[0], closeReq[1] = psIovClose&0xff, psIovClose>>8
	b.Write(append(request(7, 0x11000, 2), closeReq...))
	done := make(chan error, 1)
	go func() {
		done <- ServePages(a, pm, func(img string, index uint64, n int, buf []byte) error {
			for i := range buf {
				buf[i] = byte(index)
			}
			return nil
		})
	}()
	got := make([]byte, psiSize+2*PageSize+4)
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if got[0] != psIovAddF || got[2] != pagePresent || got[8] != 2 || got[psiSize] != 3 || got[psiSize+2*PageSize-1] != 3 {
		t.Errorf("answer header %x, first page byte %d", got[:psiSize], got[psiSize])
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// socketPair returns the two ends of a stream socket pair, closed when
// t ends.
func socketPair(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "page server"), os.NewFile(uintptr(fds[1]), "lazy pages")
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
