//go:build linux && amd64

// The clone injection: a seized process is pointed at a syscall
// instruction with clone(2)'s registers, single-stepped through the call,
// and put back as it was; the copy gets the state a fork would not give
// it.

package template

import (
	"errors"
	"fmt"

	"github.com/molt-sh/molt/internal/errdefs"
	"golang.org/x/sys/unix"
)

// syscallInsn is x86-64's syscall instruction.
var syscallInsn = [2]byte{0x0f, 0x05}

// forkEventHook, when set (by tests), runs on the tracer thread at the
// fork event of an injected clone, with the new child's pid.
var forkEventHook func(child int)

// inject runs on the tracer thread.
func (t *Tracer) inject(pid int, mode copyMode) (int, error) {
	tr := t.seized[pid]
	// What clone leaves out of the child, taken from pid so that the
	// copy is pid at this instant: the address the kernel clears when
	// the process ends (set_tid_address; glibc's thread descriptor) and
	// its robust futex list (set_robust_list).
	tidAddr, err := t.prctlGet(pid, tr, unix.PR_GET_TID_ADDRESS, 8)
	if err != nil {
		return 0, err
	}
	// And the signal it gets when its parent ends (prctl(2)).
	pdeath, err := t.prctlGet(pid, tr, unix.PR_GET_PDEATHSIG, 4)
	if err != nil {
		return 0, err
	}
	var rl robustList
	if err := rl.read(pid); err != nil {
		return 0, err
	}
	flags := uint64(unix.SIGCHLD)
	if mode == copySibling {
		flags |= unix.CLONE_PARENT
	}
	if tidAddr != 0 {
		flags |= unix.CLONE_CHILD_CLEARTID
	}
	// The process whose clone makes the copy: pid, or for an orphan an
	// intermediate that shares pid's memory (CLONE_VM: no page tables
	// copied) and signals no one at its end. It forks the copy and is
	// killed; pid reaps it; the copy, orphaned, goes to the nearest
	// child subreaper or the namespace's init, and pid and its parent
	// never see a child they did not make.
	from, fromTr, regs, via := pid, tr, unix.PtraceRegs{}, 0
	if mode == copyOrphan {
		vcall, err := t.syscall(pid, tr, unix.SYS_CLONE, unix.CLONE_VM)
		via = vcall.child
		if err == nil && vcall.ret < 0 {
			err = fmt.Errorf("clone in %d: %w", pid, unix.Errno(-vcall.ret))
		}
		if via == 0 && err == nil {
			err = fmt.Errorf("clone in %d: no child reported", pid)
		}
		if via != 0 {
			t.seized[via] = &tracee{copy: true}
			if err == nil {
				_, err = t.waitStop(via, t.seized[via])
			}
		}
		if err != nil {
			if via != 0 {
				err = errors.Join(err, t.endVia(pid, tr, via))
			}
			return 0, err
		}
		from, fromTr, regs = via, t.seized[via], vcall.saved
	}
	// clone(flags, stack, parent_tid, child_tid, tls) on x86-64.
	call, err := t.syscall(from, fromTr, unix.SYS_CLONE, flags, 0, 0, tidAddr)
	child := call.child
	if err == nil && call.ret < 0 {
		err = fmt.Errorf("clone in %d: %w", from, unix.Errno(-call.ret))
	}
	if child == 0 && err == nil {
		err = fmt.Errorf("clone in %d: no child reported", from)
	}
	if mode != copyOrphan {
		regs = call.saved
	}
	if child != 0 {
		t.seized[child] = &tracee{copy: true}
	}
	if err == nil {
		err = t.prepareCopy(child, regs, call.poked, call.at, call.orig, rl, pdeath)
	}
	if err == nil {
		// Queued while held: the copy stops at once when Detach lets
		// it go. Should the tracer go away before that, the copy is
		// killed (it inherited PTRACE_O_EXITKILL, see syscall). Queued
		// after prepareCopy, whose injection would take it as a signal
		// on its way.
		err = unix.Tgkill(child, child, unix.SIGSTOP)
	}
	if via != 0 {
		// The copy made, the intermediate goes: the copy is orphaned.
		err = errors.Join(err, t.endVia(pid, tr, via))
	}
	if err != nil {
		if child != 0 {
			_ = unix.Kill(child, unix.SIGKILL)
			delete(t.seized, child)
		}
		return 0, err
	}
	return child, nil
}

// endVia kills the intermediate via of an orphan copy of pid, takes its
// end as its tracer and has pid reap it (by its number in pid's PID
// namespace). It runs on the tracer thread.
func (t *Tracer) endVia(pid int, tr *tracee, via int) error {
	nsVia, nerr := NSPid(via)
	_ = unix.Kill(via, unix.SIGKILL)
	delete(t.seized, via)
	if err := waitExit(via); err != nil {
		return fmt.Errorf("end of the intermediate of %d: %w", pid, err)
	}
	if nerr != nil {
		return nerr
	}
	if err := t.reap(pid, tr, nsVia); err != nil {
		return fmt.Errorf("reap the intermediate of %d: %w", pid, err)
	}
	return nil
}

// reap has pid (stopped) reap its child that has ended, by the child's
// number in pid's PID namespace, with an injected wait4. It runs on the
// tracer thread.
func (t *Tracer) reap(pid int, tr *tracee, nsChild int) error {
	w, err := t.syscall(pid, tr, unix.SYS_WAIT4, uint64(nsChild), 0, unix.WALL, 0)
	if err == nil && w.ret != int64(nsChild) {
		err = fmt.Errorf("wait4 returned %d", w.ret)
	}
	return err
}

// park turns the stop that ends a single-step into a stop that leaves
// nothing armed. The single-step leaves the trap flag set until the
// tracee is resumed or detached by request; a tracee whose tracer dies
// holding it (the daemon killed) is let go by the kernel with the flag
// set, takes a trap after its next instruction with no tracer, and dies
// of it. So: a trap stop is queued (PTRACE_INTERRUPT) and the tracee is
// continued (PTRACE_CONT clears the flag); it takes that stop before it
// leaves the kernel, still in the signal handling its step ended in, so
// it runs no instruction of its own, and an interrupted system call it
// was in still restarts when it is let go. It runs on the tracer
// thread.
func (t *Tracer) park(pid int, tr *tracee) error {
	if err := unix.PtraceInterrupt(pid); err != nil {
		return fmt.Errorf("interrupt %d: %w", pid, err)
	}
	if err := unix.PtraceCont(pid, 0); err != nil {
		return fmt.Errorf("continue %d: %w", pid, err)
	}
	tr.stopped = false
	if _, err := t.waitStop(pid, tr); err != nil {
		return err
	}
	return nil
}

// step single-steps pid through the injected clone and returns the new
// child's pid from the fork event.
func (t *Tracer) step(pid int, tr *tracee) (int, error) {
	child := 0
	if err := unix.PtraceSingleStep(pid); err != nil {
		return 0, fmt.Errorf("step %d: %w", pid, err)
	}
	for {
		ws, err := wait(pid)
		if err != nil {
			return child, err
		}
		if !ws.Stopped() {
			delete(t.seized, pid)
			return child, fmt.Errorf("pid %d ended during the injection: %w", pid, errdefs.ErrNotFound)
		}
		switch cause := ws.TrapCause(); {
		case cause == unix.PTRACE_EVENT_FORK || cause == unix.PTRACE_EVENT_CLONE || cause == unix.PTRACE_EVENT_VFORK:
			msg, err := unix.PtraceGetEventMsg(pid)
			if err != nil {
				return child, fmt.Errorf("new child of %d: %w", pid, err)
			}
			child = int(msg)
			if forkEventHook != nil {
				forkEventHook(child)
			}
			if err := unix.PtraceSingleStep(pid); err != nil {
				return child, fmt.Errorf("step %d: %w", pid, err)
			}
		case ws.StopSignal() == unix.SIGTRAP && cause <= 0:
			tr.stopped = true
			return child, nil
		default:
			// A signal (or a stop) on its way: hold it for the release.
			if sig := ws.StopSignal(); cause <= 0 {
				tr.held = append(tr.held, int(sig))
			}
			if err := unix.PtraceSingleStep(pid); err != nil {
				return child, fmt.Errorf("step %d: %w", pid, err)
			}
		}
	}
}

// prepareCopy waits for the new copy's first stop and gives it the
// original's registers (and text) from before the injection.
func (t *Tracer) prepareCopy(child int, saved unix.PtraceRegs, poked bool, at uintptr, orig [8]byte, rl robustList, pdeath uint64) error {
	tr := t.seized[child]
	if _, err := t.waitStop(child, tr); err != nil {
		return err
	}
	// The copy stands just past its clone: run what it lacks on that
	// syscall instruction before its registers go back.
	set := func(what string, nr uint64, args ...uint64) error {
		call, err := t.syscall(child, tr, nr, args...)
		if err == nil && call.ret != 0 {
			err = unix.Errno(-call.ret)
		}
		if err == nil {
			// The injection put the copy's options back without
			// PTRACE_O_EXITKILL, which it inherited: it keeps it.
			err = unix.PtraceSetOptions(child, seizeOpts|unix.PTRACE_O_EXITKILL)
		}
		if err != nil {
			return fmt.Errorf("%s of copy %d: %w", what, child, err)
		}
		return nil
	}
	if rl.head != 0 {
		if err := set("robust list", unix.SYS_SET_ROBUST_LIST, uint64(rl.head), uint64(rl.len)); err != nil {
			return err
		}
	}
	if pdeath != 0 {
		if err := set("parent-death signal", unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG, pdeath); err != nil {
			return err
		}
	}
	if poked {
		if _, err := unix.PtracePokeText(child, at, orig[:]); err != nil {
			return fmt.Errorf("text of copy %d: %w", child, err)
		}
	}
	if err := unix.PtraceSetRegs(child, &saved); err != nil {
		return fmt.Errorf("registers of copy %d: %w", child, err)
	}
	return nil
}

// stop waits for the seized pid's first ptrace stop, unless it was
// waited for already. It runs on the tracer thread.
func (t *Tracer) stop(pid int, tr *tracee) error {
	if tr.stopped {
		return nil
	}
	sig, err := t.waitStop(pid, tr)
	if err != nil {
		return err
	}
	if sig != int(unix.SIGTRAP) {
		return fmt.Errorf("pid %d is stopped by %v (job control): %w", pid, unix.Signal(sig), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// waitStop waits for pid's next ptrace stop that is not a signal on its
// way (those are held for the release) and returns its signal.
func (t *Tracer) waitStop(pid int, tr *tracee) (int, error) {
	for {
		ws, err := wait(pid)
		if err != nil {
			return 0, err
		}
		if !ws.Stopped() {
			delete(t.seized, pid)
			return 0, fmt.Errorf("pid %d ended: %w", pid, errdefs.ErrNotFound)
		}
		if ws.TrapCause() == unix.PTRACE_EVENT_STOP {
			tr.stopped = true
			return int(ws.StopSignal()), nil
		}
		tr.held = append(tr.held, int(ws.StopSignal()))
		if err := unix.PtraceCont(pid, 0); err != nil {
			return 0, fmt.Errorf("continue %d: %w", pid, err)
		}
	}
}
