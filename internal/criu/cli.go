package criu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
)

// A streamed dump runs `criu dump` from the command line: CRIU 4.2's RPC
// service aborts in --stream mode (set through a configuration file, as
// the RPC has no field for it) right after its pre-stream notification,
// before it connects to the stream. CRIU's pre-dump notification, where
// the caller freezes the tree, then comes through an action script that
// waits on two FIFOs in the work directory for the daemon's answer.
const hookScript = `#!/bin/sh
[ "$CRTOOLS_SCRIPT_ACTION" = pre-dump ] || exit 0
d=$(dirname "$0")
echo pre-dump > "$d/hook.req" || exit 1
read -r answer < "$d/hook.rep" || exit 1
[ "$answer" = ok ]
`

// dumpCLI runs one dump with o.Stream on the command line.
func (t *Tool) dumpCLI(ctx context.Context, o DumpOptions, d *dirs) error {
	if o.Spare != nil {
		o.Spare.Kill()
		return &Error{Op: "dump", Err: fmt.Errorf("a streamed dump runs its own CRIU, not a spare: %w", errdefs.ErrInvalidArgument)}
	}
	if o.PostDump != nil {
		return &Error{Op: "dump", Err: fmt.Errorf("a streamed dump has no post-dump notification: %w", errdefs.ErrInvalidArgument)}
	}
	args, err := o.cliArgs(d.workPath)
	if err != nil {
		return &Error{Op: "dump", Err: err}
	}
	logPath := filepath.Join(d.workPath, dumpLog)
	var hook *hookFIFOs
	if o.PreDump != nil {
		if hook, err = newHook(d.workPath); err != nil {
			return &Error{Op: "dump", Err: err}
		}
		defer hook.close()
		args = append(args, "--action-script", hook.script)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	t.ensureKdatLink()
	stderr := new(capped)
	cmd := exec.Command(t.path, args...)
	cmd.Stderr, cmd.Stdout = stderr, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = time.Second
	if len(o.Namespaces) > 0 {
		err = ns.Enter(o.Namespaces, cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return &Error{Op: "dump", Err: fmt.Errorf("start %s: %w", t.path, err)}
	}
	start := time.Now()
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	var hookErr error
	hookDone := make(chan struct{})
	go func() {
		defer close(hookDone)
		if hook != nil {
			hookErr = hook.serve(o.PreDump)
		}
	}()
	waitErr := cmd.Wait()
	ended := !stop()
	if hook != nil {
		hook.close() // a CRIU that never reached pre-dump leaves serve waiting
	}
	<-hookDone
	switch {
	case ended:
		return t.timeoutError(ctx, "dump", time.Since(start), cmd.Process.Pid, logPath)
	case hookErr != nil && !errors.Is(hookErr, os.ErrClosed):
		return &Error{Op: "dump", Cause: "pre-dump: " + hookErr.Error(), Log: existing(logPath), Err: fmt.Errorf("pre-dump: %w", hookErr)}
	case waitErr != nil:
		cause := logCause(logPath)
		if cause == "" {
			cause = strings.TrimSpace(stderr.String())
		}
		e := &Error{Op: "dump", Cause: cause, Log: existing(logPath), Err: fmt.Errorf("criu: %w", waitErr)}
		if unix.Kill(o.Pid, 0) == unix.ESRCH {
			e.Err = fmt.Errorf("pid %d: %w: %w", o.Pid, errdefs.ErrNotFound, e.Err)
		}
		return e
	}
	return nil
}

// cliArgs are o's command-line options; work is the work directory.
func (o *DumpOptions) cliArgs(work string) ([]string, error) {
	if o.Pid <= 0 {
		return nil, fmt.Errorf("pid %d: %w", o.Pid, errdefs.ErrInvalidArgument)
	}
	level := o.LogLevel
	if level == 0 {
		level = DefaultLogLevel
	}
	if level < 0 || level > 4 {
		return nil, fmt.Errorf("log level %d not in 0..4: %w", level, errdefs.ErrInvalidArgument)
	}
	args := []string{"dump", "-t", strconv.Itoa(o.Pid), "-D", o.ImagesDir, "-W", work,
		"-o", dumpLog, "-v" + strconv.Itoa(level), "--stream"}
	flag := func(on bool, name string) {
		if on {
			args = append(args, name)
		}
	}
	flag(o.LeaveRunning, "--leave-running")
	flag(o.TCPEstablished, "--tcp-established")
	flag(o.TCPClose, "--tcp-close")
	flag(o.TCPSkipInFlight, "--skip-in-flight")
	flag(o.FileLocks, "--file-locks")
	flag(o.ExtUnixSk, "--ext-unix-sk")
	flag(o.ShellJob, "--shell-job")
	flag(o.LinkRemap, "--link-remap")
	for _, e := range o.External {
		args = append(args, "--external", e)
	}
	if o.FreezeCgroup != "" {
		args = append(args, "--freeze-cgroup", o.FreezeCgroup)
	}
	if o.ManageCgroups || o.CgroupMode != "" {
		mode := o.CgroupMode
		if mode == "" {
			mode = "soft"
		}
		if _, ok := cgroupModes[mode]; !ok {
			return nil, fmt.Errorf("cgroup mode %q: %w", mode, errdefs.ErrInvalidArgument)
		}
		args = append(args, "--manage-cgroups="+mode)
	}
	if o.NetworkLock != "" {
		if _, ok := networkLocks[o.NetworkLock]; !ok {
			return nil, fmt.Errorf("network lock %q: %w", o.NetworkLock, errdefs.ErrInvalidArgument)
		}
		args = append(args, "--network-lock", o.NetworkLock)
	}
	if o.GhostLimit != 0 {
		args = append(args, "--ghost-limit", strconv.FormatUint(uint64(o.GhostLimit), 10))
	}
	return args, nil
}

// hookFIFOs carry CRIU's pre-dump notification from the action script
// to the daemon and its answer back. Both are held open read-write here,
// so that neither side's open waits for the other.
type hookFIFOs struct {
	script   string
	req, rep *os.File
}

func newHook(work string) (*hookFIFOs, error) {
	h := &hookFIFOs{script: filepath.Join(work, "hook.sh")}
	if err := os.WriteFile(h.script, []byte(hookScript), 0o700); err != nil {
		return nil, err
	}
	for _, p := range []struct {
		name string
		f    **os.File
	}{{"hook.req", &h.req}, {"hook.rep", &h.rep}} {
		path := filepath.Join(work, p.name)
		if err := unix.Mkfifo(path, 0o600); err != nil {
			h.close()
			return nil, &os.PathError{Op: "mkfifo", Path: path, Err: err}
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			h.close()
			return nil, err
		}
		*p.f = f
	}
	return h, nil
}

// serve answers one pre-dump notification with f's result.
func (h *hookFIFOs) serve(f func() error) error {
	line, err := bufio.NewReader(h.req).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "pre-dump" {
		return fmt.Errorf("unexpected notification %q", line)
	}
	ferr := f()
	answer := "ok\n"
	if ferr != nil {
		answer = "fail\n"
	}
	if _, err := h.rep.WriteString(answer); err != nil {
		return errors.Join(ferr, err)
	}
	return ferr
}

func (h *hookFIFOs) close() {
	if h.req != nil {
		h.req.Close()
	}
	if h.rep != nil {
		h.rep.Close()
	}
}
