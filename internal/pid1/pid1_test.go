package pid1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

// instance is a running pid1 as the init of a new PID namespace.
type instance struct {
	cmd  *exec.Cmd
	pid  int // pid1's host PID
	name string
	c    *Client
}

// start runs pid1 as PID 1 of a new PID namespace. With ownProc it also
// gets a mount namespace with its own /proc (for signals to trees);
// without, it shares the host's mounts (as CRIU needs it to, below).
func start(t *testing.T, ownProc bool) *instance {
	t.Helper()
	testutil.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "pid1")
	if err := os.WriteFile(bin, Binary(), 0o755); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("molt-pid1-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var cmd *exec.Cmd
	if ownProc {
		cmd = exec.Command("unshare", "--pid", "--fork", "--mount-proc", bin, name)
	} else {
		cmd = exec.Command(bin, name)
		// Its own session, so that CRIU finds the whole session inside
		// the tree.
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID, Setsid: true}
	}
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		w.Close()
		t.Fatal(err)
	}
	w.Close()
	in := &instance{cmd: cmd, pid: cmd.Process.Pid, name: name}
	t.Cleanup(func() {
		_ = unix.Kill(in.pid, unix.SIGKILL)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != "ok\n" {
		t.Fatalf("pid1 did not start: %q, %v", line, err)
	}
	if ownProc {
		// unshare forked pid1: find it.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", in.pid, in.pid))
		if err != nil || len(strings.Fields(string(b))) != 1 {
			t.Fatalf("unshare's child: %q, %v", b, err)
		}
		in.pid, _ = strconv.Atoi(strings.Fields(string(b))[0])
	}
	in.c = New(nil, name, in.pid)
	return in
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// waitExit waits until the pidfd reports its process's exit.
func waitExit(t *testing.T, pidfd *os.File) {
	t.Helper()
	fds := []unix.PollFd{{Fd: int32(pidfd.Fd()), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 10000); err != nil || n != 1 {
		t.Fatalf("pidfd: process did not exit: %d, %v", n, err)
	}
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

var env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}

func TestSpawnStatus(t *testing.T) {
	in := start(t, false)
	c := ctx(t)
	pid, entries, err := in.c.Info(c)
	if err != nil || pid != 1 || entries != 0 {
		t.Fatalf("info: pid %d, entries %d, %v; want 1, 0", pid, entries, err)
	}
	or, ow := pipe(t)
	er, ew := pipe(t)
	dir := t.TempDir()
	// A nil file is /dev/null.
	p, pidfd, err := in.c.Spawn(c, Spawn{
		Path: "sh", Args: []string{"sh", "-c", `echo "out $(pwd) $X $(readlink /proc/self/fd/0)"; echo err >&2; exit 3`},
		Env: append(env, "X=42"), Dir: dir, Setsid: true, Watch: true, Files: []*os.File{nil, ow, ew},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pidfd.Close()
	ow.Close()
	ew.Close()
	out, _ := io.ReadAll(or)
	errOut, _ := io.ReadAll(er)
	if string(out) != "out "+dir+" 42 /dev/null\n" || string(errOut) != "err\n" {
		t.Fatalf("output %q, %q", out, errOut)
	}
	waitExit(t, pidfd)
	st, ws, err := in.c.Status(c, p)
	if err != nil || st != Exited || !ws.Exited() || ws.ExitStatus() != 3 {
		t.Fatalf("status of %d: %v %v %v, want exited 3", p, st, ws, err)
	}
	// The status is handed out once.
	if st, _, err := in.c.Status(c, p); err != nil || st != Unknown {
		t.Fatalf("second status: %v %v, want unknown", st, err)
	}
}

func TestSpawnErrors(t *testing.T) {
	in := start(t, false)
	c := ctx(t)
	for _, tc := range []struct {
		s     Spawn
		stage string
		errno syscall.Errno
	}{
		{Spawn{Path: "no-such-program", Args: []string{"x"}, Env: env}, "exec", unix.ENOENT},
		{Spawn{Path: "/no/such/program", Args: []string{"x"}, Env: env}, "exec", unix.ENOENT},
		{Spawn{Path: "/etc/passwd", Args: []string{"x"}, Env: env}, "exec", unix.EACCES},
		{Spawn{Path: "true", Args: []string{"true"}, Env: env, Dir: "/no/such/dir"}, "chdir", unix.ENOENT},
	} {
		_, _, err := in.c.Spawn(c, tc.s)
		var e *Error
		if !errors.As(err, &e) || e.Stage != tc.stage || e.Errno != tc.errno {
			t.Errorf("spawn %s in %q: %v, want %s: %v", tc.s.Path, tc.s.Dir, err, tc.stage, tc.errno)
		}
	}
	if _, _, err := in.c.Spawn(c, Spawn{Path: "true"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("spawn without arguments: %v", err)
	}
	// PATH from the request's environment, not pid1's.
	_, pidfd, err := in.c.Spawn(c, Spawn{Path: "true", Args: []string{"true"}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	pidfd.Close()
	if _, _, err := in.c.Spawn(c, Spawn{Path: "true", Args: []string{"true"}, Env: []string{"PATH=/nowhere"}}); !errors.Is(err, unix.ENOENT) {
		t.Errorf("spawn with a PATH without the program: %v", err)
	}
}

// keptCat starts cat with its stdin and stdout on pipes whose other ends
// pid1 keeps under tag; the caller's copies are closed.
func keptCat(t *testing.T, c *Client, tag string) int {
	t.Helper()
	inR, inW := pipe(t)
	outR, outW := pipe(t)
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	p, pidfd, err := c.Spawn(ctx(t), Spawn{Path: "cat", Args: []string{"cat"}, Env: env,
		Files: []*os.File{inR, outW, null}, Keep: []*os.File{inW, outR}, Tag: tag})
	if err != nil {
		t.Fatal(err)
	}
	pidfd.Close()
	for _, f := range []*os.File{inR, inW, outR, outW} {
		f.Close()
	}
	return p
}

// echo writes a line through a kept entry's pipes and reads it back.
func echo(t *testing.T, e Entry, line string) {
	t.Helper()
	if len(e.Files) != 2 {
		t.Fatalf("entry %s: %d files", e.Tag, len(e.Files))
	}
	if _, err := e.Files[0].Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
	_ = e.Files[1].SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := bufio.NewReader(e.Files[1]).ReadString('\n')
	if err != nil || got != line {
		t.Fatalf("echo through %s: %q, %v", e.Tag, got, err)
	}
}

func closeEntries(es []Entry) {
	for _, e := range es {
		e.Pidfd.Close()
		for _, f := range e.Files {
			f.Close()
		}
	}
}

// Kept descriptors come back from Table, in order; Drop closes pid1's
// copies (cat then reads EOF and exits); a process's exit drops its
// entry.
func TestKeepTableDrop(t *testing.T) {
	in := start(t, false)
	c := ctx(t)
	p1 := keptCat(t, in.c, "s1")
	p2 := keptCat(t, in.c, "s2")
	es, err := in.c.Table(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 {
		t.Fatalf("table: %+v", es)
	}
	for _, e := range es {
		want := map[string]int{"s1": p1, "s2": p2}[e.Tag]
		if e.Pid != want {
			t.Fatalf("entry %s: pid %d, want %d", e.Tag, e.Pid, want)
		}
		echo(t, e, "hello "+e.Tag+"\n")
	}
	closeEntries(es)

	if err := in.c.Drop(c, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := in.c.Drop(c, "s1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second drop: %v, want not found", err)
	}
	// s2's cat is killed: its entry goes with it.
	if err := in.c.Signal(c, p2, unix.SIGKILL, false, false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		es, err := in.c.Table(c)
		if err != nil {
			t.Fatal(err)
		}
		closeEntries(es)
		if len(es) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("entries left: %+v", es)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// s1's cat read EOF once its stdin's last writer (pid1's copy) closed.
	children := func() string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", in.pid, in.pid))
		return strings.TrimSpace(string(b))
	}
	for deadline := time.Now().Add(5 * time.Second); children() != ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("children left: %s", children())
		}
	}
}

// A tree signal reaches every descendant, a group signal the group.
func TestSignalTree(t *testing.T) {
	in := start(t, true)
	c := ctx(t)
	p, pidfd, err := in.c.Spawn(c, Spawn{Path: "sh", Args: []string{"sh", "-c", "sleep 100 & sleep 100 & wait"}, Env: env, Watch: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pidfd.Close()
	hostChildren := func(pid int) []string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		return strings.Fields(string(b))
	}
	// Both sleeps run under sh (host PIDs).
	var sh int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ch := hostChildren(in.pid); len(ch) == 1 {
			sh, _ = strconv.Atoi(ch[0])
			if len(hostChildren(sh)) == 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("sh and its two sleeps did not start")
		}
	}
	if err := in.c.Signal(c, p, unix.SIGKILL, false, true); err != nil {
		t.Fatal(err)
	}
	waitExit(t, pidfd)
	for deadline := time.Now().Add(5 * time.Second); len(hostChildren(in.pid)) != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("processes left after a tree kill: %v", hostChildren(in.pid))
		}
	}
	if st, ws, err := in.c.Status(c, p); err != nil || st != Exited || ws.Signal() != unix.SIGKILL {
		t.Fatalf("status: %v %v %v", st, ws, err)
	}
	if err := in.c.Signal(c, 1, unix.SIGKILL, false, false); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("signal to pid1 itself: %v, want EINVAL", err)
	}
}

// Processes inside the namespace get no answer: pid1 serves only peers
// outside it.
func TestRefusesPeersInside(t *testing.T) {
	in := start(t, false)
	c := ctx(t)
	or, ow := pipe(t)
	script := fmt.Sprintf(`import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect("\0%s")
try:
    s.send(b"\1\0\0\0" + b"\0" * 44)
    r = s.recv(100)
    print("refused" if r == b"" else repr(r))
except (ConnectionResetError, BrokenPipeError):
    print("refused")`, in.name)
	_, pidfd, err := in.c.Spawn(c, Spawn{Path: "python3", Args: []string{"python3", "-c", script}, Env: env, Files: []*os.File{ow, ow, ow}})
	if err != nil {
		t.Fatal(err)
	}
	defer pidfd.Close()
	ow.Close()
	out, _ := io.ReadAll(or)
	if strings.TrimSpace(string(out)) != "refused" {
		t.Fatalf("a client inside the namespace got %q, want no answer", out)
	}
	// The same request from outside is answered.
	if pid, _, err := in.c.Info(c); err != nil || pid != 1 {
		t.Fatalf("info from outside: %d, %v", pid, err)
	}
	// A client expecting another process behind the name refuses.
	if _, _, err := New(nil, in.name, in.pid+100000).Info(c); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("client checking for another server: %v, want unavailable", err)
	}
}

// The design's point: CRIU dumps pid1 with a session-like process whose
// pipe ends pid1 keeps, restores them, and the next client takes the
// pipes back from the restored pid1 and talks to the restored process.
func TestCRIURoundTrip(t *testing.T) {
	in := start(t, false)
	if _, err := os.Stat(criu.DefaultPath); err != nil {
		testutil.Unavailable(t, "criu not installed: run scripts/criu.sh")
	}
	tool := criu.New(criu.DefaultPath)
	c := ctx(t)
	keptCat(t, in.c, "s1")
	es, err := in.c.Table(c)
	if err != nil || len(es) != 1 {
		t.Fatalf("table: %+v, %v", es, err)
	}
	echo(t, es[0], "before\n")
	closeEntries(es)

	images, work := t.TempDir(), t.TempDir()
	st, err := tool.Dump(c, criu.DumpOptions{Pid: in.pid, ImagesDir: images, WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CRIU froze pid1 and cat for %.1f ms (%d pages written)", st.FrozenMS, st.PagesWritten)
	_ = in.cmd.Wait() // the dump killed the tree
	if _, _, err := in.c.Info(c); err == nil {
		t.Fatal("pid1 answers after the dump killed it")
	}

	res, err := tool.Restore(c, criu.RestoreOptions{ImagesDir: images, WorkDir: t.TempDir(), RstSibling: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Kill(res.Pid, unix.SIGKILL)
		var ws unix.WaitStatus
		_, _ = unix.Wait4(res.Pid, &ws, 0, nil)
	})
	in.c = New(nil, in.name, res.Pid)
	if pid, _, err := in.c.Info(c); err != nil || pid != 1 {
		t.Fatalf("restored pid1: %d, %v", pid, err)
	}
	es, err = in.c.Table(c)
	if err != nil || len(es) != 1 || es[0].Tag != "s1" {
		t.Fatalf("restored table: %+v, %v", es, err)
	}
	defer closeEntries(es)
	echo(t, es[0], "after\n")
}

// TestCopySelf: SIGUSR2 from outside the namespace makes pid1 copy
// itself, stopped; from inside it does nothing; a copy let go or
// signalled stops again, and only a kill ends it.
func TestCopySelf(t *testing.T) {
	in := start(t, true)
	c := ctx(t)
	if !CanCopy(in.pid) {
		t.Fatal("CanCopy: pid1 does not block SIGUSR2")
	}
	if CanCopy(os.Getpid()) {
		t.Fatal("CanCopy says the test process copies itself")
	}
	children := func() []string {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", in.pid, in.pid))
		return strings.Fields(string(b))
	}
	// From inside: nothing.
	_, pidfd, err := in.c.Spawn(c, Spawn{Path: "kill", Args: []string{"kill", "-USR2", "1"}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	waitExit(t, pidfd)
	pidfd.Close()
	time.Sleep(50 * time.Millisecond)
	if kids := children(); len(kids) != 0 {
		t.Fatalf("SIGUSR2 from inside the namespace left children %v", kids)
	}
	if err := unix.Kill(in.pid, CopySignal); err != nil {
		t.Fatal(err)
	}
	var cp int
	deadline := time.Now().Add(5 * time.Second)
	for {
		if kids := children(); len(kids) == 1 {
			cp, _ = strconv.Atoi(kids[0])
			if testutil.StatFields(t, cp)[0] == "T" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stopped copy: children %v", children())
		}
		time.Sleep(time.Millisecond)
	}
	if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", cp)); exe != mustReadlink(t, fmt.Sprintf("/proc/%d/exe", in.pid)) {
		t.Fatalf("copy runs %q", exe)
	}
	// pid1 still serves.
	if pid, _, err := in.c.Info(c); err != nil || pid != 1 {
		t.Fatalf("info after the copy: %d, %v", pid, err)
	}
	// Let go and signalled (a sandbox's broadcast kill, the SIGHUP that
	// comes with an orphaned group's SIGCONT), the copy is not PID 1: it
	// stops again and waits for its dump.
	for _, sig := range []unix.Signal{unix.SIGHUP, unix.SIGTERM, unix.SIGCONT} {
		if err := unix.Kill(cp, sig); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	testutil.WaitState(t, cp, "T")
	if kids := children(); len(kids) != 1 || kids[0] != strconv.Itoa(cp) {
		t.Fatalf("after SIGHUP, SIGTERM and SIGCONT the copy is gone: children %v", kids)
	}
	// A kill ends it, and pid1 reaps it.
	if err := unix.Kill(cp, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(children()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the killed copy is still there: %v", children())
		}
		time.Sleep(time.Millisecond)
	}
}

func mustReadlink(t *testing.T, p string) string {
	t.Helper()
	s, err := os.Readlink(p)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
