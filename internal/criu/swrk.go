package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
)

// hangHint is the advice attached to a CRIU call that ran out of time.
const hangHint = "CRIU can hang at parasite cure where hardware breakpoints do not work: " +
	"CRIU >= 4.2 detects that, older versions need CRIU_FAULT=130 in CRIU's environment"

// maxResp bounds one RPC response; CRIU's are a few hundred bytes.
const maxResp = 1 << 16

// call runs one `criu swrk` session: it sends each request in turn (every
// request but the last should set KeepOpen) and returns the responses.
// extra files become CRIU's descriptors 4, 5, ... (3 is the RPC socket).
// CRIU runs in the namespaces nss (none: the daemon's). The other
// arguments are session's.
func (t *Tool) call(ctx context.Context, op string, reqs []*rpc.CriuReq, extra []*os.File, nss []ns.Ref, logPath string, notify func(script string) error, started func(pid int) error) ([]*rpc.CriuResp, error) {
	if err := ctx.Err(); err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	p, err := t.spawn(extra, nss)
	if err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	return t.session(ctx, op, p, reqs, logPath, notify, started)
}

// swrk is a started `criu swrk` waiting for its first request.
type swrk struct {
	cmd    *exec.Cmd
	sk     *os.File // the RPC socket's client end
	stderr *capped
}

// spawn starts `criu swrk`, in the namespaces nss, with extra as its
// descriptors 4, 5, ...
func (t *Tool) spawn(extra []*os.File, nss []ns.Ref) (*swrk, error) {
	t.ensureKdatLink()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// Non-blocking, so that the runtime poller serves the socket and a
	// deadline can interrupt a read.
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	p := &swrk{sk: os.NewFile(uintptr(fds[0]), "criu-swrk-client"), stderr: new(capped)}
	srv := os.NewFile(uintptr(fds[1]), "criu-swrk-server")
	p.cmd = exec.Command(t.path, "swrk", "3")
	p.cmd.ExtraFiles = append([]*os.File{srv}, extra...)
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.WaitDelay = time.Second
	if len(nss) > 0 {
		err = ns.Enter(nss, p.cmd.Start)
	} else {
		err = p.cmd.Start()
	}
	srv.Close()
	if err != nil {
		p.sk.Close()
		return nil, fmt.Errorf("start %s: %w", t.path, err)
	}
	return p, nil
}

// kill ends a swrk that never got a request.
func (p *swrk) kill() {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.sk.Close()
	_ = p.cmd.Wait()
}

// session runs the requests on p, which it consumes. logPath, if not "",
// is CRIU's log, quoted when the call times out. notify, if not nil,
// answers CRIU's notifications (requests with NotifyScripts): an error
// makes CRIU fail the action, and session returns it wrapped. started, if
// not nil, runs with CRIU's PID before the first request.
//
// The session is bounded by ctx, or by DefaultTimeout when ctx has no
// deadline: when it ends, CRIU's process group is killed.
func (t *Tool) session(ctx context.Context, op string, p *swrk, reqs []*rpc.CriuReq, logPath string, notify func(script string) error, started func(pid int) error) ([]*rpc.CriuResp, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	if err := ctx.Err(); err != nil {
		p.kill()
		return nil, &Error{Op: op, Err: err}
	}
	cmd, sk := p.cmd, p.sk
	defer sk.Close()
	start := time.Now()
	if started != nil {
		// Before CRIU gets its request: what it forks (a restored tree)
		// inherits what started did to it (its cgroups).
		if err := started(cmd.Process.Pid); err != nil {
			p.kill()
			return nil, &Error{Op: op, Err: err}
		}
	}
	stop := context.AfterFunc(ctx, func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		sk.SetDeadline(time.Now())
	})
	resps, notifyErr, rpcErr := exchange(sk, reqs, notify)
	ended := ctx.Err() != nil // CRIU's group is being killed
	if rpcErr != nil && !ended {
		// CRIU closed the socket or sent garbage: it will not answer.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	sk.Close()
	// A CRIU that answered but does not exit is killed as well when ctx
	// ends: the caller may hold a sandbox frozen until this returns.
	waitErr := cmd.Wait()
	stop()

	if rpcErr != nil && ended {
		return nil, t.timeoutError(ctx, op, time.Since(start), cmd.Process.Pid, logPath)
	}
	if rpcErr != nil {
		cause := strings.TrimSpace(p.stderr.String())
		if cause == "" {
			cause = logCause(logPath)
		}
		if waitErr != nil {
			rpcErr = fmt.Errorf("%w (criu: %v)", rpcErr, waitErr)
		}
		return nil, &Error{Op: op, Cause: cause, Log: existing(logPath), Err: rpcErr}
	}
	if notifyErr != nil {
		return nil, &Error{Op: op, Cause: notifyErr.Error(), Log: existing(logPath), Err: notifyErr}
	}
	return resps, nil
}

// exchange sends each request and reads its response, answering
// notifications in between with notify. A response that reports failure
// ends the exchange; the caller inspects it. notifyErr is the first error
// of notify, wrapped with the notification's name.
func exchange(sk *os.File, reqs []*rpc.CriuReq, notify func(string) error) (resps []*rpc.CriuResp, notifyErr, err error) {
	buf := make([]byte, maxResp)
	for _, req := range reqs {
		for {
			b, err := proto.Marshal(req)
			if err != nil {
				return resps, notifyErr, fmt.Errorf("encode request: %w", err)
			}
			if _, err := sk.Write(b); err != nil {
				return resps, notifyErr, fmt.Errorf("send request: %w", err)
			}
			n, err := sk.Read(buf)
			if err != nil {
				return resps, notifyErr, fmt.Errorf("read response: %w", err)
			}
			resp := &rpc.CriuResp{}
			if err := proto.Unmarshal(buf[:n], resp); err != nil {
				return resps, notifyErr, fmt.Errorf("decode response: %w", err)
			}
			if resp.GetType() == rpc.CriuReqType_NOTIFY {
				script := resp.GetNotify().GetScript()
				var nerr error
				if notify != nil {
					if nerr = notify(script); nerr != nil && notifyErr == nil {
						notifyErr = fmt.Errorf("%s: %w", script, nerr)
					}
				}
				req = &rpc.CriuReq{Type: rpc.CriuReqType_NOTIFY.Enum(), NotifySuccess: proto.Bool(nerr == nil)}
				continue
			}
			if resp.GetType() != reqs[len(resps)].GetType() {
				return resps, notifyErr, fmt.Errorf("response of type %v to a %v request", resp.GetType(), reqs[len(resps)].GetType())
			}
			resps = append(resps, resp)
			if !resp.GetSuccess() {
				return resps, notifyErr, nil
			}
			break
		}
	}
	return resps, notifyErr, nil
}

func (t *Tool) timeoutError(ctx context.Context, op string, took time.Duration, pid int, logPath string) error {
	cause := ctx.Err()
	if !errors.Is(cause, context.DeadlineExceeded) {
		return &Error{Op: op, Err: fmt.Errorf("cancelled after %s, CRIU (pid %d) killed: %w", took.Round(time.Millisecond), pid, cause)}
	}
	msg := fmt.Sprintf("no answer after %s, CRIU (pid %d) killed; %s", took.Round(time.Millisecond), pid, hangHint)
	if last := lastLogLine(logPath); last != "" {
		msg += "; last log line: " + last
	}
	return &Error{Op: op, Cause: "timed out: " + msg, Log: existing(logPath), Err: fmt.Errorf("%w: %w", errdefs.ErrUnavailable, cause)}
}

// respError turns a response that reports failure into an *Error, with the
// cause read from CRIU's log.
func respError(op string, resp *rpc.CriuResp, logPath string) *Error {
	e := &Error{Op: op, Log: existing(logPath)}
	e.Cause = logCause(logPath)
	msg := resp.GetCrErrmsg()
	if errno := resp.GetCrErrno(); errno != 0 {
		if msg != "" {
			msg += ": "
		}
		msg += syscall.Errno(errno).Error()
	}
	if msg == "" {
		msg = "CRIU reported failure"
	}
	e.Err = errors.New(msg)
	if e.Cause == "" {
		e.Cause = msg
	}
	return e
}

// capped keeps the first 4 KiB written to it.
type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := 4096 - c.Len(); room > 0 {
		if len(p) > room {
			c.Buffer.Write(p[:room])
		} else {
			c.Buffer.Write(p)
		}
	}
	return len(p), nil
}
