package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/testutil"
	"golang.org/x/sys/unix"
)

// cgroup2Root is the host's cgroup2 mount (hybrid or v2 layout), or ""
// when it has none.
var cgroup2Root, _ = cgroup.Cgroup2Root()

func skipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("MOLT_REQUIRE_PRIVILEGED") == "1" {
		t.Fatalf("MOLT_REQUIRE_PRIVILEGED=1: "+format, args...)
	}
	t.Skipf(format, args...)
}

var (
	sharedOnce sync.Once
	sharedIn   *Inspector
	sharedErr  error
)

// inspector returns the Inspector shared by the tests of this package.
func inspector(t testing.TB) *Inspector {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(t, "inspect tests need root (BPF, cgroups, namespaces)")
	}
	if _, err := os.Stat(filepath.Join(cgroup2Root, "cgroup.procs")); err != nil {
		skipOrFail(t, "no cgroup2 hierarchy at %s: %v", cgroup2Root, err)
	}
	sharedOnce.Do(func() { sharedIn, sharedErr = Open(Options{}) })
	if sharedErr != nil {
		skipOrFail(t, "BPF unavailable: %v", sharedErr)
	}
	return sharedIn
}

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedIn != nil {
		if err := sharedIn.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing inspector:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// python returns the system's python3 (never a user's pyenv shim or
// build, whose interpreter and modules differ between machines).
func python(t testing.TB) string {
	t.Helper()
	return testutil.Python(t)
}

// sandbox is a cgroup2 directory with a long-lived process in its own pid
// (and mount) namespace, like a molt sandbox's live tree.
type sandbox struct {
	t    *testing.T
	cg   string
	cgFD *os.File
	init *exec.Cmd
	w    *Watch
	dir  string
	// allowExit is an exit status of run commands that is not a failure.
	allowExit int
}

func newCgroup(t *testing.T, parent string) (string, *os.File) {
	t.Helper()
	cg := filepath.Join(parent, fmt.Sprintf("molt-inspect-test-%08x", rand.Uint32()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatalf("creating cgroup: %v", err)
	}
	fd, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fd.Close()
		killCgroup(cg)
		var err error
		for i := 0; i < 100; i++ {
			if err = os.Remove(cg); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("removing cgroup %s: %v", cg, err)
	})
	return cg, fd
}

func killCgroup(cg string) {
	// cgroup.kill also reaches processes in child cgroups.
	os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0)
}

func newSandbox(t *testing.T, in *Inspector) *sandbox {
	t.Helper()
	s := &sandbox{t: t}
	s.cg, s.cgFD = newCgroup(t, cgroup2Root)
	s.init = s.start(true, "sleep", "3600")
	var err error
	s.w, err = in.Watch(s.cg, s.init.Process.Pid)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	t.Cleanup(func() {
		if err := s.w.Close(); err != nil {
			t.Errorf("Watch.Close: %v", err)
		}
	})
	d, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.dir = d
	return s
}

// start starts a background process in the sandbox's cgroup, in a new pid
// namespace if newPID.
func (s *sandbox) start(newPID bool, args ...string) *exec.Cmd {
	s.t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(s.cgFD.Fd())}
	if newPID {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting %v: %v", args, err)
	}
	s.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// run runs a command inside the pid namespace of nsPid (0: the sandbox's
// live tree) and the sandbox's cgroup, and waits for it. Like a restore tool,
// nsenter itself stays in the host pid namespace; only its child is inside.
func (s *sandbox) runIn(nsPid int, inCgroup bool, args ...string) string {
	s.t.Helper()
	if nsPid == 0 {
		nsPid = s.init.Process.Pid
	}
	full := append([]string{"-t", strconv.Itoa(nsPid), "-p", "--"}, args...)
	cmd := exec.Command("nsenter", full...)
	if inCgroup {
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(s.cgFD.Fd())}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if err != nil && !(s.allowExit != 0 && errors.As(err, &ee) && ee.ExitCode() == s.allowExit) {
		s.t.Fatalf("running %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (s *sandbox) run(args ...string) string {
	s.t.Helper()
	return s.runIn(0, true, args...)
}

func (s *sandbox) sh(script string) string {
	s.t.Helper()
	return s.run("sh", "-c", script)
}

func (s *sandbox) py(code string) string {
	s.t.Helper()
	return s.run(python(s.t), "-B", "-c", code)
}

func (s *sandbox) cut() Effects {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eff, err := s.w.Cut(ctx)
	if err != nil {
		s.t.Fatalf("Cut: %v", err)
	}
	return eff
}

func (s *sandbox) p(name string) string { return filepath.Join(s.dir, name) }

func dump(e Effects) string {
	b, _ := json.MarshalIndent(e, "", "  ")
	return string(b)
}

func fileOps(e Effects, path string) []string {
	for _, f := range e.Files {
		if f.Path == path {
			return f.Ops
		}
	}
	return nil
}

func writeFile(t *testing.T, p string, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

type wantOp struct{ path, op string }

func TestFileEffects(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut() // discard sandbox setup
	py := func(code string, args ...any) func() { return func() { s.py(fmt.Sprintf(code, args...)) } }

	cases := []struct {
		name  string
		setup func()
		run   func()
		want  []wantOp
	}{
		{
			name: "shell redirect write",
			run:  func() { s.sh("echo hello > " + s.p("w.txt")) },
			want: []wantOp{{s.p("w.txt"), "create"}, {s.p("w.txt"), "truncate"}, {s.p("w.txt"), "write"}},
		},
		{
			name:  "pwrite",
			setup: func() { writeFile(t, s.p("pw.txt"), "0123456789") },
			run:   py("import os\nfd=os.open(%q, os.O_WRONLY)\nos.pwrite(fd, b'x', 3)", s.p("pw.txt")),
			want:  []wantOp{{s.p("pw.txt"), "write"}},
		},
		{
			name:  "writev",
			setup: func() { writeFile(t, s.p("wv.txt"), "") },
			run:   py("import os\nfd=os.open(%q, os.O_WRONLY|os.O_APPEND)\nos.writev(fd, [b'a', b'b'])", s.p("wv.txt")),
			want:  []wantOp{{s.p("wv.txt"), "write"}},
		},
		{
			name:  "mmap shared write",
			setup: func() { writeFile(t, s.p("mm.bin"), strings.Repeat("\x00", 4096)) },
			run:   py("import mmap\nf=open(%q,'r+b')\nm=mmap.mmap(f.fileno(), 0)\nm[0:1]=b'x'\nm.flush()", s.p("mm.bin")),
			want:  []wantOp{{s.p("mm.bin"), "mmap_write"}},
		},
		{
			name:  "truncate by path",
			setup: func() { writeFile(t, s.p("tr.txt"), "abc") },
			run:   py("import os\nos.truncate(%q, 1)", s.p("tr.txt")),
			want:  []wantOp{{s.p("tr.txt"), "truncate"}},
		},
		{
			name:  "ftruncate",
			setup: func() { writeFile(t, s.p("ftr.txt"), "abc") },
			run:   py("import os\nfd=os.open(%q, os.O_WRONLY)\nos.ftruncate(fd, 1)", s.p("ftr.txt")),
			want:  []wantOp{{s.p("ftr.txt"), "truncate"}},
		},
		{
			name:  "O_TRUNC open",
			setup: func() { writeFile(t, s.p("otr.txt"), "abc") },
			run:   py("import os\nos.open(%q, os.O_WRONLY|os.O_TRUNC)", s.p("otr.txt")),
			want:  []wantOp{{s.p("otr.txt"), "truncate"}},
		},
		{
			name:  "rename",
			setup: func() { writeFile(t, s.p("ren-a"), "x") },
			run:   func() { s.run("mv", s.p("ren-a"), s.p("ren-b")) },
			want:  []wantOp{{s.p("ren-a"), "rename_from"}, {s.p("ren-b"), "rename_to"}},
		},
		{
			name:  "rename relative to cwd",
			setup: func() { writeFile(t, s.p("rel-a"), "x") },
			run:   func() { s.sh("cd " + s.dir + " && " + python(t) + " -B -c \"import os; os.rename('rel-a', 'rel-b')\"") },
			want:  []wantOp{{s.p("rel-a"), "rename_from"}, {s.p("rel-b"), "rename_to"}},
		},
		{
			name:  "hard link",
			setup: func() { writeFile(t, s.p("ln-src"), "x") },
			run:   func() { s.run("ln", s.p("ln-src"), s.p("ln-dst")) },
			want:  []wantOp{{s.p("ln-dst"), "link"}},
		},
		{
			name: "symlink",
			run:  func() { s.run("ln", "-s", "nowhere", s.p("sym")) },
			want: []wantOp{{s.p("sym"), "symlink"}},
		},
		{
			name:  "unlink",
			setup: func() { writeFile(t, s.p("rm.txt"), "x") },
			run:   func() { s.run("rm", s.p("rm.txt")) },
			want:  []wantOp{{s.p("rm.txt"), "delete"}},
		},
		{
			name: "mkdir",
			run:  func() { s.run("mkdir", s.p("newdir")) },
			want: []wantOp{{s.p("newdir"), "mkdir"}},
		},
		{
			name:  "rmdir",
			setup: func() { os.Mkdir(s.p("olddir"), 0o755) },
			run:   func() { s.run("rmdir", s.p("olddir")) },
			want:  []wantOp{{s.p("olddir"), "rmdir"}},
		},
		{
			name:  "rm -r (unlinkat AT_REMOVEDIR)",
			setup: func() { os.MkdirAll(s.p("tree/sub"), 0o755); writeFile(t, s.p("tree/sub/f"), "x") },
			run:   func() { s.run("rm", "-r", s.p("tree")) },
			want:  []wantOp{{s.p("tree"), "rmdir"}, {s.p("tree/sub"), "rmdir"}, {s.p("tree/sub/f"), "delete"}},
		},
		{
			name: "mkfifo",
			run:  func() { s.run("mkfifo", s.p("fifo")) },
			want: []wantOp{{s.p("fifo"), "mknod"}},
		},
		{
			name:  "chmod",
			setup: func() { writeFile(t, s.p("chmod.txt"), "x") },
			run:   func() { s.run("chmod", "600", s.p("chmod.txt")) },
			want:  []wantOp{{s.p("chmod.txt"), "chmod"}},
		},
		{
			name:  "fchmod",
			setup: func() { writeFile(t, s.p("fchmod.txt"), "x") },
			run:   py("import os\nfd=os.open(%q, os.O_RDONLY)\nos.fchmod(fd, 0o600)", s.p("fchmod.txt")),
			want:  []wantOp{{s.p("fchmod.txt"), "chmod"}},
		},
		{
			name:  "chown",
			setup: func() { writeFile(t, s.p("chown.txt"), "x") },
			run:   func() { s.run("chown", "1:1", s.p("chown.txt")) },
			want:  []wantOp{{s.p("chown.txt"), "chown"}},
		},
		{
			name:  "touch existing (utimensat on fd)",
			setup: func() { writeFile(t, s.p("touch.txt"), "x") },
			run:   func() { s.run("touch", s.p("touch.txt")) },
			want:  []wantOp{{s.p("touch.txt"), "utimes"}},
		},
		{
			name:  "utime by path",
			setup: func() { writeFile(t, s.p("utime.txt"), "x") },
			run:   py("import os\nos.utime(%q, (1, 1))", s.p("utime.txt")),
			want:  []wantOp{{s.p("utime.txt"), "utimes"}},
		},
		{
			name:  "setxattr",
			setup: func() { writeFile(t, s.p("xattr.txt"), "x") },
			run:   py("import os\nos.setxattr(%q, 'user.molt', b'v')", s.p("xattr.txt")),
			want:  []wantOp{{s.p("xattr.txt"), "xattr"}},
		},
		{
			name:  "copy_file_range",
			setup: func() { writeFile(t, s.p("cfr-src"), "data"); writeFile(t, s.p("cfr-dst"), "") },
			run: py("import os\ns=os.open(%q, os.O_RDONLY)\nd=os.open(%q, os.O_WRONLY)\nos.copy_file_range(s, d, 4)",
				s.p("cfr-src"), s.p("cfr-dst")),
			want: []wantOp{{s.p("cfr-dst"), "write"}},
		},
		{
			name:  "sendfile",
			setup: func() { writeFile(t, s.p("sf-src"), "data"); writeFile(t, s.p("sf-dst"), "") },
			run: py("import os\ns=os.open(%q, os.O_RDONLY)\nd=os.open(%q, os.O_WRONLY)\nos.sendfile(d, s, 0, 4)",
				s.p("sf-src"), s.p("sf-dst")),
			want: []wantOp{{s.p("sf-dst"), "write"}},
		},
		{
			name:  "fallocate",
			setup: func() { writeFile(t, s.p("falloc"), "") },
			run:   py("import os\nfd=os.open(%q, os.O_WRONLY)\nos.posix_fallocate(fd, 0, 4096)", s.p("falloc")),
			want:  []wantOp{{s.p("falloc"), "write"}},
		},
		{
			name: "nested pid namespace counts",
			run:  func() { s.run("unshare", "-p", "-f", "sh", "-c", "echo x > "+s.p("nested.txt")) },
			want: []wantOp{{s.p("nested.txt"), "write"}},
		},
		{
			name: "unix socket bind creates a node",
			run:  py("import socket\ns=socket.socket(socket.AF_UNIX)\ns.bind(%q)", s.p("sock")),
			want: []wantOp{{s.p("sock"), "mknod"}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup()
			}
			c.run()
			eff := s.cut()
			for _, w := range c.want {
				if !slices.Contains(fileOps(eff, w.path), w.op) {
					t.Errorf("want %s on %s; got:\n%s", w.op, w.path, dump(eff))
				}
			}
			for _, f := range eff.Files {
				if f.Path == "?" {
					t.Errorf("unresolved path in effects:\n%s", dump(eff))
				}
				if strings.HasPrefix(f.Path, s.dir) && f.FS != "" && f.FS != "ext4" && f.FS != "btrfs" && f.FS != "tmpfs" && f.FS != "xfs" {
					t.Errorf("%s: unexpected fs %q", f.Path, f.FS)
				}
			}
			if eff.Lost != 0 {
				t.Errorf("lost %d events", eff.Lost)
			}
		})
	}
}

func TestFSType(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil {
		t.Fatal(err)
	}
	s.sh("echo x > " + s.p("fs.txt"))
	eff := s.cut()
	want := fsName(uint32(st.Type))
	for _, f := range eff.Files {
		if f.Path == s.p("fs.txt") {
			if f.FS != want {
				t.Fatalf("fs = %q, want %q", f.FS, want)
			}
			return
		}
	}
	t.Fatalf("no effect on fs.txt:\n%s", dump(eff))
}

func TestReadOnlyCommandsHaveNoFileEffects(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	writeFile(t, s.p("ro.txt"), "hello\nworld\n")
	os.Mkdir(s.p("rodir"), 0o755)
	s.cut()
	s.run("cat", s.p("ro.txt"))
	s.run("ls", "-la", s.dir, s.p("rodir"))
	s.run("grep", "world", s.p("ro.txt"))
	s.run("stat", s.p("ro.txt"))
	s.run("sh", "-c", "cat "+s.p("ro.txt")+" > /dev/null; ls / | wc -l")
	s.py(fmt.Sprintf("import os, json\nprint(len(open(%q).read()))\nos.listdir(%q)\nos.stat(%q)", s.p("ro.txt"), s.dir, s.p("ro.txt")))
	// Opening for write without writing is not a change.
	s.py(fmt.Sprintf("import os\nos.close(os.open(%q, os.O_RDWR))", s.p("ro.txt")))
	eff := s.cut()
	if len(eff.Files) != 0 || len(eff.Unknown) != 0 || eff.Lost != 0 {
		t.Fatalf("read-only commands produced effects:\n%s", dump(eff))
	}
	if len(eff.Processes) == 0 {
		t.Fatalf("no process effects recorded:\n%s", dump(eff))
	}
}

func TestProcessEffects(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	s.allowExit = 3
	s.sh("/bin/true; exit 3")
	s.allowExit = 0
	eff := s.cut()

	var shPid, truePid int
	for _, p := range eff.Processes {
		if p.Op == "exec" && strings.HasSuffix(p.Path, "/sh") || p.Op == "exec" && strings.HasSuffix(p.Path, "/dash") {
			shPid = p.Pid
		}
		if p.Op == "exec" && p.Path == "/usr/bin/true" || p.Op == "exec" && p.Path == "/bin/true" {
			truePid = p.Pid
		}
	}
	if shPid == 0 || truePid == 0 {
		t.Fatalf("missing execs of sh and true:\n%s", dump(eff))
	}
	has := func(op string, pid, ppid int) bool {
		for _, p := range eff.Processes {
			if p.Op == op && p.Pid == pid && (ppid == 0 || p.PPid == ppid) {
				return true
			}
		}
		return false
	}
	if !has("spawn", truePid, shPid) {
		t.Errorf("no spawn of %d by %d:\n%s", truePid, shPid, dump(eff))
	}
	if !has("exit", truePid, 0) || !has("exit", shPid, 0) {
		t.Errorf("missing exits:\n%s", dump(eff))
	}
	for _, p := range eff.Processes {
		if p.Op == "exit" && p.Pid == shPid && p.Code != 3<<8 {
			t.Errorf("sh exit code = %#x, want %#x", p.Code, 3<<8)
		}
	}
	// The order is the order of events: spawn before exec before exit.
	idx := func(op string, pid int) int {
		return slices.IndexFunc(eff.Processes, func(p ProcEffect) bool { return p.Op == op && p.Pid == pid })
	}
	if !(idx("spawn", truePid) < idx("exec", truePid) && idx("exec", truePid) < idx("exit", truePid)) {
		t.Errorf("process events out of order:\n%s", dump(eff))
	}
	if len(eff.Files) != 0 {
		t.Errorf("unexpected file effects:\n%s", dump(eff))
	}
}

func TestSocketEffects(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	out := s.py("import socket\ns=socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\nprint(s.getsockname()[1])")
	port := strings.TrimSpace(out)
	eff := s.cut()
	var bind, listen bool
	for _, so := range eff.Sockets {
		if so.Op == "bind" && so.Family == "inet" && so.Addr == "127.0.0.1:0" {
			bind = true
		}
		if so.Op == "listen" && so.Family == "inet" && so.Addr == "127.0.0.1:"+port {
			listen = true
		}
	}
	if !bind || !listen {
		t.Fatalf("want bind 127.0.0.1:0 and listen 127.0.0.1:%s:\n%s", port, dump(eff))
	}

	// connect + accept over loopback.
	s.py("import socket\nl=socket.socket()\nl.bind(('127.0.0.1', 0))\nl.listen()\n" +
		"c=socket.create_connection(l.getsockname())\na,_=l.accept()")
	eff = s.cut()
	ops := map[string]bool{}
	for _, so := range eff.Sockets {
		ops[so.Op] = true
	}
	for _, op := range []string{"bind", "listen", "connect", "accept"} {
		if !ops[op] {
			t.Errorf("missing %s:\n%s", op, dump(eff))
		}
	}
}

func TestUnknownFlags(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	// A mount in a private mount namespace still raises the flag.
	s.run("unshare", "-m", "sh", "-c", "mount -t tmpfs none "+s.dir)
	eff := s.cut()
	if !slices.Contains(eff.Unknown, "mount") {
		t.Fatalf("want unknown mount:\n%s", dump(eff))
	}
	// Deduplicated within a turn, reported again in the next.
	s.run("unshare", "-m", "sh", "-c", "mount -t tmpfs none "+s.dir+"; mount -t tmpfs none "+s.dir)
	eff = s.cut()
	if n := strings.Count(strings.Join(eff.Unknown, ","), "mount"); n != 1 {
		t.Fatalf("want exactly one mount flag:\n%s", dump(eff))
	}
}

// compatGetpid makes the ia32 getpid syscall (int 0x80) from a 64-bit
// process, in a forked child, and prints the child's exit status: 0 when
// the call returned the child's pid, or the signal that killed it.
const compatGetpid = "import ctypes, mmap, os\n" +
	"pid = os.fork()\n" +
	"if pid == 0:\n" +
	"    code = b'\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\xc3'\n" +
	"    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ|mmap.PROT_WRITE|mmap.PROT_EXEC)\n" +
	"    m.write(code)\n" +
	"    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))\n" +
	"    os._exit(0 if ctypes.CFUNCTYPE(ctypes.c_int)(addr)() == os.getpid() else 1)\n" +
	"_, st = os.waitpid(pid, 0)\n" +
	"print(-os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))\n"

var (
	compatOnce   sync.Once
	compatWorks  bool
	compatReason string
)

// compatSyscalls probes, once and in a child, whether this kernel runs
// ia32 syscalls of 64-bit processes: some machines of molt's kind (a
// kernel running as a paravirtualized guest) raise SIGSEGV on int 0x80
// although CONFIG_IA32_EMULATION=y.
func compatSyscalls(t *testing.T) (bool, string) {
	t.Helper()
	compatOnce.Do(func() {
		out, err := exec.Command(python(t), "-B", "-c", compatGetpid).Output()
		if err != nil {
			compatReason = fmt.Sprintf("probe failed: %v", err)
			return
		}
		switch st := strings.TrimSpace(string(out)); st {
		case "0":
			compatWorks = true
		case "-11":
			compatReason = "int 0x80 raises SIGSEGV in a 64-bit process here"
		default:
			compatReason = "int 0x80 getpid: child status " + st
		}
	})
	if !compatWorks && !strings.HasPrefix(compatReason, "int 0x80") {
		t.Fatalf("compat syscall probe: %s", compatReason)
	}
	return compatWorks, compatReason
}

// A 64-bit process making an ia32 syscall is flagged (the inspector's
// table is for 64-bit calls). Where the kernel does not run such calls
// there is nothing to flag, and the turn's other effects are reported
// as ever.
func TestCompatSyscall(t *testing.T) {
	in := inspector(t)
	works, why := compatSyscalls(t)
	s := newSandbox(t, in)
	s.cut()
	st := strings.TrimSpace(s.py(compatGetpid + fmt.Sprintf("open(%q, 'w').write('after')\n", s.p("after"))))
	eff := s.cut()
	if !slices.Contains(fileOps(eff, s.p("after")), "write") {
		t.Errorf("write after the compat call not reported:\n%s", dump(eff))
	}
	if works {
		if st != "0" {
			t.Fatalf("compat getpid in the sandbox: status %s, want 0", st)
		}
		if !slices.Contains(eff.Unknown, "compat_syscall") {
			t.Fatalf("want compat_syscall:\n%s", dump(eff))
		}
		return
	}
	t.Logf("no compat syscalls on this kernel (%s): checking that nothing is flagged", why)
	if st != "-11" {
		t.Fatalf("compat getpid in the sandbox: status %s, want -11 as the probe saw", st)
	}
	if slices.Contains(eff.Unknown, "compat_syscall") {
		t.Fatalf("compat_syscall flagged for a call the kernel never ran:\n%s", dump(eff))
	}
}

func TestMprotectSharedWrite(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	writeFile(t, s.p("mp.bin"), strings.Repeat("\x00", 4096))
	s.cut()
	// Mapped read-only and shared, then made writable with mprotect.
	s.py(fmt.Sprintf("import ctypes, os\n"+
		"libc = ctypes.CDLL(None, use_errno=True)\n"+
		"libc.mmap.restype = ctypes.c_void_p\n"+
		"libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]\n"+
		"libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]\n"+
		"fd = os.open(%q, os.O_RDWR)\n"+
		"a = libc.mmap(None, 4096, 1, 1, fd, 0)\n"+
		"assert libc.mprotect(a, 4096, 3) == 0\n"+
		"ctypes.memset(a, 120, 1)", s.p("mp.bin")))
	eff := s.cut()
	if !slices.Contains(fileOps(eff, s.p("mp.bin")), "mmap_write") {
		t.Fatalf("want mmap_write from mprotect:\n%s", dump(eff))
	}
}

func TestChrootAndOutsideRoot(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	os.Mkdir(s.p("jail"), 0o755)
	writeFile(t, s.p("outside.txt"), "")
	s.cut()
	s.py(fmt.Sprintf("import os\n"+
		"fd = os.open(%q, os.O_WRONLY)\n"+
		"os.chroot(%q)\n"+
		"os.chdir('/')\n"+
		"os.write(fd, b'x')\n"+
		"open('/in.txt', 'w').write('y')", s.p("outside.txt"), s.p("jail")))
	eff := s.cut()
	// Inside the chroot, paths are relative to the task's (new) root.
	if !slices.Contains(fileOps(eff, "/in.txt"), "write") {
		t.Errorf("want write on /in.txt:\n%s", dump(eff))
	}
	// Outside it: conservative "?" prefix, path from the namespace root.
	if !slices.Contains(fileOps(eff, "?"+s.p("outside.txt")), "write") {
		t.Errorf("want write on ?%s:\n%s", s.p("outside.txt"), dump(eff))
	}
}

func TestAnonymousFilesIgnored(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	s.py(fmt.Sprintf("import os, mmap\n"+
		"fd = os.memfd_create('x')\n"+
		"os.write(fd, b'abc')\n"+
		"os.ftruncate(fd, 4096)\n"+
		"m = mmap.mmap(fd, 4096)\n"+
		"m[0:1] = b'x'\n"+
		"t = os.open(%q, os.O_TMPFILE|os.O_RDWR, 0o600)\n"+
		"os.write(t, b'x')\n"+
		"a = mmap.mmap(-1, 4096, flags=mmap.MAP_SHARED)\n"+
		"a[0:1] = b'x'", s.dir))
	eff := s.cut()
	if len(eff.Files) != 0 || len(eff.Unknown) != 0 {
		t.Fatalf("anonymous files produced effects:\n%s", dump(eff))
	}
}

func TestOutsideProcessesDoNotCount(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()

	// In the watched pid namespace but outside the cgroup.
	s.runIn(0, false, "sh", "-c", "echo x > "+s.p("outside-cgroup"))
	// In the cgroup, host pid namespace (like CRIU).
	runCmd(t, s.cgFD, 0, "sh", "-c", "echo x > "+s.p("host-pidns"))
	// In the cgroup, a sibling pid namespace (like a standby tree).
	runCmd(t, s.cgFD, syscall.CLONE_NEWPID, "sh", "-c", "echo x > "+s.p("sibling-pidns"))
	// Not in any watched cgroup at all.
	if out, err := exec.Command("sh", "-c", "echo x > "+s.p("host")).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	eff := s.cut()
	if len(eff.Files) != 0 || len(eff.Sockets) != 0 || len(eff.Unknown) != 0 {
		t.Fatalf("effects from outside the sandbox tree:\n%s", dump(eff))
	}
	for _, p := range eff.Processes {
		t.Errorf("process effect from outside the sandbox tree: %+v", p)
	}
}

func runCmd(t *testing.T, cgFD *os.File, cloneflags uintptr, args ...string) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgFD.Fd()), Cloneflags: cloneflags}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
}

func TestSetTree(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	old := s.init.Process.Pid
	restored := s.start(true, "sleep", "3600") // a restored tree: same cgroup, new pid ns
	s.cut()

	s.runIn(restored.Process.Pid, true, "sh", "-c", "echo x > "+s.p("before-settree"))
	eff := s.cut()
	if len(eff.Files) != 0 {
		t.Fatalf("standby tree counted before SetTree:\n%s", dump(eff))
	}

	if err := s.w.SetTree(restored.Process.Pid); err != nil {
		t.Fatal(err)
	}
	s.runIn(restored.Process.Pid, true, "sh", "-c", "echo x > "+s.p("new-tree"))
	s.runIn(old, true, "sh", "-c", "echo x > "+s.p("old-tree"))
	eff = s.cut()
	if !slices.Contains(fileOps(eff, s.p("new-tree")), "write") {
		t.Errorf("new tree not recorded:\n%s", dump(eff))
	}
	if fileOps(eff, s.p("old-tree")) != nil {
		t.Errorf("old tree still recorded:\n%s", dump(eff))
	}
}

func TestChildCgroupCounts(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	child, childFD := newCgroup(t, s.cg)
	_ = child
	cmd := exec.Command("nsenter", "-t", strconv.Itoa(s.init.Process.Pid), "-p", "--", "sh", "-c", "echo x > "+s.p("child-cg"))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(childFD.Fd())}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	eff := s.cut()
	if !slices.Contains(fileOps(eff, s.p("child-cg")), "write") {
		t.Fatalf("write from a child cgroup not recorded:\n%s", dump(eff))
	}
}

func TestCutBarrier(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	// A slow reader: without the barrier, Cut would return before the
	// events of the command were dispatched.
	in.testDispatchDelay.Store(int64(200 * time.Microsecond))
	defer in.testDispatchDelay.Store(0)
	for round := 0; round < 5; round++ {
		n := 200
		s.sh(fmt.Sprintf("cd %s && i=0; while [ $i -lt %d ]; do echo $i > b%d-$i; i=$((i+1)); done", s.dir, n, round))
		eff := s.cut() // immediately after the command finished
		for i := 0; i < n; i++ {
			p := s.p(fmt.Sprintf("b%d-%d", round, i))
			if !slices.Contains(fileOps(eff, p), "write") {
				t.Fatalf("round %d: %s missing after Cut (got %d files)", round, p, len(eff.Files))
			}
		}
		if eff.Lost != 0 {
			t.Fatalf("lost %d", eff.Lost)
		}
		// Nothing leaks into the next turn.
		if eff2 := s.cut(); len(eff2.Files) != 0 {
			t.Fatalf("round %d: effects leaked into the next turn:\n%s", round, dump(eff2))
		}
	}
}

func TestWriteDedupAndNextTurn(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	writeFile(t, s.p("many.txt"), "")
	s.cut()
	loop := fmt.Sprintf("import os\nfd=os.open(%q, os.O_WRONLY)\nfor i in range(20000): os.write(fd, b'x')", s.p("many.txt"))
	s.py(loop)
	eff := s.cut()
	if !slices.Contains(fileOps(eff, s.p("many.txt")), "write") || eff.Lost != 0 {
		t.Fatalf("turn 1:\n%s", dump(eff))
	}
	// Same file written again in a later turn: reported again.
	s.py(loop)
	eff = s.cut()
	if !slices.Contains(fileOps(eff, s.p("many.txt")), "write") {
		t.Fatalf("turn 2: write not reported again:\n%s", dump(eff))
	}
}

func TestMappingReportedWhileAlive(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	writeFile(t, s.p("shm.bin"), strings.Repeat("\x00", 4096))
	s.cut()
	// A process keeps a shared writable mapping across turns.
	ready := s.p("ready")
	bg := s.startBg(fmt.Sprintf("import mmap, time\nf=open(%q,'r+b')\nm=mmap.mmap(f.fileno(), 0)\nopen(%q,'w').close()\ntime.sleep(3600)",
		s.p("shm.bin"), ready), ready)
	for turn := 0; turn < 2; turn++ {
		if eff := s.cut(); !slices.Contains(fileOps(eff, s.p("shm.bin")), "mmap_write") {
			t.Fatalf("turn %d: live shared mapping not reported:\n%s", turn, dump(eff))
		}
	}
	stopBg(bg)
	if eff := s.cut(); !slices.Contains(fileOps(eff, s.p("shm.bin")), "mmap_write") {
		t.Fatalf("mapping not reported in the turn its process exited:\n%s", dump(eff))
	}
	if eff := s.cut(); fileOps(eff, s.p("shm.bin")) != nil {
		t.Fatalf("mapping still reported after its process exited:\n%s", dump(eff))
	}
}

// startBg starts python code in the sandbox's live tree and waits until it
// has created the file ready.
func (s *sandbox) startBg(code, ready string) *exec.Cmd {
	s.t.Helper()
	bg := exec.Command("nsenter", "-t", strconv.Itoa(s.init.Process.Pid), "-p", "--", python(s.t), "-B", "-c", code)
	bg.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(s.cgFD.Fd())}
	if err := bg.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { stopBg(bg) })
	for i := 0; ; i++ {
		if _, err := os.Stat(ready); err == nil {
			return bg
		}
		if i > 500 {
			s.t.Fatal("background process did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stopBg kills a process started by startBg: nsenter's child (inside the
// pid namespace) first, as nsenter does not forward signals.
func stopBg(bg *exec.Cmd) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", bg.Process.Pid, bg.Process.Pid)); err == nil {
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	bg.Wait()
}

func TestIOUringFlaggedWhileAlive(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	ready := s.p("ready")
	bg := s.startBg(fmt.Sprintf("import ctypes, time\n"+
		"libc = ctypes.CDLL(None, use_errno=True)\n"+
		"params = ctypes.create_string_buffer(120)\n"+
		"fd = libc.syscall(425, 4, params)\n"+
		"open(%q, 'w').close()\n"+
		"time.sleep(3600)", ready), ready)
	for turn := 0; turn < 2; turn++ {
		if eff := s.cut(); !slices.Contains(eff.Unknown, "io_uring") {
			t.Fatalf("turn %d: want io_uring while the ring lives:\n%s", turn, dump(eff))
		}
	}
	stopBg(bg)
	// It was alive during this turn: still flagged; afterwards not.
	if eff := s.cut(); !slices.Contains(eff.Unknown, "io_uring") {
		t.Fatalf("want io_uring in the turn the holder exited:\n%s", dump(eff))
	}
	if eff := s.cut(); slices.Contains(eff.Unknown, "io_uring") {
		t.Fatalf("io_uring still flagged after its holder exited:\n%s", dump(eff))
	}
}

func TestCloseAndReopenWatch(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	if _, err := in.Watch(s.cg, s.init.Process.Pid); err == nil {
		t.Fatal("second Watch of the same cgroup succeeded")
	}
	s.w.Close()
	if _, err := s.w.Cut(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Cut after Close: %v", err)
	}
	w, err := in.Watch(s.cg, s.init.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s.w = w
	s.sh("echo x > " + s.p("again"))
	if eff := s.cut(); !slices.Contains(fileOps(eff, s.p("again")), "write") {
		t.Fatalf("re-watched cgroup not recorded:\n%s", dump(eff))
	}
}

func TestCutContextCancelKeepsEffects(t *testing.T) {
	in := inspector(t)
	s := newSandbox(t, in)
	s.cut()
	s.sh("echo x > " + s.p("kept"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.w.Cut(ctx); err == nil {
		// The barrier may have completed before the select saw ctx.
		t.Skip("barrier won the race with the cancelled context")
	}
	if eff := s.cut(); !slices.Contains(fileOps(eff, s.p("kept")), "write") {
		t.Fatalf("effects lost by a cancelled Cut:\n%s", dump(eff))
	}
}

// BenchmarkSyscallOverhead compares a tight pwrite loop of the benchmark
// process itself while it sits in an unwatched vs a watched cgroup.
func BenchmarkSyscallOverhead(b *testing.B) {
	if os.Geteuid() != 0 {
		skipOrFail(b, "needs root")
	}
	in := inspector(b)
	orig, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		b.Fatal(err)
	}
	var origCg string
	for _, l := range strings.Split(string(orig), "\n") {
		if strings.HasPrefix(l, "0::") {
			origCg = filepath.Join(cgroup2Root, strings.TrimPrefix(l, "0::"))
		}
	}
	if origCg == "" {
		b.Skip("no cgroup2 membership")
	}
	cg := filepath.Join(cgroup2Root, fmt.Sprintf("molt-inspect-bench-%08x", rand.Uint32()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		b.Fatal(err)
	}
	defer os.Remove(cg)
	move := func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			b.Fatal(err)
		}
	}
	f, err := os.CreateTemp(b.TempDir(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := []byte("x")
	loop := func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := f.WriteAt(buf, 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("unwatched", func(b *testing.B) {
		move(cg)
		defer move(origCg)
		b.ResetTimer()
		loop(b)
	})
	b.Run("watched", func(b *testing.B) {
		w, err := in.Watch(cg, os.Getpid())
		if err != nil {
			b.Fatal(err)
		}
		defer w.Close()
		move(cg)
		defer move(origCg)
		b.ResetTimer()
		loop(b)
		b.StopTimer()
		eff, err := w.Cut(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		if len(eff.Files) == 0 {
			b.Fatal("watched writes not recorded")
		}
	})
}

// bpfLinks counts this process's BPF link descriptors (what keeps
// programs attached), from the kernel's view in /proc/self/fdinfo.
func bpfLinks(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err == nil && strings.Contains(string(b), "link_type:") {
			n++
		}
	}
	return n
}

// TestAttachedOnlyWhileWatched: the programs run on every system call of
// the host, so they are attached only while a watch exists (a sandbox
// without one, or a benchmark's baseline, must not pay for them).
func TestAttachedOnlyWhileWatched(t *testing.T) {
	in := inspector(t)
	if len(in.watches) != 0 {
		t.Fatalf("%d watches left by earlier tests", len(in.watches))
	}
	if n := bpfLinks(t); n != 0 {
		t.Fatalf("%d BPF links with nothing watched, want 0", n)
	}
	s := newSandbox(t, in)
	if n := bpfLinks(t); n != len(in.progs) {
		t.Fatalf("%d BPF links while watching, want %d", n, len(in.progs))
	}
	s.w.Close()
	if n := bpfLinks(t); n != 0 {
		t.Fatalf("%d BPF links after the last watch closed, want 0", n)
	}
	w, err := in.Watch(s.cg, s.init.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s.w = w
	s.sh("echo x > " + s.p("again"))
	if eff := s.cut(); !slices.Contains(fileOps(eff, s.p("again")), "write") {
		t.Fatalf("watched again after a detach, the write was not recorded:\n%s", dump(eff))
	}
}
