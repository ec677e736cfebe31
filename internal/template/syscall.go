//go:build linux && amd64

// System calls run inside a stopped tracee, and what they read out of it:
// prctl values, its robust futex list, and what a fork does not inherit.

package template

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// injected is what one injected system call left: its return value, a
// child it made, and what the caller needs to give a copy the state from
// before the call.
type injected struct {
	ret   int64
	child int
	saved unix.PtraceRegs
	poked bool
	at    uintptr
	orig  [8]byte
}

// syscall runs system call nr with args in the stopped tracee pid and
// puts its registers (and text) back, so that the call it was
// interrupted in restarts. It runs on the tracer thread.
func (t *Tracer) syscall(pid int, tr *tracee, nr uint64, args ...uint64) (injected, error) {
	var call injected
	if err := t.stop(pid, tr); err != nil {
		return call, err
	}
	saved := &call.saved
	if err := unix.PtraceGetRegs(pid, saved); err != nil {
		return call, fmt.Errorf("registers of %d: %w", pid, err)
	}
	// Until its registers and text are back, a tracee whose tracer goes
	// away (the daemon killed) goes with it: left to run, it would go on
	// with the injected registers or text, and the child of an injected
	// fork would run on as a second copy of it, repeating what it does.
	// The child inherits the option, so it is killed as well.
	if err := unix.PtraceSetOptions(pid, seizeOpts|unix.PTRACE_O_EXITKILL); err != nil {
		return call, fmt.Errorf("options of %d: %w", pid, err)
	}
	// A process stopped on its way out of a system call sits just past
	// a syscall instruction; elsewhere one is written over the current
	// instruction for the duration.
	call.at = uintptr(saved.Rip)
	if int64(saved.Orig_rax) >= 0 && saved.Rip >= 2 {
		var b [2]byte
		if _, err := unix.PtracePeekText(pid, uintptr(saved.Rip-2), b[:]); err == nil && b == syscallInsn {
			call.at = uintptr(saved.Rip - 2)
		}
	}
	if call.at == uintptr(saved.Rip) {
		if _, err := unix.PtracePeekText(pid, call.at, call.orig[:]); err != nil {
			return call, fmt.Errorf("text of %d: %w", pid, err)
		}
	}
	// A process stopped where its interrupted system call restarts sits
	// on the syscall instruction: no text is written (a write, even of
	// the same bytes, makes the page of code a private copy, which a
	// dump then holds).
	if call.at == uintptr(saved.Rip) && [2]byte(call.orig[:2]) != syscallInsn {
		code := call.orig
		copy(code[:], syscallInsn[:])
		if _, err := unix.PtracePokeText(pid, call.at, code[:]); err != nil {
			return call, fmt.Errorf("text of %d: %w", pid, err)
		}
		call.poked = true
	}
	stepped := false
	restore := func() error {
		var errs []error
		if call.poked {
			if _, err := unix.PtracePokeText(pid, call.at, call.orig[:]); err != nil {
				errs = append(errs, fmt.Errorf("restore text of %d: %w", pid, err))
			}
		}
		if err := unix.PtraceSetRegs(pid, saved); err != nil {
			errs = append(errs, fmt.Errorf("restore registers of %d: %w", pid, err))
		}
		if len(errs) == 0 && stepped {
			if err := t.park(pid, tr); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			if err := unix.PtraceSetOptions(pid, seizeOpts); err != nil {
				errs = append(errs, fmt.Errorf("options of %d: %w", pid, err))
			}
		}
		return errors.Join(errs...)
	}

	regs := *saved
	var a [6]uint64
	copy(a[:], args)
	// orig_rax -1: no restart of the interrupted call before ours.
	regs.Orig_rax = ^uint64(0)
	regs.Rax = nr
	regs.Rdi, regs.Rsi, regs.Rdx, regs.R10, regs.R8, regs.R9 = a[0], a[1], a[2], a[3], a[4], a[5]
	regs.Rip = uint64(call.at)
	if err := unix.PtraceSetRegs(pid, &regs); err != nil {
		return call, errors.Join(fmt.Errorf("inject into %d: %w", pid, err), restore())
	}
	child, err := t.step(pid, tr)
	stepped = err == nil
	call.child = child
	if err == nil {
		var after unix.PtraceRegs
		if err = unix.PtraceGetRegs(pid, &after); err == nil {
			call.ret = int64(after.Rax)
		}
	}
	if rerr := restore(); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return call, err
}

// robustList is a process's robust futex list head (get_robust_list).
type robustList struct {
	head uintptr
	len  uintptr
}

func (rl *robustList) read(pid int) error {
	if _, _, e := unix.Syscall(unix.SYS_GET_ROBUST_LIST, uintptr(pid), uintptr(unsafe.Pointer(&rl.head)), uintptr(unsafe.Pointer(&rl.len))); e != 0 {
		return fmt.Errorf("robust list of %d: %w", pid, e)
	}
	return nil
}

// getInto runs system call nr in the stopped tracee with args and, last,
// the address of a size-byte buffer the call writes, and returns what
// it wrote: for the getters whose values no file in /proc shows. The
// buffer is the memory at the stack pointer, which is present (memory
// further down could be a page never touched, which the call would
// bring in: one more page in the process's dump); it is put back after.
// It runs on the tracer thread.
func (t *Tracer) getInto(pid int, tr *tracee, size int, nr uint64, args ...uint64) ([]byte, error) {
	if err := t.stop(pid, tr); err != nil {
		return nil, err
	}
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		return nil, fmt.Errorf("registers of %d: %w", pid, err)
	}
	scratch := uintptr(regs.Rsp) &^ 7
	saved, got := make([]byte, size), make([]byte, size)
	if _, err := unix.PtracePeekData(pid, scratch, saved); err != nil {
		return nil, fmt.Errorf("stack of %d: %w", pid, err)
	}
	call, err := t.syscall(pid, tr, nr, append(args, uint64(scratch))...)
	if err == nil && call.ret != 0 {
		err = unix.Errno(-call.ret)
	}
	if err == nil {
		_, err = unix.PtracePeekData(pid, scratch, got)
	}
	if !slices.Equal(got, saved) {
		if _, perr := unix.PtracePokeData(pid, scratch, saved); perr != nil {
			err = errors.Join(err, fmt.Errorf("put back the stack of %d: %w", pid, perr))
		}
	}
	if err != nil {
		return nil, fmt.Errorf("system call %d in %d: %w", nr, pid, err)
	}
	return got, nil
}

// prctlGet runs prctl(op, &value) in the stopped tracee and returns the
// value (size 4 or 8 bytes). It runs on the tracer thread.
func (t *Tracer) prctlGet(pid int, tr *tracee, op uint64, size int) (uint64, error) {
	b, err := t.getInto(pid, tr, size, unix.SYS_PRCTL, op)
	if err != nil {
		return 0, err
	}
	if size == 4 {
		return uint64(binary.LittleEndian.Uint32(b)), nil
	}
	return binary.LittleEndian.Uint64(b), nil
}

// NotInherited says what pid (seized) has set that a fork does not give
// the child and a copy therefore lacks: an armed interval timer
// (alarm(2), setitimer(2)) or the child-subreaper mark. "" if nothing.
func (t *Tracer) NotInherited(pid int) (string, error) {
	if err := t.Seize(pid); err != nil {
		return "", err
	}
	var why string
	err := t.do(func() error {
		tr := t.seized[pid]
		for which, name := range []string{"ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF"} {
			// struct itimerval: the interval, then the time left.
			b, err := t.getInto(pid, tr, 32, unix.SYS_GETITIMER, uint64(which))
			if err != nil {
				return err
			}
			if !slices.Equal(b, make([]byte, 32)) {
				why = fmt.Sprintf("pid %d has an interval timer armed (%s)", pid, name)
				return nil
			}
		}
		sub, err := t.prctlGet(pid, tr, unix.PR_GET_CHILD_SUBREAPER, 4)
		if err != nil {
			return err
		}
		if sub != 0 {
			why = fmt.Sprintf("pid %d is a child subreaper", pid)
		}
		return nil
	})
	return why, err
}
