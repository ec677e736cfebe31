package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/sbinit"
	"golang.org/x/sys/unix"
)

// Init identifies a sandbox's running init process.
type Init struct {
	Pid   int    `json:"pid"`
	Start uint64 `json:"start"` // field 22 of /proc/PID/stat
}

// Launcher starts sandbox inits from a host binary that contains molt's
// init stages (the molt binary itself).
type Launcher struct {
	// Binary is the host path of the binary run as stage 1.
	Binary string
}

// StartTimeout bounds how long init may take to come up.
const StartTimeout = 30 * time.Second

// Start launches init for the sandbox whose root is root. Before init
// runs any setup it is placed into the cgroup by join (called with its
// host PID). On any failure the process is killed and reaped.
func (l *Launcher) Start(ctx context.Context, root string, cfg sbinit.Config, join func(pid int) error) (Init, error) {
	return l.StartIn(ctx, root, cfg, join, IDRange{})
}

// StartIn is Start with a user namespace mapping root inside to ids (none
// for the zero range). The namespace's maps are written before init runs;
// the root is mounted idmapped through that namespace, so the image's
// files (owned by host uid 0) belong to root inside, and stay owned by
// host uid 0 on disk whatever range a fork of them gets.
func (l *Launcher) StartIn(ctx context.Context, root string, cfg sbinit.Config, join func(pid int) error, ids IDRange) (Init, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return Init{}, fmt.Errorf("start init: %w", err)
	}
	parent := os.NewFile(uintptr(fds[0]), "sync")
	child := os.NewFile(uintptr(fds[1]), "sync-child")
	defer parent.Close()

	bin := l.Binary
	if ids.Enabled() {
		bin = execPath(bin)
	}
	cmd := exec.Command(bin, sbinit.Arg1)
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{child}
	cmd.SysProcAttr = &unix.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
		Setsid:     true,
	}
	if ids.Enabled() {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = ids.uidMap()
		cmd.SysProcAttr.GidMappings = ids.uidMap()
		cmd.SysProcAttr.GidMappingsEnableSetgroups = true
		// Become the namespace's root: host uid 0 is not mapped in it,
		// and an unmapped uid executes stage 1 without capabilities.
		cmd.SysProcAttr.Credential = &syscall.Credential{}
	}
	// Started from the parent namespace ns keeps, so that the sandbox's
	// network namespace gets socket tables of its own, small ones.
	if err := ns.InNetParent(cmd.Start); err != nil {
		child.Close()
		return Init{}, fmt.Errorf("start init: %w", err)
	}
	child.Close()
	pid := cmd.Process.Pid
	// The daemon reaps the init it started; after a daemon restart the
	// host's init does.
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	fail := func(err error) (Init, error) {
		_ = cmd.Process.Kill()
		<-exited
		return Init{}, err
	}
	if err := join(pid); err != nil {
		return fail(fmt.Errorf("start init: join cgroup: %w", err))
	}
	cfg.Root = root
	mnt := -1
	if ids.Enabled() {
		us, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
		if err != nil {
			return fail(fmt.Errorf("start init: %w", err))
		}
		mnt, err = IDMappedTree(root, us)
		us.Close()
		if err != nil {
			return fail(fmt.Errorf("start init: %w", err))
		}
		defer unix.Close(mnt)
		cfg.RootMount = true
	}
	b, _ := json.Marshal(cfg)
	if err := sendConfig(parent, append(b, '\n'), mnt); err != nil {
		return fail(fmt.Errorf("start init: send config: %w", err))
	}
	deadline := time.Now().Add(StartTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = parent.SetReadDeadline(deadline)
	line, err := bufio.NewReader(parent).ReadString('\n')
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
	case strings.HasPrefix(line, "error: "):
		return fail(fmt.Errorf("sandbox init: %s", strings.TrimPrefix(line, "error: ")))
	default:
		return fail(fmt.Errorf("sandbox init did not start: %v", err))
	}
	start, err := procStart(pid)
	if err != nil {
		return fail(fmt.Errorf("start init: %w", err))
	}
	return Init{Pid: pid, Start: start}, nil
}

// procStart reads the start time of pid (clock ticks since boot); a
// process that has exited (a zombie not yet reaped) is an error.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); start time is field 22.
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// InitOf identifies the running process pid as a sandbox init (after a
// restore, where CRIU, not the Launcher, started it).
func InitOf(pid int) (Init, error) {
	start, err := procStart(pid)
	if err != nil {
		return Init{}, err
	}
	return Init{Pid: pid, Start: start}, nil
}

// Alive reports whether the init process still runs.
func (i Init) Alive() bool {
	if i.Pid <= 0 {
		return false
	}
	st, err := procStart(i.Pid)
	return err == nil && st == i.Start
}

// Signal sends sig to the init through a pidfd, checked against the
// init's start time once opened: a recorded PID that another process took
// over after the init exited (on the host, after a daemon restart) is
// never signalled. It returns ESRCH when the init is gone.
func (i Init) Signal(sig unix.Signal) error {
	if i.Pid <= 0 {
		return unix.ESRCH
	}
	fd, err := unix.PidfdOpen(i.Pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if st, err := procStart(i.Pid); err != nil || st != i.Start {
		return unix.ESRCH
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0)
}

// Dial opens a connection to the sandbox's init: one request (see
// sbinit.Request) per connection. The requests are served in this
// process, by the sandbox's sbinit.Agent, which starts processes through
// the sandbox's pid1; the Go init of a sandbox started before pid1 (or
// restored from its checkpoints) serves them itself, on its socket.
func (i Init) Dial(ctx context.Context) (net.Conn, error) {
	if !i.Alive() {
		return nil, fmt.Errorf("sandbox init (pid %d) is not running: %w", i.Pid, errdefs.ErrFailedPrecondition)
	}
	if i.legacy() {
		return i.dialLegacy(ctx)
	}
	a, err := agentOf(ctx, i)
	if err != nil {
		return nil, fmt.Errorf("dial init: %w", err)
	}
	client, server := net.Pipe()
	go a.Serve(server)
	if d, ok := ctx.Deadline(); ok {
		_ = client.SetDeadline(d)
	}
	return client, nil
}

// legacy reports whether the init is molt's former Go init.
func (i Init) legacy() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(i.Pid) + "/cmdline")
	if err != nil {
		return false
	}
	args := strings.Split(string(b), "\x00")
	return len(args) > 1 && args[1] == sbinit.Arg2
}

// The agents of the running sandboxes, by init. An agent whose init is
// gone is dropped by the next lookup at least a second after the last
// sweep (or by Forget).
var agents struct {
	mu    sync.Mutex
	m     map[Init]*agentEntry // +checklocks:mu
	swept time.Time            // +checklocks:mu
}

type agentEntry struct {
	once sync.Once
	a    *sbinit.Agent
	err  error
}

func agentOf(ctx context.Context, i Init) (*sbinit.Agent, error) {
	agents.mu.Lock()
	if agents.m == nil {
		agents.m = map[Init]*agentEntry{}
	}
	if time.Since(agents.swept) > time.Second {
		agents.swept = time.Now()
		for k, e := range agents.m {
			if k != i && !k.Alive() {
				delete(agents.m, k)
				go e.close()
			}
		}
	}
	e := agents.m[i]
	if e == nil {
		e = &agentEntry{}
		agents.m[i] = e
	}
	agents.mu.Unlock()
	e.once.Do(func() { e.a, e.err = sbinit.NewAgent(ctx, i.Pid) })
	if e.err != nil {
		agents.mu.Lock()
		if agents.m[i] == e {
			delete(agents.m, i)
		}
		agents.mu.Unlock()
		return nil, e.err
	}
	return e.a, nil
}

func (e *agentEntry) close() {
	e.once.Do(func() {}) // a lookup still creating it finishes first
	if e.a != nil {
		e.a.Close()
	}
}

// Held reports whether this process keeps an agent for i.
func Held(i Init) bool {
	agents.mu.Lock()
	defer agents.mu.Unlock()
	_, ok := agents.m[i]
	return ok
}

// Forget drops the agent of an init that was stopped or replaced.
func Forget(i Init) {
	agents.mu.Lock()
	e := agents.m[i]
	delete(agents.m, i)
	agents.mu.Unlock()
	if e != nil {
		e.close()
	}
}

// dialLegacy connects to a Go init's socket in the sandbox's network
// namespace and checks that the listener is init itself, not a process
// of the sandbox that took the name.
func (i Init) dialLegacy(ctx context.Context) (net.Conn, error) {
	fd, err := socketInNetns(i.Pid)
	if err != nil {
		return nil, fmt.Errorf("dial init: %w", err)
	}
	sa := &unix.SockaddrUnix{Name: sbinit.LegacySocket}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("dial init: connect: %w", err)
	}
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil || int(cred.Pid) != i.Pid {
		unix.Close(fd)
		return nil, fmt.Errorf("dial init: socket is not served by init (pid %d): %w", i.Pid, errdefs.ErrUnavailable)
	}
	f := os.NewFile(uintptr(fd), "init")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("dial init: %w", err)
	}
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	return c, nil
}

// socketInNetns creates a unix socket in the network namespace of pid:
// an abstract socket name is resolved in the namespace the socket was
// created in.
func socketInNetns(pid int) (int, error) {
	fd := -1
	err := ns.DoPid(pid, unix.CLONE_NEWNET, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
		fd = -1
	}
	return fd, err
}

// Call sends one non-streaming request to init and returns its response.
func (i Init) Call(ctx context.Context, req sbinit.Request) (sbinit.Response, error) {
	c, err := i.Dial(ctx)
	if err != nil {
		return sbinit.Response{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := SendRequest(c, req); err != nil {
		return sbinit.Response{}, err
	}
	typ, payload, err := v1.ReadFrame(c)
	if err != nil {
		if ctx.Err() != nil {
			return sbinit.Response{}, ctx.Err()
		}
		return sbinit.Response{}, fmt.Errorf("init %s: %w", req.Op, err)
	}
	if typ != v1.FrameResponse {
		return sbinit.Response{}, fmt.Errorf("init %s: unexpected frame %q", req.Op, typ)
	}
	var resp sbinit.Response
	if err := json.Unmarshal(payload, &resp); err != nil {
		return sbinit.Response{}, fmt.Errorf("init %s: %w", req.Op, err)
	}
	if resp.Error != "" {
		kind := errdefs.ErrFailedPrecondition
		switch resp.ErrorKind {
		case v1.ErrKindNotFound:
			kind = errdefs.ErrNotFound
		case v1.ErrKindInvalidArgument:
			kind = errdefs.ErrInvalidArgument
		case v1.ErrKindUnavailable:
			kind = errdefs.ErrUnavailable
		}
		return resp, fmt.Errorf("%s: %w", resp.Error, kind)
	}
	return resp, nil
}

// SendRequest writes the request frame that opens a connection to init.
func SendRequest(c net.Conn, req sbinit.Request) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return v1.NewFrameWriter(c).WriteFrame(v1.FrameRequest, b)
}
