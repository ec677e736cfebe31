package criu

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	imgstreamer "github.com/checkpoint-restore/go-criu/v7/crit/images/img-streamer"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
)

// streamSocket is where CRIU (--stream) connects to hand a dump's image
// files over, in the images directory.
const streamSocket = "streamer-capture.sock"

// Stream receives the images of one dump over CRIU's image-streamer
// protocol: for every image file CRIU sends its name on the socket and
// then the read end of a pipe it writes the file into.
//
// In Hold mode the stream moves what arrives into pipes of its own
// (splice between pipes moves page references, it copies nothing), so
// the memory pages CRIU takes from the tree reach the stream at no copy
// cost: CRIU's writing of 100 MiB of pages falls from 35-55 ms (into a
// tmpfs file) to about 2 ms. The pages are then the tree's own, by
// reference: a process that writes one after the thaw writes the page
// the stream holds, unless its memory was write-protected first (a fork,
// see internal/template's Protect: the process then gets a copy of a
// page on its first write and the held page stays as dumped). Without
// that, the stream must copy: Hold(false), the default, writes every
// file into the images directory as it arrives, as CRIU itself would.
//
// After the dump, WriteTo writes the held files into the images
// directory (the copy, now off the frozen window) and Close releases what
// the stream holds.
type Stream struct {
	dir  string
	l    *net.UnixListener
	pool *PipePool
	hold atomic.Bool
	// copyPages are processes (their PIDs in the images) whose pages are
	// copied even when holding: memory that was not write-protected.
	// Set before the stream is shared, then only read.
	copyPages map[int]bool // +checklocksignore

	wg    sync.WaitGroup
	mu    sync.Mutex
	files []*streamFile // +checklocks:mu
	err   error         // +checklocks:mu
	done  bool          // +checklocks:mu
}

type streamFile struct {
	name    string
	pipes   []int // read ends of held pipes, in order
	hold    bool  // held in pipes, else written as it comes
	written bool  // written into the images directory as it came
	size    int64
}

// Listen starts a stream for a dump into imagesDir, taking its pipes from
// pool. Dump with DumpOptions.Stream set to it.
func Listen(imagesDir string, pool *PipePool) (*Stream, error) {
	path := filepath.Join(imagesDir, streamSocket)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("image stream: %w", err)
	}
	l.SetUnlinkOnClose(true)
	s := &Stream{dir: imagesDir, l: l, pool: pool}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// CopyPagesOf makes a holding stream copy the pages of the process with
// PID pid (as the images number it) all the same. Call it before the
// dump.
func (s *Stream) CopyPagesOf(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.copyPages == nil {
		s.copyPages = map[int]bool{}
	}
	s.copyPages[pid] = true
}

// Hold switches between holding references (true) and copying (false).
// Set it before CRIU dumps memory (at its pre-dump notification); it
// applies to what arrives after.
func (s *Stream) Hold(on bool) { s.hold.Store(on) }

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *Stream) serve() {
	defer s.wg.Done()
	c, err := s.l.AcceptUnix()
	if err != nil {
		return // closed before CRIU connected: the dump failed early
	}
	defer c.Close()
	// CRIU opens a process's pagemap image and then its pages image.
	lastPagemap := -1
	for {
		name, fd, err := nextFile(c)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				s.fail(err)
			}
			return
		}
		f := &streamFile{name: name}
		// Only page images are held: the rest is small, and copying it
		// keeps whatever else CRIU reads from the live tree as it was.
		if v, ok := strings.CutPrefix(name, "pagemap-"); ok {
			lastPagemap, _ = strconv.Atoi(strings.TrimSuffix(v, ".img"))
		}
		s.mu.Lock()
		f.hold = s.hold.Load() && strings.HasPrefix(name, "pages-") && !s.copyPages[lastPagemap]
		s.mu.Unlock()
		if !strings.HasPrefix(name, "pagemap-") && !strings.HasPrefix(name, "pages-") {
			lastPagemap = -1
		}
		s.mu.Lock()
		s.files = append(s.files, f)
		s.mu.Unlock()
		// CRIU's pipe holds 64 KiB: a page image would cost a round trip
		// per 16 pages. At the pool's size it is one per 256.
		_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, s.pool.size)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer unix.Close(fd)
			if err := s.receive(f, fd); err != nil {
				s.fail(fmt.Errorf("image stream %s: %w", f.name, err))
			}
		}()
	}
}

// nextFile reads one request (a little-endian 32-bit length and an
// img_streamer_request_entry) and the pipe that follows it.
func nextFile(c *net.UnixConn) (string, int, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return "", -1, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > 4096 {
		return "", -1, fmt.Errorf("image stream: request of %d bytes", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return "", -1, err
	}
	var req imgstreamer.ImgStreamerRequestEntry
	if err := proto.Unmarshal(msg, &req); err != nil {
		return "", -1, fmt.Errorf("image stream: request: %w", err)
	}
	name := req.GetFilename()
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return "", -1, fmt.Errorf("image stream: file name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return "", -1, fmt.Errorf("image stream: pipe of %s: %w", name, err)
	}
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cms) != 1 {
		return "", -1, fmt.Errorf("image stream: no pipe for %s", name)
	}
	fds, err := unix.ParseUnixRights(&cms[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return "", -1, fmt.Errorf("image stream: no pipe for %s", name)
	}
	return name, fds[0], nil
}

// receive takes one file until CRIU closes its pipe: held in pipes, or
// (not holding when it arrives) written into the images directory.
func (s *Stream) receive(f *streamFile, src int) error {
	if !f.hold {
		out, err := os.OpenFile(filepath.Join(s.dir, f.name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		f.written = true
		for {
			n, err := unix.Splice(src, nil, int(out.Fd()), nil, s.pool.size, unix.SPLICE_F_MOVE)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				out.Close()
				return err
			}
			if n == 0 {
				return out.Close()
			}
			f.size += n
		}
	}
	w := -1 // write end of the pipe being filled
	defer func() {
		if w >= 0 {
			unix.Close(w)
		}
	}()
	for {
		if w >= 0 && !writable(w) {
			unix.Close(w)
			w = -1
		}
		if w < 0 {
			r, pw, err := s.pool.Get()
			if err != nil {
				return err
			}
			f.pipes = append(f.pipes, r)
			w = pw
		}
		n, err := unix.Splice(src, nil, w, nil, s.pool.size, unix.SPLICE_F_MOVE)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		f.size += n
	}
}

// writable reports whether the pipe has a free slot: a splice into a
// full pipe would wait for a reader that never comes.
func writable(w int) bool {
	p := []unix.PollFd{{Fd: int32(w), Events: unix.POLLOUT}}
	for {
		_, err := unix.Poll(p, 0)
		if !errors.Is(err, unix.EINTR) {
			return err == nil && p[0].Revents&unix.POLLOUT != 0
		}
	}
}

// Finish waits for CRIU's side to end (call it after Dump returned) and
// stops listening. It returns the first error of the transfer.
func (s *Stream) Finish() error {
	s.mu.Lock()
	done := s.done
	s.done = true
	s.mu.Unlock()
	if !done {
		s.l.Close()
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// checkCopied verifies, once every file has arrived, that the pages of
// each process named by CopyPagesOf were copied and not held. Which page
// image is a process's follows from CRIU's order (its pagemap image is
// opened right before its pages image); its pagemap image names it
// (pages_id), and this makes sure the two agree: a held page image of a
// process whose memory was not write-protected could change after the
// thaw.
//
// +checklocks:s.mu
func (s *Stream) checkCopied() error {
	pids := make([]int, 0, len(s.copyPages))
	for pid := range s.copyPages {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	for _, pid := range pids {
		id, err := pagesID(filepath.Join(s.dir, fmt.Sprintf("pagemap-%d.img", pid)))
		if err != nil {
			return fmt.Errorf("image stream: pages of pid %d: %w", pid, err)
		}
		name := fmt.Sprintf("pages-%d.img", id)
		i := slices.IndexFunc(s.files, func(f *streamFile) bool { return f.name == name })
		switch {
		case i < 0:
			return fmt.Errorf("image stream: pid %d's pagemap names %s, which never came", pid, name)
		case s.files[i].hold:
			return fmt.Errorf("image stream: %s, the pages of pid %d, was held by reference, not copied: CRIU no longer opens a process's pages image right after its pagemap image (run the daemon with --cow-capture=false): %w", name, pid, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// pagesID reads the pages_id of a pagemap image's head.
func pagesID(path string) (uint32, error) {
	var head pagemap.PagemapHead
	if err := readHead(path, pagemapMagic, &head); err != nil {
		return 0, err
	}
	return head.GetPagesId(), nil
}

// pagemapMagic is the pagemap image's own magic (criu/include/magic.h).
const pagemapMagic = 0x56084025

// Bytes is the size of everything received (after Finish, which it
// calls).
func (s *Stream) Bytes() int64 {
	_ = s.Finish()
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, f := range s.files {
		n += f.size
	}
	return n
}

// WriteTo writes the held files into the images directory (after
// Finish), releasing each held pipe as it is emptied. It first checks
// that the pages CopyPagesOf asked for were copied (checkCopied).
func (s *Stream) WriteTo() error {
	if err := s.Finish(); err != nil {
		return err
	}
	dir := s.dir
	s.mu.Lock()
	files := s.files
	err := s.checkCopied() // after the thaw: reads an image
	s.mu.Unlock()
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := f.writeTo(filepath.Join(dir, f.name)); err != nil {
			return fmt.Errorf("image stream: %w", err)
		}
	}
	return nil
}

func (f *streamFile) writeTo(path string) error {
	if f.written {
		return nil
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	fd := int(out.Fd())
	var written int64
	for len(f.pipes) > 0 {
		r := f.pipes[0]
		for {
			n, err := unix.Splice(r, nil, fd, nil, 1<<20, 0)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				out.Close()
				return fmt.Errorf("%s: %w", path, err)
			}
			if n == 0 {
				break
			}
			written += n
		}
		unix.Close(r)
		f.pipes = f.pipes[1:]
	}
	f.written = true
	if err := out.Close(); err != nil {
		return err
	}
	if written != f.size {
		return fmt.Errorf("%s: wrote %d of %d bytes", path, written, f.size)
	}
	return nil
}

// Close releases what the stream still holds. It is safe after WriteTo
// and on a stream whose dump failed.
func (s *Stream) Close() {
	_ = s.Finish()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		for _, r := range f.pipes {
			unix.Close(r)
		}
		f.pipes = nil
	}
	s.files = nil
}

// PipePool keeps empty pipes at the largest size the host allows, made
// ahead of a dump: making them while CRIU writes cost 10-15 ms per 100
// MiB here.
//
// The kernel charges a pipe's buffers to the real user of the process
// that made it, and once a user holds more than fs.pipe-user-pages-soft
// pages (64 MiB by default) every new pipe of that user gets two pages
// (8 KiB) instead of sixteen. The daemon and the sandboxes' processes
// are all root: a pool of 160 MiB made as root left every later pipe of
// every sandbox at 8 KiB, and a program writing more than that into a
// pipe before its reader reads blocked for good. So the pool makes its
// pipes on one OS thread of its own whose real user is PipeUID (its
// effective user stays root, with its capabilities, which lets it size
// pipes beyond that user's soft limit): they are charged to PipeUID,
// whom no sandbox process runs as.
type PipePool struct {
	size int
	ch   chan [2]int
	fill sync.Mutex

	start sync.Once
	reqs  chan chan pipeMade // to the maker thread
	err   error              // why the maker thread could not start
}

// PipeUID is the user the pool's pipes are charged to: one no process
// of a sandbox (nor of the host, usually) runs as.
const PipeUID = 1<<31 - 2

type pipeMade struct {
	fds [2]int
	err error
}

// NewPipePool returns a pool that keeps up to n pipes ready.
func NewPipePool(n int) *PipePool {
	size := 1 << 20
	if b, err := os.ReadFile("/proc/sys/fs/pipe-max-size"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v >= 4096 {
			size = v
		}
	}
	return &PipePool{size: size, ch: make(chan [2]int, n)}
}

// Size is the capacity of each pipe in bytes.
func (p *PipePool) Size() int { return p.size }

// Fill makes pipes until the pool is full.
func (p *PipePool) Fill() error {
	p.fill.Lock()
	defer p.fill.Unlock()
	for len(p.ch) < cap(p.ch) {
		r, w, err := p.make()
		if err != nil {
			return err
		}
		p.ch <- [2]int{r, w}
	}
	return nil
}

// maker starts the thread that makes the pool's pipes as PipeUID. It
// lives as long as the daemon (the pool is the host's); its thread's
// credentials are changed, so it is never handed back to Go's scheduler:
// a goroutine that ends locked to its thread ends the thread.
func (p *PipePool) maker() error {
	p.start.Do(func() {
		p.reqs = make(chan chan pipeMade)
		started := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			// setresuid(2) on this thread only (Go's syscall.Setresuid
			// changes every thread).
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(PipeUID), ^uintptr(0), ^uintptr(0)); e != 0 {
				started <- fmt.Errorf("pipe pool: setresuid(%d): %w", PipeUID, e)
				return
			}
			started <- nil
			for res := range p.reqs {
				r, w, err := p.makeHere()
				res <- pipeMade{fds: [2]int{r, w}, err: err}
			}
		}()
		p.err = <-started
	})
	return p.err
}

// make makes one pipe on the maker thread.
func (p *PipePool) make() (int, int, error) {
	if err := p.maker(); err != nil {
		return -1, -1, err
	}
	res := make(chan pipeMade, 1)
	p.reqs <- res
	m := <-res
	return m.fds[0], m.fds[1], m.err
}

func (p *PipePool) makeHere() (int, int, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, fmt.Errorf("pipe: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, p.size); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return -1, -1, fmt.Errorf("pipe size %d: %w", p.size, err)
	}
	return fds[0], fds[1], nil
}

// Get returns a pipe (read end, write end) from the pool, or a new one
// when it is empty.
func (p *PipePool) Get() (int, int, error) {
	select {
	case fds := <-p.ch:
		return fds[0], fds[1], nil
	default:
		return p.make()
	}
}

// Close releases the pipes in the pool. The maker thread stays (the
// pool may be filled again).
func (p *PipePool) Close() {
	p.fill.Lock()
	defer p.fill.Unlock()
	for {
		select {
		case fds := <-p.ch:
			unix.Close(fds[0])
			unix.Close(fds[1])
		default:
			return
		}
	}
}
