package sbinit

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"golang.org/x/sys/unix"
)

// Stage2 is PID 1 of the sandbox. It never returns.
func Stage2() {
	// Init's memory is dumped with every full checkpoint, and every page
	// it dirties between two checkpoints is stored again. One P keeps the
	// runtime's per-P caches and threads to one set.
	runtime.GOMAXPROCS(1)
	s := &server{reaper: newReaper(), sessions: map[string]*session{}}
	go s.reaper.loop()
	ln, err := net.Listen("unix", SocketName)
	syncf := os.NewFile(syncFD, "sync")
	if err != nil {
		fmt.Fprintf(syncf, "error: listen %s: %v\n", SocketName, err)
		os.Exit(1)
	}
	fmt.Fprintf(syncf, "ok\n")
	syncf.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.serve(c)
	}
}

type server struct {
	reaper *reaper

	mu       sync.Mutex
	sessions map[string]*session
}

func (s *server) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	fw := v1.NewFrameWriter(c)
	typ, payload, err := v1.ReadFrame(br)
	if err != nil || typ != v1.FrameRequest {
		return
	}
	var req Request
	if err := json.Unmarshal(payload, &req); err != nil {
		reply(fw, Response{Error: "decode request: " + err.Error(), ErrorKind: "invalid_argument"})
		return
	}
	switch req.Op {
	case "exec":
		if req.Detach {
			pid, err := s.startDetached(req)
			if err != nil {
				reply(fw, Response{Error: err.Error(), ErrorKind: "invalid_argument"})
				return
			}
			reply(fw, Response{Pid: pid})
			return
		}
		s.exec(br, fw, req)
	case "session-run":
		reply(fw, s.sessionRun(req))
	case "session-close":
		reply(fw, s.sessionClose(req.Session))
	case "status":
		reply(fw, Response{Pid: os.Getpid(), Sessions: s.sessionList()})
	default:
		reply(fw, Response{Error: fmt.Sprintf("unknown op %q", req.Op), ErrorKind: "invalid_argument"})
	}
}

func reply(fw *v1.FrameWriter, r Response) {
	b, _ := json.Marshal(r)
	_ = fw.WriteFrame(v1.FrameResponse, b)
}

// reaper reaps every child of PID 1 and hands exit statuses to the
// goroutines waiting for the processes they started. start registers the
// waiter under the same lock that dispatch takes, so a child that exits
// at once is never lost.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
}

func newReaper() *reaper { return &reaper{waiters: map[int]chan unix.WaitStatus{}} }

func (r *reaper) start(argv0 string, argv []string, attr *syscall.ProcAttr, wait bool) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	if !wait {
		return pid, nil, nil
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) loop() {
	// Each SIGCHLD (signals coalesce, so one may stand for several
	// exits) drains every exited child. No timer: a sleeping init
	// dirties no memory between checkpoints.
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGCHLD)
	for range sigs {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			r.mu.Lock()
			if ch, ok := r.waiters[pid]; ok {
				ch <- ws
				delete(r.waiters, pid)
			}
			r.mu.Unlock()
		}
	}
}

// procSpec is a resolved command: path, argv, environment, directory and
// credentials.
type procSpec struct {
	path string
	argv []string
	env  []string
	dir  string
	cred *syscall.Credential
}

func resolve(req Request) (procSpec, error) {
	if len(req.Args) == 0 {
		return procSpec{}, errors.New("no command")
	}
	u, err := lookupUser(req.User)
	if err != nil {
		return procSpec{}, err
	}
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": u.home, "USER": u.name, "LOGNAME": u.name,
		"LANG": "C.UTF-8", "TERM": "xterm",
	}
	if h, err := os.Hostname(); err == nil {
		env["HOSTNAME"] = h
	}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for k, v := range req.Env {
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	envv := make([]string, 0, len(keys))
	for _, k := range keys {
		envv = append(envv, k+"="+env[k])
	}
	dir := req.Cwd
	if dir == "" {
		dir = u.home
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			dir = "/"
		}
	}
	path, err := lookPath(req.Args[0], env["PATH"])
	if err != nil {
		return procSpec{}, err
	}
	ps := procSpec{path: path, argv: req.Args, env: envv, dir: dir}
	if u.uid != 0 || u.gid != 0 {
		ps.cred = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	return ps, nil
}

// errNotFound and errNoPerm map to the shell's exit codes 127 and 126.
var (
	errNotFound = errors.New("executable file not found in $PATH")
	errNoPerm   = errors.New("permission denied")
)

func lookPath(name, path string) (string, error) {
	check := func(p string) error {
		fi, err := os.Stat(p)
		if err != nil {
			return errNotFound
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return errNoPerm
		}
		return nil
	}
	if strings.Contains(name, "/") {
		if err := check(name); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		return name, nil
	}
	firstErr := errNotFound
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		err := check(p)
		if err == nil {
			return p, nil
		}
		if err == errNoPerm {
			firstErr = err
		}
	}
	return "", fmt.Errorf("%s: %w", name, firstErr)
}

type user struct {
	name     string
	uid, gid uint32
	home     string
	groups   []uint32
}

// lookupUser resolves "", a name, "uid" or "uid:gid" against the
// sandbox's /etc/passwd and /etc/group.
func lookupUser(spec string) (user, error) {
	if spec == "" || spec == "root" || spec == "0" {
		return user{name: "root", home: "/root"}, nil
	}
	name, grp, hasGrp := strings.Cut(spec, ":")
	u := user{home: "/"}
	found := false
	if b, err := os.ReadFile("/etc/passwd"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Split(l, ":")
			if len(f) < 7 || (f[0] != name && f[2] != name) {
				continue
			}
			uid, _ := strconv.ParseUint(f[2], 10, 32)
			gid, _ := strconv.ParseUint(f[3], 10, 32)
			u = user{name: f[0], uid: uint32(uid), gid: uint32(gid), home: f[5]}
			found = true
			break
		}
	}
	if !found {
		uid, err := strconv.ParseUint(name, 10, 32)
		if err != nil {
			return user{}, fmt.Errorf("unknown user %q", name)
		}
		u = user{name: name, uid: uint32(uid), gid: uint32(uid), home: "/"}
	}
	if hasGrp {
		gid, err := strconv.ParseUint(grp, 10, 32)
		if err != nil {
			return user{}, fmt.Errorf("bad group %q: want a number", grp)
		}
		u.gid = uint32(gid)
	}
	if b, err := os.ReadFile("/etc/group"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Split(l, ":")
			if len(f) < 4 {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == u.name {
					if g, err := strconv.ParseUint(f[2], 10, 32); err == nil {
						u.groups = append(u.groups, uint32(g))
					}
				}
			}
		}
	}
	if u.groups == nil {
		u.groups = []uint32{}
	}
	return u, nil
}

func devNull() (*os.File, error) { return os.OpenFile("/dev/null", os.O_RDWR, 0) }

func (s *server) startDetached(req Request) (int, error) {
	ps, err := resolve(req)
	if err != nil {
		return 0, err
	}
	null, err := devNull()
	if err != nil {
		return 0, err
	}
	defer null.Close()
	fd := null.Fd()
	pid, _, err := s.reaper.start(ps.path, ps.argv, &syscall.ProcAttr{
		Dir: ps.dir, Env: ps.env, Files: []uintptr{fd, fd, fd},
		Sys: &syscall.SysProcAttr{Setsid: true, Credential: ps.cred},
	}, false)
	return pid, err
}

// pipe returns a pipe whose parent end is non-blocking (so reads honour
// deadlines and close) and whose child end is a plain blocking fd.
func pipe(parentReads bool) (parent, child *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	pr, cw := p[0], p[1]
	if !parentReads {
		pr, cw = p[1], p[0]
	}
	if err := unix.SetNonblock(pr, true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(pr), "pipe"), os.NewFile(uintptr(cw), "pipe"), nil
}

// outputGrace is how long exec keeps relaying output after the command
// exited: a background grandchild may hold the pipe open forever.
const outputGrace = 250 * time.Millisecond

func (s *server) exec(br *bufio.Reader, fw *v1.FrameWriter, req Request) {
	fail := func(code int, msg string) {
		_ = fw.WriteFrame(v1.FrameStderr, []byte("molt: "+msg+"\n"))
		b, _ := json.Marshal(v1.ExitStatus{ExitCode: code})
		_ = fw.WriteFrame(v1.FrameExit, b)
	}
	ps, err := resolve(req)
	if err != nil {
		code := 126
		if errors.Is(err, errNotFound) {
			code = 127
		}
		fail(code, "exec: "+err.Error())
		return
	}
	var files [3]*os.File
	var parents [3]*os.File
	closeAll := func() {
		for i := range files {
			if files[i] != nil {
				files[i].Close()
			}
		}
	}
	if req.Stdin {
		parents[0], files[0], err = pipe(false)
	} else {
		files[0], err = devNull()
	}
	if err == nil {
		parents[1], files[1], err = pipe(true)
	}
	if err == nil {
		parents[2], files[2], err = pipe(true)
	}
	if err != nil {
		closeAll()
		fail(126, "exec: "+err.Error())
		return
	}
	pid, waitc, err := s.reaper.start(ps.path, ps.argv, &syscall.ProcAttr{
		Dir: ps.dir, Env: ps.env, Files: []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()},
		Sys: &syscall.SysProcAttr{Setsid: true, Credential: ps.cred},
	}, true)
	closeAll()
	if err != nil {
		for _, p := range parents {
			if p != nil {
				p.Close()
			}
		}
		fail(126, fmt.Sprintf("exec %s: %v", ps.path, err))
		return
	}
	_ = fw.WriteFrame(v1.FrameStarted, []byte(strconv.Itoa(pid)))

	var wg sync.WaitGroup
	for i, typ := range []byte{v1.FrameStdout, v1.FrameStderr} {
		r := parents[i+1]
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(v1.StreamWriter{FW: fw, Type: typ}, r)
		}()
	}
	// Frames from the daemon: stdin, signals. A broken connection means
	// the caller is gone: the command is killed, unless it was already
	// reaped (its PID may then belong to another process).
	var reaped atomic.Bool
	go func() {
		stdin := parents[0]
		defer func() {
			if stdin != nil {
				stdin.Close()
			}
		}()
		for {
			typ, payload, err := v1.ReadFrame(br)
			if err != nil {
				if !reaped.Load() {
					_ = unix.Kill(-pid, unix.SIGKILL)
					_ = unix.Kill(pid, unix.SIGKILL)
				}
				return
			}
			switch typ {
			case v1.FrameStdin:
				if stdin != nil {
					if _, err := stdin.Write(payload); err != nil {
						stdin.Close()
						stdin = nil
					}
				}
			case v1.FrameStdinClose:
				if stdin != nil {
					stdin.Close()
					stdin = nil
				}
			case v1.FrameSignal:
				if n, err := strconv.Atoi(string(payload)); err == nil && n > 0 && n < 65 && !reaped.Load() {
					_ = unix.Kill(-pid, unix.Signal(n))
				}
			}
		}
	}()

	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	var ws unix.WaitStatus
	for done := false; !done; {
		select {
		case ws = <-waitc:
			reaped.Store(true)
			done = true
		case <-timeout:
			timedOut = true
			timeout = nil
			_ = unix.Kill(-pid, unix.SIGKILL)
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
	outDone := make(chan struct{})
	go func() { wg.Wait(); close(outDone) }()
	select {
	case <-outDone:
	case <-time.After(outputGrace):
		parents[1].SetReadDeadline(time.Now())
		parents[2].SetReadDeadline(time.Now())
		<-outDone
	}
	parents[1].Close()
	parents[2].Close()
	st := v1.ExitStatus{ExitCode: ws.ExitStatus(), TimedOut: timedOut}
	if ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = unix.SignalName(ws.Signal())
	}
	if timedOut {
		st.ExitCode = 124
	}
	b, _ := json.Marshal(st)
	_ = fw.WriteFrame(v1.FrameExit, b)
}
