package pid1

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
)

const (
	opInfo   = 1
	opSpawn  = 2
	opTable  = 3
	opDrop   = 4
	opSignal = 5
	opStatus = 6

	flagSetsid = 1
	flagCtty   = 2
	flagWatch  = 4

	sigGroup = 1
	sigTree  = 2

	maxMsg = 256 << 10
	// MaxFiles bounds the descriptors of one request (Files and Keep).
	MaxFiles = 64
	// MaxKept bounds the descriptors pid1 keeps in all, MaxEntries the
	// processes it keeps them for.
	MaxKept    = 192
	MaxEntries = 48
)

// header is the fixed part of a request.
type header struct {
	Op, Flags, UID, GID        uint32
	NGroups, NFds, NKeep, Argc uint32
	Envc, Len                  uint32
	Pid, Sig                   int32
}

// response is the fixed part of a response.
type response struct {
	Err     int32
	Stage   uint32
	Pid     int32
	Status  uint32
	WStatus int32
	Version uint32
	Len     uint32
	NFds    uint32
}

// Client talks to one pid1. It holds no connection between calls, so a
// dump of pid1's tree finds no socket whose peer is outside it.
type Client struct {
	dial func() (*net.UnixConn, error)
}

// New returns a client of the pid1 listening on the abstract socket
// name in the network namespace netns (nil: the caller's). netns stays
// the caller's to close, after the client's last call. With peer > 0,
// every connection is checked to be served by the process with that
// (host) PID, not by another process of the namespace that took the name.
func New(netns *os.File, name string, peer int) *Client {
	addr := &net.UnixAddr{Name: "@" + name, Net: "unixpacket"}
	return &Client{dial: func() (c *net.UnixConn, err error) {
		if netns == nil {
			c, err = net.DialUnix("unixpacket", nil, addr)
		} else {
			// The socket belongs to the namespace of the thread that
			// makes it.
			err = ns.Do(netns, unix.CLONE_NEWNET, func() error {
				c, err = net.DialUnix("unixpacket", nil, addr)
				return err
			})
		}
		if err != nil || peer <= 0 {
			return c, err
		}
		rc, err := c.SyscallConn()
		if err != nil {
			c.Close()
			return nil, err
		}
		var cred *unix.Ucred
		cerr := rc.Control(func(fd uintptr) {
			cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		})
		if cerr != nil || err != nil || int(cred.Pid) != peer {
			c.Close()
			return nil, fmt.Errorf("%s is not served by process %d: %w", addr.Name, peer, errdefs.ErrUnavailable)
		}
		return c, nil
	}}
}

// Error is a request pid1 refused or could not carry out.
type Error struct {
	Op    string
	Errno syscall.Errno
	// Stage says where a spawn failed: "fork", "setup" (descriptors,
	// session, terminal, credentials), "chdir" or "exec".
	Stage string
}

func (e *Error) Error() string {
	if e.Stage != "" {
		return fmt.Sprintf("pid1 %s: %s: %v", e.Op, e.Stage, e.Errno)
	}
	return fmt.Sprintf("pid1 %s: %v", e.Op, e.Errno)
}

func (e *Error) Unwrap() error { return e.Errno }

var stages = []string{"", "fork", "setup", "chdir", "exec"}

// call sends one request and reads the response with its descriptors.
// The first nblock of files are put in blocking mode (the descriptors of
// a process, which shares their open file descriptions); the others keep
// their mode (the caller may go on using them with deadlines).
func (c *Client) call(ctx context.Context, op string, h header, data []byte, files []*os.File, nblock int) (response, []byte, []*os.File, error) {
	var r response
	if len(files) > MaxFiles {
		return r, nil, nil, fmt.Errorf("pid1 %s: %d descriptors, at most %d: %w", op, len(files), MaxFiles, errdefs.ErrInvalidArgument)
	}
	h.Len = uint32(len(data))
	var buf bytes.Buffer
	_ = binary.Write(&buf, binary.LittleEndian, h)
	buf.Write(data)
	if buf.Len() > maxMsg {
		return r, nil, nil, fmt.Errorf("pid1 %s: request of %d bytes, at most %d: %w", op, buf.Len(), maxMsg, errdefs.ErrInvalidArgument)
	}
	conn, err := c.dial()
	if err != nil {
		return r, nil, nil, fmt.Errorf("pid1 %s: %w", op, err)
	}
	defer conn.Close()
	deadline := time.Now().Add(10 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			if i < nblock {
				fds[i] = int(f.Fd()) // makes it blocking
				continue
			}
			rc, err := f.SyscallConn()
			if err != nil {
				return r, nil, nil, fmt.Errorf("pid1 %s: %w", op, err)
			}
			_ = rc.Control(func(fd uintptr) { fds[i] = int(fd) })
		}
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := conn.WriteMsgUnix(buf.Bytes(), oob, nil); err != nil {
		return r, nil, nil, fmt.Errorf("pid1 %s: send: %w", op, err)
	}
	in := make([]byte, maxMsg)
	rights := make([]byte, unix.CmsgSpace(4*(MaxKept+MaxEntries)))
	n, oobn, flags, _, err := conn.ReadMsgUnix(in, rights)
	var got []*os.File
	if oobn > 0 {
		msgs, _ := unix.ParseSocketControlMessage(rights[:oobn])
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				unix.CloseOnExec(fd)
				got = append(got, os.NewFile(uintptr(fd), "pid1"))
			}
		}
	}
	closeGot := func() {
		for _, f := range got {
			f.Close()
		}
	}
	if err != nil {
		closeGot()
		if ctx.Err() != nil {
			return r, nil, nil, fmt.Errorf("pid1 %s: %w", op, ctx.Err())
		}
		return r, nil, nil, fmt.Errorf("pid1 %s: receive: %w", op, err)
	}
	if n == 0 {
		closeGot()
		return r, nil, nil, fmt.Errorf("pid1 %s: no response (the peer is not pid1, or it refused this client)", op)
	}
	if n < binary.Size(r) || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeGot()
		return r, nil, nil, fmt.Errorf("pid1 %s: malformed response (%d bytes, flags %#x)", op, n, flags)
	}
	_ = binary.Read(bytes.NewReader(in[:n]), binary.LittleEndian, &r)
	body := in[binary.Size(r):n]
	switch {
	case r.Version != Version:
		err = fmt.Errorf("pid1 %s: protocol version %d, want %d", op, r.Version, Version)
	case int(r.Len) != len(body) || int(r.NFds) != len(got):
		err = fmt.Errorf("pid1 %s: response says %d bytes and %d descriptors, got %d and %d", op, r.Len, r.NFds, len(body), len(got))
	case r.Err != 0:
		e := &Error{Op: op, Errno: syscall.Errno(r.Err)}
		if int(r.Stage) < len(stages) {
			e.Stage = stages[r.Stage]
		}
		err = e
	}
	if err != nil {
		closeGot()
		return r, nil, nil, err
	}
	return r, body, got, nil
}

// Info returns pid1's PID (1 when it is its namespace's init) and the
// number of entries it keeps.
func (c *Client) Info(ctx context.Context) (pid, entries int, err error) {
	r, _, _, err := c.call(ctx, "info", header{Op: opInfo}, nil, nil, 0)
	return int(r.Pid), int(r.Status), err
}

// Spawn describes a process for pid1 to start.
type Spawn struct {
	Path string // a program path, or a name looked up in Env's PATH
	Args []string
	Env  []string
	Dir  string // working directory; "" is "/"

	UID, GID uint32
	Groups   []uint32

	Setsid bool
	Ctty   bool // make Files[0], a terminal, the controlling terminal (needs Setsid)
	Watch  bool // keep the exit status for Status

	// Files become the process's descriptors 0, 1, 2, ...; a nil entry
	// is /dev/null, opened by the process (inside the sandbox). They are
	// put in blocking mode, as programs expect their stdio.
	Files []*os.File
	// Keep are kept by pid1 under Tag while the process lives (Table
	// returns them; Drop or the process's exit closes them).
	Keep []*os.File
	Tag  string
}

// Spawn starts a process and returns its PID (in pid1's namespace) and
// a pidfd of it (pollable: readable once it exits; signals sent through
// it cannot reach a later process with the same PID). A failure before
// exec is an *Error naming the stage.
func (c *Client) Spawn(ctx context.Context, s Spawn) (int, *os.File, error) {
	if len(s.Args) == 0 {
		return 0, nil, fmt.Errorf("pid1 spawn: no arguments: %w", errdefs.ErrInvalidArgument)
	}
	if s.Dir == "" {
		s.Dir = "/"
	}
	if len(s.Files) > 32 {
		return 0, nil, fmt.Errorf("pid1 spawn: %d descriptors for the process, at most 32: %w", len(s.Files), errdefs.ErrInvalidArgument)
	}
	h := header{Op: opSpawn, UID: s.UID, GID: s.GID, NGroups: uint32(len(s.Groups)),
		NFds: uint32(len(s.Files)), NKeep: uint32(len(s.Keep)), Argc: uint32(len(s.Args)), Envc: uint32(len(s.Env))}
	var send []*os.File
	for i, f := range s.Files {
		if f == nil {
			h.Sig |= 1 << i // the null mask
		} else {
			send = append(send, f)
		}
	}
	if s.Setsid {
		h.Flags |= flagSetsid
	}
	if s.Ctty {
		h.Flags |= flagCtty
	}
	if s.Watch {
		h.Flags |= flagWatch
	}
	var data bytes.Buffer
	for _, g := range s.Groups {
		_ = binary.Write(&data, binary.LittleEndian, g)
	}
	for _, str := range append(append([]string{s.Tag, s.Path, s.Dir}, s.Args...), s.Env...) {
		if bytes.IndexByte([]byte(str), 0) >= 0 {
			return 0, nil, fmt.Errorf("pid1 spawn: a string holds a NUL byte: %w", errdefs.ErrInvalidArgument)
		}
		data.WriteString(str)
		data.WriteByte(0)
	}
	r, _, got, err := c.call(ctx, "spawn", h, data.Bytes(), append(send, s.Keep...), len(send))
	if err != nil {
		return 0, nil, err
	}
	var pidfd *os.File
	if len(got) > 0 {
		pidfd = got[0]
	}
	return int(r.Pid), pidfd, nil
}

// Entry is what pid1 keeps for one process.
type Entry struct {
	Tag   string
	Pid   int
	Pidfd *os.File   // the process's (the caller's to close)
	Files []*os.File // the kept descriptors, in order (the caller's to close)
}

// Table returns the kept entries with copies of their descriptors.
func (c *Client) Table(ctx context.Context) ([]Entry, error) {
	r, body, got, err := c.call(ctx, "table", header{Op: opTable}, nil, nil, 0)
	if err != nil {
		return nil, err
	}
	fields := bytes.Split(body, []byte{0})
	if len(fields) > 0 && len(fields[len(fields)-1]) == 0 {
		fields = fields[:len(fields)-1]
	}
	bad := func() ([]Entry, error) {
		for _, f := range got {
			f.Close()
		}
		return nil, fmt.Errorf("pid1 table: malformed response")
	}
	if len(fields) != 3*int(r.Status) {
		return bad()
	}
	var es []Entry
	for i := 0; i < len(fields); i += 3 {
		pid, err1 := strconv.Atoi(string(fields[i+1]))
		n, err2 := strconv.Atoi(string(fields[i+2]))
		if err1 != nil || err2 != nil || n < 1 || n > len(got) {
			return bad()
		}
		es = append(es, Entry{Tag: string(fields[i]), Pid: pid, Pidfd: got[0], Files: got[1:n:n]})
		got = got[n:]
	}
	if len(got) != 0 {
		return bad()
	}
	return es, nil
}

// Drop closes what pid1 keeps under tag. ErrNotFound if nothing.
func (c *Client) Drop(ctx context.Context, tag string) error {
	_, _, _, err := c.call(ctx, "drop", header{Op: opDrop}, append([]byte(tag), 0), nil, 0)
	if errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return err
}

// Signal sends sig to process pid; group: to its process group; tree:
// to it and all its descendants.
func (c *Client) Signal(ctx context.Context, pid int, sig unix.Signal, group, tree bool) error {
	h := header{Op: opSignal, Pid: int32(pid), Sig: int32(sig)}
	if group {
		h.Flags |= sigGroup
	}
	if tree {
		h.Flags |= sigTree
	}
	_, _, _, err := c.call(ctx, "signal", h, nil, nil, 0)
	return err
}

// State of a watched process.
type State int

const (
	Running State = 1
	Exited  State = 2
	Unknown State = 3 // never watched, or its status was taken already
)

// Status returns the state of a process started with Watch, and its
// wait status once it exited (pid1 forgets it then).
func (c *Client) Status(ctx context.Context, pid int) (State, unix.WaitStatus, error) {
	r, _, _, err := c.call(ctx, "status", header{Op: opStatus, Pid: int32(pid)}, nil, nil, 0)
	return State(r.Status), unix.WaitStatus(r.WStatus), err
}
