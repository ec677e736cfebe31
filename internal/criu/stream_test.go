package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

// TestDumpStream dumps through a Stream, copying and holding, writes the
// images out and restores them: the process counts on from the dump.
// The stream must deliver the same files as a dump into a directory.
func TestDumpStream(t *testing.T) {
	pool := NewPipePool(32)
	defer pool.Close()
	if err := pool.Fill(); err != nil {
		t.Fatal(err)
	}
	var plain []string
	for _, hold := range []bool{false, true} {
		t.Run("hold="+strconv.FormatBool(hold), func(t *testing.T) {
			tool := realTool(t)
			ctx := testCtx(t)
			c := startCounter(t, 8<<20)
			before := waitCount(t, c.port, 3)
			images, dumpWork, restoreWork := dirs3(t)
			s, err := Listen(images, pool)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ds, err := tool.Dump(ctx, DumpOptions{
				Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork, Stream: s,
				PreDump: func() error { s.Hold(hold); return nil },
			})
			if err != nil {
				b, _ := os.ReadFile(filepath.Join(dumpWork, "dump.log"))
				t.Fatalf("%v\n%s", err, b)
			}
			t.Logf("dump %+v, %d bytes streamed", ds, s.Bytes())
			if s.Bytes() < 8<<20 {
				t.Fatalf("streamed %d bytes for an 8 MiB heap", s.Bytes())
			}
			c.kill()
			if err := s.WriteTo(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(images, streamSocket)); !os.IsNotExist(err) {
				t.Errorf("the stream's socket is still in the images: %v", err)
			}
			// The pagemap image names the pages image CRIU wrote.
			id, err := pagesID(filepath.Join(images, fmt.Sprintf("pagemap-%d.img", c.pid())))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(images, fmt.Sprintf("pages-%d.img", id))); err != nil {
				t.Fatalf("pagemap names pages %d: %v", id, err)
			}
			names := imageNames(t, images)
			if plain == nil {
				plain = names
			} else if len(names) != len(plain) {
				t.Errorf("holding wrote %v, copying %v", names, plain)
			}
			rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true})
			if err != nil {
				t.Fatal(err)
			}
			adopt(t, rs.Pid)
			after := mustCount(t, c.port)
			if after < before || after > before+30 {
				t.Errorf("restored count %d, dumped at %d or a little later", after, before)
			}
			waitCount(t, c.port, after+2)
		})
	}
}

func imageNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// TestStreamCheckCopied: WriteTo refuses a dump in which the pages image a
// process's pagemap names was held by reference although CopyPagesOf
// asked for a copy, and accepts it copied.
func TestStreamCheckCopied(t *testing.T) {
	head, err := proto.Marshal(&pagemap.PagemapHead{PagesId: proto.Uint32(7)})
	if err != nil {
		t.Fatal(err)
	}
	img := binary.LittleEndian.AppendUint32(nil, imgCommonMagic)
	img = binary.LittleEndian.AppendUint32(img, pagemapMagic)
	img = binary.LittleEndian.AppendUint32(img, uint32(len(head)))
	img = append(img, head...)
	for _, held := range []bool{false, true} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "pagemap-1.img"), img, 0o600); err != nil {
			t.Fatal(err)
		}
		pool := NewPipePool(1)
		s, err := Listen(dir, pool)
		if err != nil {
			t.Fatal(err)
		}
		s.CopyPagesOf(1)
		s.files = []*streamFile{{name: "pages-6.img", hold: true}, {name: "pages-7.img", hold: held}}
		err = s.WriteTo()
		s.Close()
		pool.Close()
		if held != errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("pages-7 held %v: WriteTo %v", held, err)
		}
	}
	if _, err := pagesID(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Fatal("pagesID of a missing image")
	}
	bad := filepath.Join(t.TempDir(), "pagemap-2.img")
	if err := os.WriteFile(bad, img[:9], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pagesID(bad); err == nil {
		t.Fatal("pagesID of a truncated image")
	}
}

// BenchmarkPipePoolMake: a pipe made on the pool's maker thread (charged
// to PipeUID) against one made on the caller's thread, both sized to
// the pool's size.
func BenchmarkPipePoolMake(b *testing.B) {
	testutil.RequireRoot(b)
	p := NewPipePool(1)
	for _, mode := range []string{"maker", "here"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				make := p.make
				if mode == "here" {
					make = p.makeHere
				}
				r, w, err := make()
				if err != nil {
					b.Fatal(err)
				}
				unix.Close(r)
				unix.Close(w)
			}
		})
	}
}

// TestPipePoolCharge: the pool's pipes are full size (the maker thread
// may size them past its user's soft limit) and are not charged to the
// caller's user: with the pool full, a pipe the caller makes still gets
// the default 64 KiB.
func TestPipePoolCharge(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := os.ReadFile("/proc/sys/fs/pipe-user-pages-soft")
	if err != nil {
		t.Fatal(err)
	}
	soft, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || soft == 0 {
		testutil.Unavailable(t, "fs.pipe-user-pages-soft sets no limit here")
	}
	// More than the soft limit in the pool.
	p := NewPipePool(soft*4096/NewPipePool(0).Size() + 16)
	defer p.Close()
	if err := p.Fill(); err != nil {
		t.Fatal(err)
	}
	r, w, err := p.Get()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := unix.FcntlInt(uintptr(w), unix.F_GETPIPE_SZ, 0); err != nil || n != p.Size() {
		t.Fatalf("pool pipe of %d bytes (%v), want %d", n, err, p.Size())
	}
	unix.Close(r)
	unix.Close(w)
	// As a sandbox's process makes one: root without CAP_SYS_ADMIN and
	// CAP_SYS_RESOURCE, which would exempt it from the limit.
	n, err := unprivilegedPipeSize()
	if err != nil || n != 64<<10 {
		t.Fatalf("a new pipe of the caller's user has %d bytes (%v) with the pool full, want 65536", n, err)
	}
}

// unprivilegedPipeSize makes a pipe on a thread of its own whose
// effective capabilities lack CAP_SYS_ADMIN and CAP_SYS_RESOURCE and
// returns its capacity. The thread is not given back (it ends with its
// goroutine).
func unprivilegedPipeSize() (int, error) {
	type result struct {
		n   int
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			res <- result{err: err}
			return
		}
		data[0].Effective &^= 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_SYS_RESOURCE
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			res <- result{err: err}
			return
		}
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
			res <- result{err: err}
			return
		}
		n, err := unix.FcntlInt(uintptr(fds[1]), unix.F_GETPIPE_SZ, 0)
		unix.Close(fds[0])
		unix.Close(fds[1])
		res <- result{n, err}
	}()
	r := <-res
	return r.n, r.err
}
