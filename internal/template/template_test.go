//go:build linux && amd64

package template

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

// holder keeps a page of 'A's, prints its address, sets its first byte
// from each line read, and on SIGUSR1 prints its pid and that byte.
const holder = `
import os, sys, signal, ctypes
b = bytearray(b'A' * 4096)
addr = ctypes.addressof((ctypes.c_char * 4096).from_buffer(b))
def usr1(s, f):
    sys.stdout.write("%d %s\n" % (os.getpid(), chr(b[0]))); sys.stdout.flush()
signal.signal(signal.SIGUSR1, usr1)
print(addr, flush=True)
for line in sys.stdin:
    b[0] = ord(line[0]); print("ok", flush=True)
`

// waitInRead waits until pid is blocked in read(2) on its stdin. A signal
// that comes before, between a reply and the next read, runs Python's
// handler only once a line arrives: the holder would not answer it. After
// a copy the original takes copy-on-write faults on its way back to read,
// which made that window long enough to catch one signal in eight.
func waitInRead(t testing.TB, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid))
		if err == nil && strings.HasPrefix(string(b), "0 0x0 ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not blocked in read(2) on stdin within 10 s: %q", pid, b)
		}
		time.Sleep(time.Millisecond)
	}
}

type proc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func start(t testing.TB, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(testutil.Python(t), args...))
}

func (p *proc) line(t testing.TB) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	c := make(chan res, 1)
	go func() {
		s, err := p.out.ReadString('\n')
		c <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("read: %v", r.err)
		}
		return r.s
	case <-time.After(10 * time.Second):
		t.Fatal("no output within 10 s")
		return ""
	}
}

func readMem(t *testing.T, pid int, addr uintptr) byte {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], int64(addr)); err != nil {
		t.Fatal(err)
	}
	return b[0]
}

// reap kills a copy that is a child of this test process (CLONE_PARENT
// from a child of it), if it still runs, and waits for it.
func reap(pid int) {
	_ = unix.Kill(pid, unix.SIGKILL)
	var ws unix.WaitStatus
	_, _ = unix.Wait4(pid, &ws, 0, nil)
}

// TestCloneInSyscall copies a process blocked in read(2): the copy holds
// the memory of the instant of the copy while the original changes its
// own, the original's read restarts (it answers the next line), and the
// copy, once let go, runs from that instant as well.
func TestCloneInSyscall(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-c", holder)
	addr, err := strconv.ParseUint(p.line(t), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	waitInRead(t, p.cmd.Process.Pid)
	tr := NewTracer()
	defer tr.Close()
	pid := p.cmd.Process.Pid
	cp, err := tr.Clone(pid, true)
	if err != nil {
		t.Fatal(err)
	}
	defer reap(cp)
	if cp == pid || cp <= 0 {
		t.Fatalf("copy pid %d", cp)
	}
	if ppid := parentOf(t, cp); ppid != os.Getpid() {
		t.Fatalf("copy's parent %d, want the original's parent %d (CLONE_PARENT)", ppid, os.Getpid())
	}
	// clone(2) gives a child no robust futex list; the copy has the
	// original's (glibc registers one for every thread).
	var orl, crl robustList
	if err := orl.read(pid); err != nil {
		t.Fatal(err)
	}
	if err := crl.read(cp); err != nil {
		t.Fatal(err)
	}
	if orl.head == 0 || crl != orl {
		t.Fatalf("copy's robust list %+v, original's %+v", crl, orl)
	}

	if _, err := io.WriteString(p.in, "B\n"); err != nil {
		t.Fatal(err)
	}
	if got := p.line(t); got != "ok" {
		t.Fatalf("original after the copy: %q, want ok", got)
	}
	if got := readMem(t, pid, uintptr(addr)); got != 'B' {
		t.Fatalf("original's byte %q, want B", got)
	}
	if got := readMem(t, cp, uintptr(addr)); got != 'A' {
		t.Fatalf("copy's byte %q, want A (the instant of the copy)", got)
	}
	waitInRead(t, pid)
	if err := unix.Kill(pid, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if got, want := p.line(t), fmt.Sprintf("%d B", pid); got != want {
		t.Fatalf("original: %q, want %q", got, want)
	}

	// Let the copy go: it stops (job control), then runs on SIGCONT and
	// answers SIGUSR1 with its own pid and the old byte.
	if err := tr.Detach(cp); err != nil {
		t.Fatal(err)
	}
	testutil.WaitState(t, cp, "T")
	_ = unix.Kill(cp, unix.SIGUSR1)
	_ = unix.Kill(cp, unix.SIGCONT)
	if got, want := p.line(t), fmt.Sprintf("%d A", cp); got != want {
		t.Fatalf("copy: %q, want %q", got, want)
	}
	// Its read(2) restarted too: it waits for input rather than seeing
	// the end of it (which would end the loop and the process).
	time.Sleep(200 * time.Millisecond)
	if s := state(t, cp); s != "S" {
		t.Fatalf("copy in state %s after its handler, want S (blocked in read)", s)
	}
	_ = unix.Kill(cp, unix.SIGKILL)
}

// TestCloneInUserCode copies a process stopped outside any system call,
// where a syscall instruction is written over its code for the call and
// put back: both the original and the copy run on.
func TestCloneInUserCode(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-c", "import sys\nprint('go', flush=True)\nn = 0\nwhile True:\n    n += 1\n")
	p.line(t)
	time.Sleep(50 * time.Millisecond)
	pid := p.cmd.Process.Pid
	tr := NewTracer()
	defer tr.Close()
	cp, err := tr.Clone(pid, true)
	if err != nil {
		t.Fatal(err)
	}
	defer reap(cp)
	if err := tr.Detach(cp); err != nil {
		t.Fatal(err)
	}
	_ = unix.Kill(cp, unix.SIGCONT)
	for _, q := range []int{pid, cp} {
		before := cpuTicks(t, q)
		time.Sleep(300 * time.Millisecond)
		if after := cpuTicks(t, q); after <= before {
			t.Fatalf("pid %d does not run after the copy (utime %d -> %d, state %s)", q, before, after, state(t, q))
		}
	}
	_ = unix.Kill(cp, unix.SIGKILL)
}

// TestCloneRefusesThreads: a multi-threaded process is refused, and runs
// on untouched.
func TestCloneRefusesThreads(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-c", "import threading, time\nthreading.Thread(target=time.sleep, args=(100,)).start()\nprint('go', flush=True)\ntime.sleep(100)\n")
	p.line(t)
	tr := NewTracer()
	defer tr.Close()
	_, err := tr.Clone(p.cmd.Process.Pid, true)
	if !errors.Is(err, errdefs.ErrNotSupported) {
		t.Fatalf("clone of a two-threaded process: %v, want ErrNotSupported", err)
	}
	if s := state(t, p.cmd.Process.Pid); s == "t" || s == "T" {
		t.Fatalf("refused process left stopped (%s)", s)
	}
}

// TestCloseKillsHeldCopies: a copy still held when the tracer closes is
// killed, and the original runs on.
func TestCloseKillsHeldCopies(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-c", holder)
	p.line(t)
	tr := NewTracer()
	pid := p.cmd.Process.Pid
	cp, err := tr.Clone(pid, true)
	if err != nil {
		t.Fatal(err)
	}
	tr.Close()
	var ws unix.WaitStatus
	if _, err := unix.Wait4(cp, &ws, 0, nil); err != nil || !ws.Signaled() || ws.Signal() != unix.SIGKILL {
		t.Fatalf("held copy after Close: %v, %v (want killed)", ws, err)
	}
	if _, err := io.WriteString(p.in, "C\n"); err != nil {
		t.Fatal(err)
	}
	if got := p.line(t); got != "ok" {
		t.Fatalf("original after Close: %q", got)
	}
}

func state(t *testing.T, pid int) string { return testutil.StatFields(t, pid)[0] }

func parentOf(t *testing.T, pid int) int {
	n, _ := strconv.Atoi(testutil.StatFields(t, pid)[1])
	return n
}

func cpuTicks(t *testing.T, pid int) int {
	n, _ := strconv.Atoi(testutil.StatFields(t, pid)[11]) // utime
	return n
}

// TestCloneFrozen is the way a checkpoint uses the tracer: seize a
// process while its cgroup is frozen, thaw, copy. The process must not
// run between the thaw and its release (a write it made would go past
// the captured instant): it prints a counter every 5 ms, and the first
// number after the release must follow the last one before the freeze.
func TestCloneFrozen(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-u", "-c", "import time\nn = 0\nwhile True:\n    n += 1\n    print(n, flush=True)\n    time.sleep(0.005)\n")
	lines := make(chan int, 1024)
	go func() {
		for {
			s, err := p.out.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			n, _ := strconv.Atoi(strings.TrimSpace(s))
			lines <- n
		}
	}()
	last := <-lines
	pid := p.cmd.Process.Pid
	cg := frozenCgroup(t, "molt-template-test", pid)
	tr := NewTracer()
	defer tr.Close()
	if err := tr.Seize(pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	for drained := false; !drained; {
		select {
		case n := <-lines:
			last = n
		default:
			drained = true
		}
	}
	if err := cg.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if s := state(t, pid); s != "t" {
		t.Fatalf("seized process after the thaw: state %s, want t (stopped by the tracer)", s)
	}
	select {
	case n := <-lines:
		t.Fatalf("printed %d after the thaw, before its release", n)
	default:
	}
	cp, err := tr.Clone(pid, true)
	if err != nil {
		t.Fatal(err)
	}
	defer reap(cp)
	select {
	case n := <-lines:
		if n != last+1 {
			t.Fatalf("first number after the release %d, last before the freeze %d", n, last)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing printed after the release")
	}
	_ = tr.Kill(cp)
}

// writer holds 32 MiB written page by page and, for each line read,
// writes one byte of every page again and prints the minor faults that
// took.
const writer = `
import resource, sys
b = bytearray(32 << 20)
for i in range(0, len(b), 4096): b[i] = 1
print("ready", flush=True)
for line in sys.stdin:
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(0, len(b), 4096): b[i] = (b[i] + 1) & 255
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f, flush=True)
`

// TestProtectFrozen: after ProtectFrozen the private pages of each
// process it protected are write-protected (its next pass over them
// faults once per page, where the pass before faulted on none), the
// forks they were made to do are gone (no child, no zombie), and they
// run on from their reads. Two processes, so that the forks' ends
// overlap the next fork (ProtectAll's two passes).
func TestProtectFrozen(t *testing.T) {
	testutil.RequireRoot(t)
	type writerProc struct {
		p   *proc
		pid int
	}
	var ws []writerProc
	for range 2 {
		p := start(t, "-c", writer)
		if s := p.line(t); s != "ready" {
			t.Fatalf("writer said %q", s)
		}
		ws = append(ws, writerProc{p, p.cmd.Process.Pid})
	}
	pass := func(p *proc) int {
		t.Helper()
		if _, err := io.WriteString(p.in, "w\n"); err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(p.line(t))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	const pages = 32 << 20 >> 12
	for _, w := range ws {
		if n := pass(w.p); n > pages/8 {
			t.Fatalf("a pass over present, writable pages faulted %d times", n)
		}
	}
	cg := frozenCgroup(t, "molt-protect-test", ws[0].pid)
	if err := cg.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err := cg.Add(ws[1].pid); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := cg.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := ProtectFrozen(nil, []int{ws[0].pid, ws[1].pid}, cg.Thaw, func() error { return cg.Freeze(ctx) })
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("protected 2 x %d MiB in %v", 32, took)
	time.Sleep(20 * time.Millisecond)
	for _, w := range ws {
		if s := state(t, w.pid); s == "t" {
			t.Fatalf("pid %d is still stopped by a tracer after ProtectFrozen", w.pid)
		}
	}
	if err := cg.Thaw(); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", w.pid, w.pid))
		if err != nil {
			t.Fatal(err)
		}
		if s := strings.TrimSpace(string(kids)); s != "" {
			t.Fatalf("pid %d has children after ProtectFrozen: %s", w.pid, s)
		}
		if n := pass(w.p); n < pages*9/10 {
			t.Fatalf("pid %d: the first pass after ProtectFrozen faulted %d times, want about %d (one per write-protected page)", w.pid, n, pages)
		}
		if n := pass(w.p); n > pages/8 {
			t.Fatalf("pid %d: the second pass faulted %d times: its pages should be its own again", w.pid, n)
		}
	}
}

// TestProtectFrozenRefusesThreads: a multi-threaded process is refused
// and the cgroup is left frozen, the process untouched.
func TestProtectFrozenRefusesThreads(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-c", "import threading, sys\nthreading.Thread(target=sys.stdin.read, daemon=True).start()\nprint('ready', flush=True)\nimport time\ntime.sleep(60)")
	p.line(t)
	pid := p.cmd.Process.Pid
	cg := frozenCgroup(t, "molt-protect-threads", pid)
	ctx := context.Background()
	thawed := false
	err := ProtectFrozen(nil, []int{pid}, func() error { thawed = true; return cg.Thaw() }, func() error { return cg.Freeze(ctx) })
	if !errors.Is(err, errdefs.ErrNotSupported) {
		t.Fatalf("ProtectFrozen of a threaded process: %v, want ErrNotSupported", err)
	}
	if thawed {
		t.Fatal("the cgroup was thawed for a process that cannot be protected")
	}
	_ = cg.Thaw()
}

// TestProtectFrozenStopsOwnChildren: a process in stop (a child of this
// process, as a sandbox's PID 1 is of the daemon) is held still by
// ProtectFrozen without ptrace, so a concurrent wait for it here (a
// reaper) goes on waiting, and the process runs on afterwards.
func TestProtectFrozenStopsOwnChildren(t *testing.T) {
	testutil.RequireRoot(t)
	p := start(t, "-c", holder)
	p.line(t)
	pid := p.cmd.Process.Pid
	reaped := make(chan unix.WaitStatus, 1)
	go func() {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if err != unix.EINTR {
				reaped <- ws
				return
			}
		}
	}()
	cg := frozenCgroup(t, "molt-protect-own", pid)
	ctx := context.Background()
	if err := ProtectFrozen([]int{pid}, nil, cg.Thaw, func() error { return cg.Freeze(ctx) }); err != nil {
		t.Fatal(err)
	}
	if err := cg.Thaw(); err != nil {
		t.Fatal(err)
	}
	select {
	case ws := <-reaped:
		t.Fatalf("the reaper's wait returned (status %#x) while the process lives", ws)
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := io.WriteString(p.in, "B\n"); err != nil {
		t.Fatal(err)
	}
	if s := p.line(t); s != "ok" {
		t.Fatalf("after ProtectFrozen the process said %q", s)
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-reaped:
	case <-time.After(5 * time.Second):
		t.Fatal("the reaper did not reap the killed process")
	}
}

// frozenCgroup puts pid into a new cgroup, removed when the test ends,
// and freezes it.
func frozenCgroup(t *testing.T, name string, pid int) *cgroup.Cgroup {
	t.Helper()
	cg, err := cgroup.New(name+"-"+strconv.Itoa(os.Getpid()), cgroup.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Destroy(context.Background()) })
	if err := cg.Add(pid); err != nil {
		t.Fatal(err)
	}
	if err := cg.Freeze(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cg
}

func tracerPid(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "TracerPid:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no TracerPid in the status of %d", pid)
	return ""
}

// TestCloseDetaches: once Close returns, no process it seized is traced
// any more, whether it is in a ptrace stop (seized, thawed), frozen
// (seized while frozen and never thawed) or running (continued by the
// tracer: detach fails on a tracee that is not stopped), so another
// tracer (CRIU) can seize it at once.
func TestCloseDetaches(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct{ thaw, run bool }{{false, false}, {true, false}, {true, true}} {
		thaw := c.thaw
		p := start(t, "-c", "print('ready', flush=True)\nimport time\ntime.sleep(60)")
		p.line(t)
		pid := p.cmd.Process.Pid
		cg := frozenCgroup(t, fmt.Sprintf("molt-close-test-%v-%v", c.thaw, c.run), pid)
		tr := NewTracer()
		if err := tr.Seize(pid); err != nil {
			t.Fatal(err)
		}
		if thaw {
			if err := cg.Thaw(); err != nil {
				t.Fatal(err)
			}
			testutil.WaitState(t, pid, "t")
		}
		if c.run {
			if err := tr.do(func() error {
				if _, err := wait(pid); err != nil {
					return err
				}
				return unix.PtraceCont(pid, 0)
			}); err != nil {
				t.Fatal(err)
			}
			testutil.WaitState(t, pid, "S")
			// Release detaches it before it returns, not when the
			// tracer's thread exits.
			if err := tr.Release(pid); err != nil {
				t.Fatal(err)
			}
			if got := tracerPid(t, pid); got != "0" {
				t.Fatalf("%+v: after Release pid %d is still traced by %s", c, pid, got)
			}
		}
		t0 := time.Now()
		tr.Close()
		took := time.Since(t0)
		if got := tracerPid(t, pid); got != "0" {
			t.Fatalf("%+v: after Close pid %d is still traced by %s", c, pid, got)
		}
		if took > time.Second {
			t.Fatalf("%+v: Close took %v", c, took)
		}
		t.Logf("%+v: Close took %v", c, took)
		// Another tracer can seize it now.
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, 0, 0, 0); e != 0 {
			t.Fatalf("%+v: seize after Close: %v", c, e)
		}
		_ = cg.Thaw()
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// TestProtectTracerKilled: a tracer killed while an injected fork is in
// flight (a daemon killed inside a checkpoint's protection) takes the
// process and the fork's child with it. Left to run, the child would go
// on as a second copy of the process, repeating what it does, and the
// process itself would run on with injected registers. The tracer runs
// in a child test process that kills itself at the fork event.
func TestProtectTracerKilled(t *testing.T) {
	if s := os.Getenv("MOLT_TEST_PROTECT_PID"); s != "" {
		pid, _ := strconv.Atoi(s)
		forkEventHook = func(child int) {
			fmt.Printf("forked %d\n", child)
			_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		}
		err := NewTracer().Protect(pid)
		t.Fatalf("Protect returned (%v): the hook did not kill this process", err)
	}
	testutil.RequireRoot(t)
	// The loop prints a line per pass: a copy that runs on shows in
	// /proc as a process not in state Z.
	p := start(t, "-c", "import time\nb = bytearray(8 << 20)\nprint('ready', flush=True)\nwhile True: time.sleep(0.005)")
	p.line(t)
	pid := p.cmd.Process.Pid
	child := killedTracer(t, "TestProtectTracerKilled", "MOLT_TEST_PROTECT_PID", pid, "forked ")
	// The process: killed, not left to run.
	werr := make(chan error, 1)
	go func() { werr <- p.cmd.Wait() }()
	select {
	case err := <-werr:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != unix.SIGKILL {
			t.Errorf("process after its tracer was killed mid-fork: %v, want killed", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("process %d still runs after its tracer was killed mid-fork (state %s)", pid, state(t, pid))
	}
	// The fork's child: gone (or a zombie), never running on.
	if s := ended(child); s != "" {
		_ = unix.Kill(child, unix.SIGKILL)
		t.Fatalf("the injected fork's child %d runs on after its tracer was killed: %s", child, s)
	}
}

// TestNotInherited: what a fork does not pass on, set in a process, is
// reported; a process without it reports nothing, and each runs on.
func TestNotInherited(t *testing.T) {
	testutil.RequireRoot(t)
	for _, c := range []struct{ setup, want string }{
		{"", ""},
		{"signal.signal(signal.SIGALRM, lambda *a: None); signal.setitimer(signal.ITIMER_REAL, 3600)", "ITIMER_REAL"},
		{"signal.setitimer(signal.ITIMER_PROF, 3600)", "ITIMER_PROF"},
		{"ctypes.CDLL(None).prctl(36, 1)", "child subreaper"}, // PR_SET_CHILD_SUBREAPER
	} {
		t.Run(c.want, func(t *testing.T) {
			p := start(t, "-c", "import ctypes, signal, sys\n"+c.setup+"\nprint('ready', flush=True)\nfor line in sys.stdin: print(line.strip(), flush=True)")
			if got := p.line(t); got != "ready" {
				t.Fatalf("process said %q", got)
			}
			tr := NewTracer()
			defer tr.Close()
			why, err := tr.NotInherited(p.cmd.Process.Pid)
			if err != nil {
				t.Fatal(err)
			}
			if (c.want == "") != (why == "") || !strings.Contains(why, c.want) {
				t.Fatalf("NotInherited: %q, want %q", why, c.want)
			}
			if err := tr.Release(p.cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(p.in, "echo\n"); err != nil {
				t.Fatal(err)
			}
			if got := p.line(t); got != "echo" {
				t.Fatalf("process after the reads said %q", got)
			}
		})
	}
}

// TestTracerKilledAfterCopy: a daemon killed while it holds an original
// it has injected into and copied (between the copy and the release)
// leaves the original running on, its interrupted read restarted, and
// the copy gone. A single-step that ended the injection used to leave
// the trap flag set, and the original, let go by the kernel, died of
// the next trap.
func TestTracerKilledAfterCopy(t *testing.T) {
	if s := os.Getenv("MOLT_TEST_COPY_PID"); s != "" {
		pid, _ := strconv.Atoi(s)
		tr := NewTracer()
		if _, err := tr.NotInherited(pid); err != nil {
			t.Fatal(err)
		}
		cp, err := tr.Copy(pid, true)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("copy %d\n", cp)
		_ = unix.Kill(os.Getpid(), unix.SIGKILL)
		select {}
	}
	testutil.RequireRoot(t)
	p := start(t, "-c", "import sys\nb = bytearray(8 << 20)\nprint('ready', flush=True)\nfor line in sys.stdin: print(line.strip(), flush=True)")
	p.line(t)
	waitInRead(t, p.cmd.Process.Pid)
	pid := p.cmd.Process.Pid
	cp := killedTracer(t, "TestTracerKilledAfterCopy", "MOLT_TEST_COPY_PID", pid, "copy ")
	defer reap(cp)
	if _, err := io.WriteString(p.in, "still here\n"); err != nil {
		t.Fatal(err)
	}
	if got := p.line(t); got != "still here" {
		t.Fatalf("the original after its tracer was killed said %q", got)
	}
	if s := ended(cp); s != "" {
		t.Fatalf("the copy %d outlived its tracer: %s", cp, s)
	}
}

// killedTracer re-runs the test binary as test, which traces pid (passed
// in env) and kills itself; it returns the PID that process printed
// after prefix.
func killedTracer(t *testing.T, test, env string, pid int, prefix string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+strconv.Itoa(pid))
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != unix.SIGKILL {
		t.Fatalf("tracer process: %v, want killed; output:\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			if n, err := strconv.Atoi(v); err == nil && n > 0 {
				return n
			}
		}
	}
	t.Fatalf("the tracer process reported no %q; output:\n%s", prefix, out)
	return 0
}

// ended waits up to 5 s for pid to be gone or a zombie; it returns ""
// then, else pid's stat line.
func ended(pid int) string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return ""
		}
		s := string(b)
		if st := s[strings.LastIndexByte(s, ')')+2]; st == 'Z' || st == 'X' {
			return ""
		}
		if time.Now().After(deadline) {
			return s
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCopyOrphan: an orphan copy of a process whose parent is a shell
// goes to the nearest child subreaper (here the test), not to the shell
// nor to the process: neither sees a child it did not make, and the
// intermediate leaves no zombie. The copy holds the instant.
func TestCopyOrphan(t *testing.T) {
	testutil.RequireRoot(t)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) }()
	// The shell waits for python (no exec: `; :` follows).
	p := startCmd(t, exec.Command("sh", "-c", testutil.Python(t)+` -c "$0"; :`, holder))
	addr, err := strconv.ParseUint(p.line(t), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	shell := p.cmd.Process.Pid
	kids := childrenOf(t, shell)
	if len(kids) != 1 {
		t.Fatalf("the shell has children %v, want python", kids)
	}
	pid := kids[0]
	waitInRead(t, pid)
	tr := NewTracer()
	defer tr.Close()
	cp, err := tr.CopyOrphan(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer reap(cp)
	if err := tr.Release(pid); err != nil {
		t.Fatal(err)
	}
	if ppid := parentOf(t, cp); ppid != os.Getpid() {
		t.Fatalf("copy's parent %d, want the subreaper %d", ppid, os.Getpid())
	}
	if got := childrenOf(t, shell); !slices.Equal(got, []int{pid}) {
		t.Fatalf("the shell's children %v, want only python %d", got, pid)
	}
	if got := childrenOf(t, pid); len(got) != 0 {
		t.Fatalf("python's children %v after the copy, want none (the intermediate reaped)", got)
	}
	if _, err := io.WriteString(p.in, "B\n"); err != nil {
		t.Fatal(err)
	}
	if got := p.line(t); got != "ok" {
		t.Fatalf("original after the copy: %q, want ok", got)
	}
	if got := readMem(t, cp, uintptr(addr)); got != 'A' {
		t.Fatalf("copy's byte %q, want A (the instant of the copy)", got)
	}
	if got := readMem(t, pid, uintptr(addr)); got != 'B' {
		t.Fatalf("original's byte %q, want B", got)
	}
}

// startCmd starts cmd with piped stdin and stdout, killed at the end.
func startCmd(t testing.TB, cmd *exec.Cmd) *proc {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &proc{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

// childrenOf lists pid's children.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		n, _ := strconv.Atoi(f)
		out = append(out, n)
	}
	return out
}
