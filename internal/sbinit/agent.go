package sbinit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/pid1"
)

// An Agent serves the daemon's requests for one sandbox (exec, sessions,
// status) from the daemon's process: it starts the sandbox's processes
// through the sandbox's pid1, reads the sandbox's files through its
// root, and keeps the daemon's ends of the sessions' pipes, which pid1
// keeps too. Nothing of it is in the sandbox's process tree, so a dump
// of the tree holds pid1, the sessions and what they started, and a new
// Agent (after a restore, or a daemon restart) takes the sessions back
// from pid1's table.
type Agent struct {
	init     *pid1.Client
	netns    *os.File
	hostPid  int      // pid1's PID on the host
	env      []string // pid1's environment: the sandbox's
	hostname string

	mu       sync.Mutex
	sessions map[string]*session // +checklocks:mu
	closed   bool                // +checklocks:mu

	// calls holds Close (which closes netns) until pid1 calls end.
	calls sync.RWMutex
	// Closed, under calls.
	gone bool // +checklocks:calls
}

// errClosed fails a call on a closed agent.
var errClosed = errors.New("the sandbox's agent is closed")

// call runs fn, a call to pid1, unless the agent is closed.
func (a *Agent) call(fn func() error) error {
	a.calls.RLock()
	defer a.calls.RUnlock()
	if a.gone {
		return errClosed
	}
	return fn()
}

// NewAgent returns the Agent of the sandbox whose pid1 has host PID
// hostPid, with the sessions pid1 keeps.
func NewAgent(ctx context.Context, hostPid int) (*Agent, error) {
	a := &Agent{hostPid: hostPid, sessions: map[string]*session{}}
	var err error
	if a.netns, err = os.Open(fmt.Sprintf("/proc/%d/ns/net", hostPid)); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.init = pid1.New(a.netns, PID1Socket, hostPid)
	fail := func(err error) (*Agent, error) {
		a.Close()
		return nil, fmt.Errorf("agent of init %d: %w", hostPid, err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", hostPid))
	if err != nil {
		return fail(err)
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv != "" {
			a.env = append(a.env, kv)
		}
	}
	var uts unix.Utsname
	if err := ns.DoPid(hostPid, unix.CLONE_NEWUTS, func() error { return unix.Uname(&uts) }); err != nil {
		return fail(err)
	}
	a.hostname = unix.ByteSliceToString(uts.Nodename[:])
	var pid int
	if err := a.call(func() (err error) { pid, _, err = a.init.Info(ctx); return err }); err != nil {
		return fail(err)
	} else if pid != 1 {
		return fail(fmt.Errorf("the socket is served by pid %d of the sandbox, not its init", pid))
	}
	if err := a.loadSessions(ctx); err != nil {
		return fail(err)
	}
	return a, nil
}

// Close forgets the agent's sessions (their processes live on in the
// sandbox, and pid1 keeps their pipes) and releases what it holds.
func (a *Agent) Close() {
	a.mu.Lock()
	a.closed = true
	ss := a.sessions
	a.sessions = map[string]*session{}
	a.mu.Unlock()
	for _, s := range ss {
		s.release()
	}
	a.calls.Lock()
	a.gone = true
	if a.netns != nil {
		a.netns.Close()
	}
	a.calls.Unlock()
}

// Serve answers one request on c (the daemon's end of a connection) and
// closes c.
func (a *Agent) Serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	fw := v1.NewFrameWriter(c)
	typ, payload, err := v1.ReadFrame(br)
	if err != nil || typ != v1.FrameRequest {
		return
	}
	var req Request
	if err := json.Unmarshal(payload, &req); err != nil {
		reply(fw, Response{Error: "decode request: " + err.Error(), ErrorKind: v1.ErrKindInvalidArgument})
		return
	}
	switch req.Op {
	case "exec":
		if req.Detach {
			pid, err := a.startDetached(req)
			if err != nil {
				reply(fw, Response{Error: err.Error(), ErrorKind: v1.ErrKindInvalidArgument})
				return
			}
			reply(fw, Response{Pid: pid})
			return
		}
		a.exec(br, fw, req)
	case "session-run":
		reply(fw, a.sessionRun(req))
	case "session-close":
		reply(fw, a.sessionClose(req.Session))
	case "status":
		reply(fw, Response{Pid: 1, Sessions: a.sessionList()})
	default:
		reply(fw, Response{Error: fmt.Sprintf("unknown op %q", req.Op), ErrorKind: v1.ErrKindInvalidArgument})
	}
}

func reply(fw *v1.FrameWriter, r Response) {
	b, _ := json.Marshal(r)
	_ = fw.WriteFrame(v1.FrameResponse, b)
}

// proc is a process the agent started (or took over from pid1's table).
type proc struct {
	pid     int // in the sandbox
	hostPid int
	pidfd   *os.File // pollable: readable once the process exited
	exited  chan struct{}
	status  unix.WaitStatus // valid once exited is closed
}

// newProc watches a process through its pidfd; pid1 reports its status.
func (a *Agent) newProc(pid int, pidfd *os.File) (*proc, error) {
	defer pidfd.Close()
	// 0 once the process is gone (pid1 may have reaped it already).
	hostPid, err := pidfdPid(pidfd)
	if err != nil {
		return nil, err
	}
	// A non-blocking copy, which the runtime poller waits on.
	fd, err := unix.FcntlInt(pidfd.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	p := &proc{pid: pid, hostPid: hostPid, pidfd: f, exited: make(chan struct{})}
	go func() {
		defer close(p.exited)
		if rc, err := f.SyscallConn(); err == nil {
			_ = rc.Read(func(fd uintptr) bool {
				n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
				return n > 0
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var st pid1.State
		var ws unix.WaitStatus
		var err error
		// The pidfd is readable once the process is a zombie, which can
		// be before pid1 has reaped it: until then pid1 says running
		// (the status was "unknown", 255, under load).
		for wait := 100 * time.Microsecond; ; wait = min(2*wait, 10*time.Millisecond) {
			err = a.call(func() (err error) { st, ws, err = a.init.Status(ctx, pid); return err })
			if err != nil || st != pid1.Running || ctx.Err() != nil {
				break
			}
			time.Sleep(wait)
		}
		if err == nil && st == pid1.Exited {
			p.status = ws
		} else {
			p.status = unix.WaitStatus(0xff << 8) // 255: unknown
		}
	}()
	return p, nil
}

// signal sends sig to the process (group: to its process group).
func (p *proc) signal(sig unix.Signal, group bool) {
	select {
	case <-p.exited:
		return // its PID may be another process's now
	default:
	}
	if group && p.hostPid > 0 {
		// Through the leader's pidfd (kernels from 6.9): the group
		// number cannot have been reused by then.
		err := unix.PidfdSendSignal(int(p.pidfd.Fd()), sig, nil, unix.PIDFD_SIGNAL_PROCESS_GROUP)
		if errors.Is(err, unix.EINVAL) {
			_ = unix.Kill(-p.hostPid, sig)
		}
		return
	}
	_ = unix.PidfdSendSignal(int(p.pidfd.Fd()), sig, nil, 0)
}

// pidfdPid returns the host PID of a pidfd's process.
func pidfdPid(f *os.File) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", f.Fd()))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("pidfd: bad Pid in fdinfo: %q", v)
			}
			return max(n, 0), nil // -1: the process was reaped
		}
	}
	return 0, fmt.Errorf("pidfd: no Pid in fdinfo")
}

// spawn starts ps through pid1 with files as descriptors 0, 1, ... (nil:
// the sandbox's /dev/null); keep, if any, is kept by pid1 under tag.
func (a *Agent) spawn(ps procSpec, files, keep []*os.File, tag string) (*proc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pid int
	var pidfd *os.File
	err := a.call(func() (err error) {
		pid, pidfd, err = a.init.Spawn(ctx, pid1.Spawn{
			Path: ps.path, Args: ps.argv, Env: ps.env, Dir: ps.dir,
			UID: ps.uid, GID: ps.gid, Groups: ps.groups,
			Setsid: true, Watch: true, Files: files, Keep: keep, Tag: tag,
		})
		return err
	})
	if err != nil {
		var e *pid1.Error
		if errors.As(err, &e) && e.Stage == "exec" {
			switch e.Errno {
			case unix.ENOENT, unix.ENOTDIR:
				return nil, fmt.Errorf("%s: %w", ps.path, errNotFound)
			case unix.EACCES, unix.EISDIR:
				return nil, fmt.Errorf("%s: %w", ps.path, errNoPerm)
			}
		}
		if errors.As(err, &e) && e.Stage == "chdir" {
			return nil, fmt.Errorf("working directory %s: %v", ps.dir, e.Errno)
		}
		return nil, err
	}
	if pidfd == nil {
		return nil, fmt.Errorf("pid1 spawn: no pidfd for %d", pid)
	}
	return a.newProc(pid, pidfd)
}

// killChild SIGKILLs child if it is still parent's child: it is pinned
// with a pidfd first, so a number that exited and was reused by another
// process (the host's too: numbers are allocated host-wide) after the
// children list was read is not signalled.
func killChild(parent, child int) {
	fd, err := unix.PidfdOpen(child, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
	if err != nil {
		return
	}
	i := strings.LastIndexByte(string(b), ')')
	if f := strings.Fields(string(b[i+1:])); i < 0 || len(f) < 2 || f[1] != strconv.Itoa(parent) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// killBelow SIGKILLs every descendant of host process pid (not pid).
func killBelow(pid int) {
	if pid <= 0 {
		return
	}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				killChild(pid, c)
				killBelow(c)
			}
		}
	}
}

// procSpec is a resolved command: program (a path, or a name pid1 looks
// up in the environment's PATH), argv, environment, directory and
// credentials.
type procSpec struct {
	path     string
	argv     []string
	env      []string
	dir      string
	uid, gid uint32
	groups   []uint32
}

func (a *Agent) resolve(req Request) (procSpec, error) {
	if len(req.Args) == 0 {
		return procSpec{}, errors.New("no command")
	}
	u, err := a.lookupUser(req.User)
	if err != nil {
		return procSpec{}, err
	}
	env := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": u.home, "USER": u.name, "LOGNAME": u.name,
		"LANG": "C.UTF-8", "TERM": "xterm", "HOSTNAME": a.hostname,
	}
	for _, kv := range a.env {
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
		if !a.isDir(dir) {
			dir = "/"
		}
	}
	return procSpec{path: req.Args[0], argv: req.Args, env: envv, dir: dir, uid: u.uid, gid: u.gid, groups: u.groups}, nil
}

// errNotFound and errNoPerm map to the shell's exit codes 127 and 126.
var (
	errNotFound = errors.New("executable file not found in $PATH")
	errNoPerm   = errors.New("permission denied")
)

// openIn opens path inside the sandbox's root: symlinks resolve as they
// would inside the sandbox, never to a host path. The root is opened for
// each call: a descriptor of it kept open would pin the sandbox's mounts
// (and the pool) after the sandbox is gone.
func (a *Agent) openIn(path string, flags uint64) (*os.File, error) {
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", a.hostPid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, strings.TrimLeft(path, "/"), &unix.OpenHow{
		Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

func (a *Agent) readFile(path string) ([]byte, error) {
	f, err := a.openIn(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 16<<20))
}

func (a *Agent) isDir(path string) bool {
	f, err := a.openIn(path, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

type user struct {
	name     string
	uid, gid uint32
	home     string
	groups   []uint32
}

// lookupUser resolves "", a name, "uid" or "uid:gid" against the
// sandbox's /etc/passwd and /etc/group.
func (a *Agent) lookupUser(spec string) (user, error) {
	if spec == "" || spec == "root" || spec == "0" {
		return user{name: "root", home: "/root", groups: []uint32{}}, nil
	}
	name, grp, hasGrp := strings.Cut(spec, ":")
	u := user{home: "/"}
	found := false
	if b, err := a.readFile("/etc/passwd"); err == nil {
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
	groups, _ := a.readFile("/etc/group")
	if hasGrp {
		gid, err := strconv.ParseUint(grp, 10, 32)
		if err != nil {
			// A group name, as an OCI image's User may give.
			gid, err = groupID(groups, grp)
			if err != nil {
				return user{}, err
			}
		}
		u.gid = uint32(gid)
	}
	if b := groups; b != nil {
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

// groupID finds the group name in the contents of /etc/group.
func groupID(groups []byte, name string) (uint64, error) {
	for _, l := range strings.Split(string(groups), "\n") {
		f := strings.Split(l, ":")
		if len(f) >= 3 && f[0] == name {
			if g, err := strconv.ParseUint(f[2], 10, 32); err == nil {
				return g, nil
			}
		}
	}
	return 0, fmt.Errorf("unknown group %q", name)
}

func (a *Agent) startDetached(req Request) (int, error) {
	ps, err := a.resolve(req)
	if err != nil {
		return 0, err
	}
	p, err := a.spawn(ps, []*os.File{nil, nil, nil}, nil, "")
	if err != nil {
		return 0, err
	}
	// Nobody waits for it; pid1 reaps it, and the watcher ends with it.
	return p.pid, nil
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

// exec runs req's command with its output relayed as frames on fw and
// its input and signals read from br, then writes its exit status.
func (a *Agent) exec(br *bufio.Reader, fw *v1.FrameWriter, req Request) {
	ps, err := a.resolve(req)
	if err != nil {
		execFail(fw, 126, "exec: "+err.Error())
		return
	}
	files, parents, err := execPipes(req.Stdin)
	if err != nil {
		execFail(fw, 126, "exec: "+err.Error())
		return
	}
	p, err := a.spawn(ps, files[:], nil, "")
	closeFiles(files[:])
	if err != nil {
		closeFiles(parents[:])
		code := 126
		if errors.Is(err, errNotFound) {
			code = 127
		}
		execFail(fw, code, "exec: "+err.Error())
		return
	}
	defer p.pidfd.Close()
	_ = fw.WriteFrame(v1.FrameStarted, []byte(strconv.Itoa(p.pid)))

	var wg sync.WaitGroup
	for i, typ := range []byte{v1.FrameStdout, v1.FrameStderr} {
		r := parents[i+1]
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(v1.StreamWriter{FW: fw, Type: typ}, r)
		}()
	}
	var reaped atomic.Bool
	go relayInput(br, p, parents[0], &reaped)
	timedOut := waitExec(p, req.TimeoutMS, &reaped)
	drainOutput(&wg, parents[1], parents[2])
	b, _ := json.Marshal(execStatus(p.status, timedOut))
	_ = fw.WriteFrame(v1.FrameExit, b)
}

// execFail reports a command that could not start: msg on stderr, then
// exit status code.
func execFail(fw *v1.FrameWriter, code int, msg string) {
	_ = fw.WriteFrame(v1.FrameStderr, []byte("molt: "+msg+"\n"))
	b, _ := json.Marshal(v1.ExitStatus{ExitCode: code})
	_ = fw.WriteFrame(v1.FrameExit, b)
}

// execPipes makes the command's stdio pipes: files are the child's ends
// (nil: /dev/null; stdin is one without wantStdin), parents the agent's.
// On error nothing stays open.
func execPipes(wantStdin bool) (files, parents [3]*os.File, err error) {
	if wantStdin {
		parents[0], files[0], err = pipe(false)
	}
	if err == nil {
		parents[1], files[1], err = pipe(true)
	}
	if err == nil {
		parents[2], files[2], err = pipe(true)
	}
	if err != nil {
		closeFiles(files[:])
		closeFiles(parents[:])
	}
	return files, parents, err
}

// closeFiles closes the files that are not nil.
func closeFiles(fs []*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// relayInput reads the daemon's frames for a running command: stdin
// (into stdin, nil without), its close, and signals. A broken connection
// means the caller is gone: the command is killed unless reaped.
func relayInput(br *bufio.Reader, p *proc, stdin *os.File, reaped *atomic.Bool) {
	defer func() {
		if stdin != nil {
			stdin.Close()
		}
	}()
	for {
		typ, payload, err := v1.ReadFrame(br)
		if err != nil {
			if !reaped.Load() {
				p.signal(unix.SIGKILL, true)
				p.signal(unix.SIGKILL, false)
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
				p.signal(unix.Signal(n), true)
			}
		}
	}
}

// waitExec waits for the command to exit, killing it (and its process
// group) when timeoutMS (0: none) runs out, and reports whether it did.
func waitExec(p *proc, timeoutMS int64, reaped *atomic.Bool) (timedOut bool) {
	var timeout <-chan time.Time
	if timeoutMS > 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	for done := false; !done; {
		select {
		case <-p.exited:
			reaped.Store(true)
			done = true
		case <-timeout:
			timedOut = true
			timeout = nil
			p.signal(unix.SIGKILL, true)
			p.signal(unix.SIGKILL, false)
		}
	}
	return timedOut
}

// drainOutput waits for the output relays to finish, at most outputGrace
// once the command has exited, and closes the agent's output ends.
func drainOutput(wg *sync.WaitGroup, stdout, stderr *os.File) {
	outDone := make(chan struct{})
	go func() { wg.Wait(); close(outDone) }()
	select {
	case <-outDone:
	case <-time.After(outputGrace):
		stdout.SetReadDeadline(time.Now())
		stderr.SetReadDeadline(time.Now())
		<-outDone
	}
	stdout.Close()
	stderr.Close()
}

// execStatus is the exit status the daemon gets: 128+N for a signal,
// 124 after a timeout.
func execStatus(ws unix.WaitStatus, timedOut bool) v1.ExitStatus {
	st := v1.ExitStatus{ExitCode: ws.ExitStatus(), TimedOut: timedOut}
	if ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = unix.SignalName(ws.Signal())
	}
	if timedOut {
		st.ExitCode = 124
	}
	return st
}
