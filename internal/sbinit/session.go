package sbinit

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/pid1"
)

// A session is a bash process that reads NUL-terminated requests from a
// private pipe and evaluates each one in the same shell, so cwd,
// variables, functions and aliases persist between calls. After each
// request it prints a marker carrying a per-call nonce and the exit
// status on stdout, and the nonce on stderr; init cuts the call's output
// at the markers. Commands get /dev/null as stdin so that a command that
// reads stdin cannot swallow later requests.
//
// The session's state (variables, functions, aliases, options, umask,
// traps, directory stack, cwd) is read on demand: stateCmd, run as a
// call, writes it with builtins only (no fork) NUL-terminated on a third
// pipe, and init digests it (see stateDigest), so a turn that left a
// session as it was can be told from one that changed it.
const sessionLoop = `exec 62<&3 3<&- 61>&4 4>&-
shopt -s expand_aliases
while IFS= read -r -d '' __molt_req <&62; do
__molt_n=${__molt_req%% *}
eval "${__molt_req#* }" </dev/null
__molt_rc=$?
printf '\036%s %d\036' "$__molt_n" "$__molt_rc"
printf '\036%s\036' "$__molt_n" >&2
done
`

// stateCmd writes the shell's state on the state pipe.
const stateCmd = `{ declare -p; printf '\037\n'; declare -f; alias -p; shopt -p; set +o; umask -p; trap -p; dirs -l -p; printf '\0'; } >&61 2>/dev/null`

// maxSessionOutput bounds what one call returns per stream.
const maxSessionOutput = 8 << 20

type session struct {
	name string
	pid  int
	p    *proc
	ctl  *os.File
	// The read ends the collectors drain (closed by release).
	readers []*os.File

	call sync.Mutex // one request at a time

	// checklocks pairs annotations with fields by position: one field
	// per line in annotated structs.
	mu     sync.Mutex
	out    bytes.Buffer
	err    bytes.Buffer
	outT   bool         // truncated
	errT   bool         // truncated
	state  bytes.Buffer // state text written by stateCmd, NUL-terminated
	stateT bool
	notify chan struct{}
	// Taken over: the next call syncs first.
	resync bool // +checklocks:call
	exited chan struct{}
	// released is closed when the agent lets go of the session (Close):
	// a call under way then returns, and the shell runs on.
	released    chan struct{}
	releaseOnce sync.Once
	status      unix.WaitStatus // +checklocks:mu
}

// sessionTag is the tag pid1 keeps a session's pipes under: the write
// end of its request pipe, then the read ends of its stdout, stderr and
// state pipes.
func sessionTag(name string) string { return "session:" + name }

// sessionList lists the sessions with their digests. The digests are
// taken outside the agent's lock: taking one runs a command in the
// session, and a session whose shell ends meanwhile takes that lock to
// forget itself (sessionEnded).
func (s *Agent) sessionList() []SessionInfo {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	var l []SessionInfo
	for _, ss := range sessions {
		l = append(l, SessionInfo{Name: ss.name, Pid: ss.pid, Digest: s.sessionDigest(ss)})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].Name < l[j].Name })
	return l
}

func (s *Agent) session(name string) (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errClosed
	}
	if ss, ok := s.sessions[name]; ok {
		select {
		case <-ss.exited:
			delete(s.sessions, name)
		default:
			return ss, nil
		}
	}
	ss, err := s.startSession(name)
	if err != nil {
		return nil, err
	}
	s.sessions[name] = ss
	return ss, nil
}

func (s *Agent) startSession(name string) (*session, error) {
	ps, err := s.resolve(Request{Args: []string{"bash", "--noprofile", "--norc", "-c", sessionLoop}})
	if err != nil {
		return nil, fmt.Errorf("start session: %w", err)
	}
	var parents, children []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	for _, parentReads := range []bool{false, true, true, true} { // request, stdout, stderr, state
		pa, ch, err := pipe(parentReads)
		if err != nil {
			closeAll(parents)
			closeAll(children)
			return nil, err
		}
		parents, children = append(parents, pa), append(children, ch)
	}
	// bash: stdin /dev/null, stdout, stderr, 3 requests, 4 state.
	p, err := s.spawn(ps, []*os.File{nil, children[1], children[2], children[0], children[3]}, parents, sessionTag(name))
	closeAll(children)
	if err != nil {
		closeAll(parents)
		if errors.Is(err, errNotFound) {
			err = fmt.Errorf("%w (sessions need bash in the image)", err)
		}
		return nil, fmt.Errorf("start session: %w", err)
	}
	return s.watchSession(name, p, parents), nil
}

// watchSession collects a session's output and notices its exit. files
// are the daemon's ends of its pipes, in sessionTag's order.
func (s *Agent) watchSession(name string, p *proc, files []*os.File) *session {
	ss := &session{name: name, pid: p.pid, p: p, ctl: files[0], readers: files[1:],
		notify: make(chan struct{}, 1), exited: make(chan struct{}), released: make(chan struct{})}
	outR, errR, stR := files[1], files[2], files[3]
	var wg sync.WaitGroup
	wg.Add(3)
	go ss.collect(outR, &ss.out, &ss.outT, &wg)
	go ss.collect(errR, &ss.err, &ss.errT, &wg)
	go ss.collect(stR, &ss.state, &ss.stateT, &wg)
	go func() {
		<-p.exited
		ss.ctl.Close()
		// Output written before the exit still belongs to the last call.
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(outputGrace):
			outR.SetReadDeadline(time.Now())
			errR.SetReadDeadline(time.Now())
			stR.SetReadDeadline(time.Now())
			<-done
		}
		p.pidfd.Close()
		ss.mu.Lock()
		ss.status = p.status
		ss.mu.Unlock()
		close(ss.exited)
	}()
	return ss
}

// release lets go of a session the agent no longer serves (the process
// runs on; pid1 keeps its pipes).
func (ss *session) release() {
	ss.releaseOnce.Do(func() {
		close(ss.released)
		ss.ctl.Close()
		for _, r := range ss.readers {
			r.SetReadDeadline(time.Now())
		}
	})
}

// errReleased answers a call on a session the agent let go of meanwhile
// (the daemon is closing the sandbox's agent: a hibernate, a stop). The
// shell runs on; the next agent takes it over (loadSessions).
func errReleased(start time.Time) Response {
	return Response{Error: "the sandbox's agent closed during the call (the session runs on)",
		ErrorKind: v1.ErrKindUnavailable, DurationMS: time.Since(start).Milliseconds()}
}

// loadSessions takes over the sessions pid1 keeps: after a restore or a
// daemon restart, the shells run on with their state.
func (s *Agent) loadSessions(ctx context.Context) error {
	var es []pid1.Entry
	if err := s.call(func() (err error) { es, err = s.init.Table(ctx); return err }); err != nil {
		return err
	}
	for _, e := range es {
		name, ok := strings.CutPrefix(e.Tag, "session:")
		if !ok || len(e.Files) != 4 {
			e.Pidfd.Close()
			for _, f := range e.Files {
				f.Close()
			}
			continue
		}
		files := make([]*os.File, 4)
		for i, f := range e.Files {
			// Non-blocking copies, which the runtime poller serves.
			_ = unix.SetNonblock(int(f.Fd()), true)
			fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			f.Close()
			if err != nil {
				return err
			}
			files[i] = os.NewFile(uintptr(fd), "session")
		}
		p, err := s.newProc(e.Pid, e.Pidfd)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			continue // it exited meanwhile
		}
		ss := s.watchSession(name, p, files)
		ss.resync = true // +checklocksignore: not shared yet
		s.mu.Lock()
		s.sessions[name] = ss
		s.mu.Unlock()
	}
	return nil
}

func (ss *session) collect(r *os.File, buf *bytes.Buffer, trunc *bool, wg *sync.WaitGroup) {
	defer wg.Done()
	defer r.Close()
	b := make([]byte, 64<<10)
	for {
		n, err := r.Read(b)
		if n > 0 {
			ss.mu.Lock()
			buf.Write(b[:n])
			// Keep the head for the caller and a tail for marker detection.
			if buf.Len() > maxSessionOutput+4096 {
				keep := append([]byte(nil), buf.Bytes()[:maxSessionOutput]...)
				tail := append([]byte(nil), buf.Bytes()[buf.Len()-4096:]...)
				buf.Reset()
				buf.Write(keep)
				buf.Write(tail)
				*trunc = true
			}
			ss.mu.Unlock()
			select {
			case ss.notify <- struct{}{}:
			default:
			}
		}
		if err != nil {
			return
		}
	}
}

// findMarker returns where the marker "\x1e<nonce>[ rc]\x1e" starts and
// ends in b, and the rc text, or start -1.
func findMarker(b []byte, nonce string) (start, end int, rc string) {
	head := []byte("\x1e" + nonce)
	i := bytes.Index(b, head)
	if i < 0 {
		return -1, 0, ""
	}
	rest := b[i+len(head):]
	j := bytes.IndexByte(rest, '\x1e')
	if j < 0 {
		return -1, 0, ""
	}
	return i, i + len(head) + j + 1, strings.TrimSpace(string(rest[:j]))
}

func (s *Agent) sessionRun(req Request) Response {
	if req.Session == "" {
		return Response{Error: "session name is empty", ErrorKind: v1.ErrKindInvalidArgument}
	}
	if strings.IndexByte(req.Command, 0) >= 0 {
		return Response{Error: "command contains a NUL byte", ErrorKind: v1.ErrKindInvalidArgument}
	}
	ss, err := s.session(req.Session)
	if err != nil {
		return Response{Error: err.Error()}
	}
	ss.call.Lock()
	defer ss.call.Unlock()
	r, _ := s.runIn(ss, req.Command, req.TimeoutMS, false)
	return r
}

// sessionDigest returns a digest of the session's shell state, or, when
// the session is busy with a call or cannot say, a value equal to no
// other (the session counts as changed). The analyzer does not follow
// TryLock.
//
// +checklocksignore
func (s *Agent) sessionDigest(ss *session) string {
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	unknown := "unknown-" + hex.EncodeToString(nb[:])
	if !ss.call.TryLock() {
		return unknown
	}
	defer ss.call.Unlock()
	r, d := s.runIn(ss, stateCmd, 5000, true)
	if r.ExitCode != 0 || r.TimedOut || d == "" {
		return unknown
	}
	return d
}

// runIn runs text in the session (caller holds ss.call). With state, the
// text is stateCmd and runIn also returns the digest of what it wrote.
//
// +checklocks:ss.call
func (s *Agent) runIn(ss *session, text string, timeoutMS int64, state bool) (Response, string) {
	if ss.resync {
		// Taken over from pid1's table: a call of the agent before may
		// have been cut off (a daemon that died mid-command), and its
		// output and markers may still come. A call of its own first,
		// whose output is dropped, ends where that one ended.
		ss.resync = false
		if r, _ := s.runIn(ss, ":", timeoutMS, false); r.TimedOut {
			return r, ""
		}
	}
	start := time.Now()
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	nonce := "molt" + hex.EncodeToString(nb[:])
	if _, err := ss.ctl.Write([]byte(nonce + " " + text + "\x00")); err != nil {
		select {
		case <-ss.released:
			return errReleased(start), ""
		default:
		}
		return s.sessionEnded(ss, start, false), ""
	}
	var timeout <-chan time.Time
	if timeoutMS > 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	var killBash <-chan time.Time
	for {
		ss.mu.Lock()
		oStart, oEnd, rc := findMarker(ss.out.Bytes(), nonce)
		eStart, eEnd, _ := findMarker(ss.err.Bytes(), nonce)
		// The state is written before the markers, so once both markers
		// are in, its NUL is too (or the shell died).
		if state && oStart >= 0 && eStart >= 0 && bytes.IndexByte(ss.state.Bytes(), 0) < 0 && !ss.stateT {
			ss.mu.Unlock()
			select {
			case <-ss.notify:
			case <-ss.exited:
				return s.sessionEnded(ss, start, timedOut), ""
			case <-ss.released:
				return errReleased(start), ""
			}
			continue
		}
		if oStart >= 0 && eStart >= 0 {
			digest := ""
			if state {
				if i := bytes.IndexByte(ss.state.Bytes(), 0); i >= 0 && !ss.stateT {
					digest = stateDigest(ss.state.Bytes()[:i])
				}
				// Cut short or missing: no digest, the caller counts
				// the session as changed.
				ss.state.Reset()
				ss.stateT = false
			}
			r := Response{
				Stdout: string(ss.out.Bytes()[:oStart]), Stderr: string(ss.err.Bytes()[:eStart]),
				Truncated: ss.outT || ss.errT, TimedOut: timedOut,
				DurationMS: time.Since(start).Milliseconds(),
			}
			r.ExitCode, _ = strconv.Atoi(rc)
			if timedOut {
				r.ExitCode = 124
			}
			// Whatever followed the markers (output of background jobs)
			// stays for the next call.
			restOut := append([]byte(nil), ss.out.Bytes()[oEnd:]...)
			restErr := append([]byte(nil), ss.err.Bytes()[eEnd:]...)
			ss.out.Reset()
			ss.out.Write(restOut)
			ss.err.Reset()
			ss.err.Write(restErr)
			ss.outT, ss.errT = false, false
			ss.mu.Unlock()
			return r, digest
		}
		ss.mu.Unlock()
		select {
		case <-ss.notify:
		case <-ss.exited:
			return s.sessionEnded(ss, start, timedOut), ""
		case <-ss.released:
			return errReleased(start), ""
		case <-timeout:
			// Kill what the command started; the shell then prints its
			// marker. A shell busy in a builtin loop is killed after a
			// grace period, which ends the session.
			timedOut = true
			timeout = nil
			killBelow(ss.p.hostPid)
			killBash = time.After(2 * time.Second)
		case <-killBash:
			ss.p.signal(unix.SIGKILL, false)
			killBash = nil
		}
	}
}

// sessionEnded reports a call during which the session's shell exited
// (the command ran `exit`, or the shell was killed) and forgets it.
func (s *Agent) sessionEnded(ss *session, start time.Time, timedOut bool) Response {
	<-ss.exited
	s.mu.Lock()
	if s.sessions[ss.name] == ss {
		delete(s.sessions, ss.name)
	}
	s.mu.Unlock()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	r := Response{
		Stdout: ss.out.String(), Stderr: ss.err.String(), Truncated: ss.outT || ss.errT,
		ExitCode: ss.status.ExitStatus(), TimedOut: timedOut, DurationMS: time.Since(start).Milliseconds(),
	}
	if ss.status.Signaled() {
		r.ExitCode = 128 + int(ss.status.Signal())
	}
	if timedOut {
		r.ExitCode = 124
	}
	r.Stderr += fmt.Sprintf("molt: session %q ended (exit status %d)\n", ss.name, r.ExitCode)
	return r
}

func (s *Agent) sessionClose(name string) Response {
	s.mu.Lock()
	ss, ok := s.sessions[name]
	delete(s.sessions, name)
	s.mu.Unlock()
	if !ok {
		return Response{Error: fmt.Sprintf("session %q not found", name), ErrorKind: v1.ErrKindNotFound}
	}
	killBelow(ss.p.hostPid)
	ss.p.signal(unix.SIGKILL, false)
	<-ss.exited
	return Response{}
}

// volatileVars change by themselves on every command, or are the
// session loop's own; they are not state a turn leaves behind.
var volatileVars = map[string]bool{
	"BASH_COMMAND": true, "BASH_LINENO": true, "BASH_SOURCE": true, "BASH_ARGC": true,
	"BASH_ARGV": true, "BASH_SUBSHELL": true, "BASHPID": true, "EPOCHREALTIME": true,
	"EPOCHSECONDS": true, "FUNCNAME": true, "LINENO": true, "PIPESTATUS": true,
	"RANDOM": true, "SRANDOM": true, "SECONDS": true, "HISTCMD": true, "_": true,
}

// stateDigest hashes a session's state text (declare -p, declare -f,
// aliases, options, umask, traps, directory stack) without the variables
// that change on their own. `declare -p` starts every variable on a line
// of its own with "declare -"; a value may span lines, which stay with
// their variable.
func stateDigest(text []byte) string {
	h := sha256.New()
	vars, rest, found := bytes.Cut(text, []byte("\n\037\n"))
	if !found {
		vars, rest = nil, text
	}
	skip := false
	for len(vars) > 0 {
		line := vars
		if i := bytes.IndexByte(vars, '\n'); i >= 0 {
			line, vars = vars[:i+1], vars[i+1:]
		} else {
			vars = nil
		}
		if after, ok := bytes.CutPrefix(line, []byte("declare -")); ok {
			skip = false
			if f := bytes.Fields(after); len(f) >= 2 {
				name, _, _ := bytes.Cut(f[1], []byte("="))
				skip = volatileVars[string(name)] || bytes.HasPrefix(name, []byte("__molt_"))
			}
		}
		if !skip {
			h.Write(line)
		}
	}
	h.Write([]byte{0})
	h.Write(rest)
	return hex.EncodeToString(h.Sum(nil)[:16])
}
