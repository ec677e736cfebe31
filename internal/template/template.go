//go:build linux && amd64

package template

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// syscallInsn is x86-64's syscall instruction.
var syscallInsn = [2]byte{0x0f, 0x05}

// seizeOpts are the ptrace options of a seized process: the tracer
// takes the children an injected clone makes.
const seizeOpts = unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEVFORK

// forkEventHook, when set (by tests), runs on the tracer thread at the
// fork event of an injected clone, with the new child's pid.
var forkEventHook func(child int)

// Tracer injects clones into processes from one locked OS thread.
// Its methods may be called from any goroutine, one at a time per
// process.
type Tracer struct {
	reqs chan func()
	done chan struct{}
	tid  int // the tracer thread's; read after done is closed
	// On the tracer thread only:
	seized map[int]*tracee
}

type tracee struct {
	stopped bool  // in a ptrace stop this tracer has waited for
	held    []int // signals that arrived during the injection
	copy    bool  // a copy made by Clone
}

// NewTracer starts a tracer. Close it to release what it holds.
func NewTracer() *Tracer {
	t := &Tracer{reqs: make(chan func()), done: make(chan struct{}), seized: map[int]*tracee{}}
	go func() {
		// The thread is never unlocked: it exits with the goroutine, and
		// the kernel detaches whatever it still traces.
		runtime.LockOSThread()
		t.tid = unix.Gettid()
		for f := range t.reqs {
			f()
		}
		close(t.done)
	}()
	return t
}

func (t *Tracer) do(f func() error) error {
	errc := make(chan error, 1)
	t.reqs <- func() { errc <- f() }
	return <-errc
}

// Close releases every original still seized (it runs on) and kills
// every copy still held, then ends the tracer's thread. If a process may
// still be traced (a killed copy, or an original release could not
// detach), it waits for the thread to be gone: the kernel detaches what
// a thread traces as it exits, and until then another tracer (CRIU) that
// seizes the process fails with EPERM.
func (t *Tracer) Close() {
	traced := false // something may still be traced by the thread
	_ = t.do(func() error {
		for pid, tr := range t.seized {
			if tr.copy {
				_ = unix.Kill(pid, unix.SIGKILL)
				delete(t.seized, pid)
				traced = true
				continue
			}
			if t.release(pid) != nil {
				traced = true
			}
		}
		return nil
	})
	close(t.reqs)
	<-t.done
	if !traced || t.tid == os.Getpid() {
		return // all detached; or the main thread, which does not exit
	}
	task := "/proc/self/task/" + strconv.Itoa(t.tid)
	for deadline := time.Now().Add(stopTimeout); time.Now().Before(deadline); {
		if _, err := os.Stat(task); errors.Is(err, os.ErrNotExist) {
			return
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// Seize attaches to pid and asks it to stop at its next return to user
// mode; Clone waits for that stop. A process in a frozen cgroup stops
// once the cgroup is thawed, so a caller seizes a frozen tree, thaws it
// and then clones each process.
//
// Preconditions: pid is not traced already and is single-threaded.
func (t *Tracer) Seize(pid int) error {
	return t.do(func() error {
		if _, ok := t.seized[pid]; ok {
			return nil
		}
		if n, err := threads(pid); err != nil {
			return err
		} else if n != 1 {
			return fmt.Errorf("pid %d has %d threads: only single-threaded processes can be copied: %w", pid, n, errdefs.ErrNotSupported)
		}
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, seizeOpts, 0, 0); e != 0 {
			return fmt.Errorf("seize %d: %w", pid, e)
		}
		t.seized[pid] = &tracee{}
		if err := unix.PtraceInterrupt(pid); err != nil {
			_ = unix.PtraceDetach(pid)
			delete(t.seized, pid)
			return fmt.Errorf("interrupt %d: %w", pid, err)
		}
		return nil
	})
}

// Clone makes a copy of pid (seizing it first if needed) and releases
// pid, which runs on. The copy is held stopped by the tracer, with the
// original's registers at its stop; Detach, Kill or Close end that.
// With parent, the copy is a child of pid's parent (CLONE_PARENT: a
// parent that reaps any child, such as molt's PID 1, reaps it), else of
// pid; a namespace's init cannot give its copies its parent.
func (t *Tracer) Clone(pid int, parent bool) (copyPid int, err error) {
	if err := t.Seize(pid); err != nil {
		return 0, err
	}
	err = t.do(func() error {
		defer func() {
			if rerr := t.release(pid); rerr != nil && err == nil {
				err = rerr
			}
		}()
		copyPid, err = t.inject(pid, modeOf(parent))
		return err
	})
	return copyPid, err
}

func modeOf(parent bool) copyMode {
	if parent {
		return copySibling
	}
	return copyChild
}

// Adopt takes pid, a stopped copy made some other way (a process that
// copied itself), into the tracer's hands as if Clone had made it:
// Detach, Kill and Close apply, and should the tracer go away first, the
// kernel kills it (PTRACE_O_EXITKILL). It stays stopped.
func (t *Tracer) Adopt(pid int) error {
	return t.do(func() error {
		if _, ok := t.seized[pid]; ok {
			return fmt.Errorf("pid %d is traced already: %w", pid, errdefs.ErrInvalidArgument)
		}
		if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(pid), 0, seizeOpts|unix.PTRACE_O_EXITKILL, 0, 0); e != 0 {
			return fmt.Errorf("seize copy %d: %w", pid, e)
		}
		t.seized[pid] = &tracee{copy: true}
		return nil
	})
}

// Copy makes a copy of pid as Clone does but keeps pid seized and
// stopped: a caller copying a tree lets the originals go together
// (Release) once every copy is made, so that none runs before the last
// copy is taken.
func (t *Tracer) Copy(pid int, parent bool) (copyPid int, err error) {
	return t.copyAs(pid, modeOf(parent))
}

// CopyOrphan makes a copy of pid as Copy does, whose parent is neither
// pid nor pid's parent but the nearest child subreaper among pid's
// ancestors or, without one, the init of pid's PID namespace: a parent
// that waits for any child (wait(-1)) never takes the copy's stop or
// end for one of its own. It costs an intermediate process (sharing
// pid's memory, so no page tables copied) and three more injected calls.
func (t *Tracer) CopyOrphan(pid int) (copyPid int, err error) {
	return t.copyAs(pid, copyOrphan)
}

func (t *Tracer) copyAs(pid int, mode copyMode) (copyPid int, err error) {
	if err := t.Seize(pid); err != nil {
		return 0, err
	}
	err = t.do(func() error {
		copyPid, err = t.inject(pid, mode)
		return err
	})
	return copyPid, err
}

// Where a copy goes in the process tree.
type copyMode int

const (
	copyChild   copyMode = iota // the original's child
	copySibling                 // the original's parent's child (CLONE_PARENT)
	copyOrphan                  // orphaned: the nearest child subreaper's or the namespace init's
)

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

// release detaches an original and delivers the signals held for it.
func (t *Tracer) release(pid int) error {
	tr, ok := t.seized[pid]
	if !ok {
		return nil
	}
	delete(t.seized, pid)
	err := unix.PtraceDetach(pid)
	if errors.Is(err, unix.ESRCH) && unix.PtraceInterrupt(pid) == nil {
		// Not in a ptrace stop (detach needs one, and a tracee that
		// was continued is not in one): stop it first. The wait is
		// bounded; a tracee that does not stop stays traced until the
		// tracer's thread exits (Close).
		if ws, werr := wait(pid); werr == nil && ws.Stopped() {
			err = unix.PtraceDetach(pid)
		}
	}
	if errors.Is(err, unix.ESRCH) && unix.Kill(pid, 0) != nil {
		err = nil // gone
	}
	for _, sig := range tr.held {
		_ = unix.Tgkill(pid, pid, unix.Signal(sig))
	}
	if err != nil {
		// Still traced: the kernel detaches it when the tracer's thread
		// exits (Close waits for that).
		return fmt.Errorf("detach %d: %w", pid, err)
	}
	return nil
}

// Detach lets the copy go: it stops at once (job control: the SIGSTOP
// queued at its birth) and runs on SIGCONT.
func (t *Tracer) Detach(copyPid int) error {
	return t.takeCopy(copyPid, func() error {
		if err := unix.PtraceDetach(copyPid); err != nil {
			return fmt.Errorf("detach copy %d: %w", copyPid, err)
		}
		return nil
	})
}

// Kill kills a copy.
func (t *Tracer) Kill(copyPid int) error {
	return t.takeCopy(copyPid, func() error { return unix.Kill(copyPid, unix.SIGKILL) })
}

// takeCopy runs f on the tracer thread once it has taken copyPid, a copy
// this tracer holds, out of its hands.
func (t *Tracer) takeCopy(copyPid int, f func() error) error {
	return t.do(func() error {
		if tr, ok := t.seized[copyPid]; !ok || !tr.copy {
			return fmt.Errorf("pid %d is not a copy held by this tracer: %w", copyPid, errdefs.ErrInvalidArgument)
		}
		delete(t.seized, copyPid)
		return f()
	})
}

// stopTimeout bounds each wait for a stop. A process that does not stop
// in that time is left to the kernel, which detaches it when the
// tracer's thread ends (Close).
const stopTimeout = 2 * time.Second

// wait polls for pid's next state change: a blocking wait4 could hang a
// checkpoint on a process that never stops.
func wait(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	deadline := time.Now().Add(stopTimeout)
	pause := 20 * time.Microsecond
	// Stops come within microseconds: spin first, then sleep.
	for spin := 0; ; spin++ {
		got, err := unix.Wait4(pid, &ws, unix.WALL|unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return ws, fmt.Errorf("wait for %d: %w", pid, err)
		case got == pid:
			return ws, nil
		case time.Now().After(deadline):
			return ws, fmt.Errorf("pid %d did not stop within %v: %w", pid, stopTimeout, errdefs.ErrUnavailable)
		}
		if spin < 500 {
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

func threads(pid int) (int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("pid %d: %w", pid, errdefs.ErrNotFound)
		}
		return 0, err
	}
	return len(ents), nil
}

// Protect write-protects pid's private memory at this instant, for a
// reader that holds references to its pages (internal/criu's Stream):
// it injects a fork without an exit signal, kills the child and injects
// the wait4 that reaps it. The fork write-protects every private page in
// pid's page tables, so pid's next write to one copies it and the page a
// reader holds stays as it was; the child is gone before anything else
// sees it. pid stays seized and stopped; Release lets it go.
//
// Memory shared with other processes (MAP_SHARED, System V) is not
// protected: a fork shares it.
func (t *Tracer) Protect(pid int) error { return t.ProtectAll(pid) }

// ProtectAll protects each of pids as Protect does, in two passes: first
// the forks, each child killed as soon as it is made, then the waits for
// the children's ends and the reaps. A child's end tears down its copy
// of the page tables (1.5-4 ms for a 100 MiB heap here), which so runs
// on another CPU while the next process is forked instead of after it:
// give the largest first. Every child made is killed and waited for,
// whatever fails; on error some processes may be protected and others
// not.
func (t *Tracer) ProtectAll(pids ...int) error {
	for _, pid := range pids {
		if err := t.Seize(pid); err != nil {
			return err
		}
	}
	return t.do(func() error {
		type fork struct {
			pid, child, nsChild int
			reap                bool // the injection went well: pid reaps its child
		}
		var forks []fork
		var err error
		for _, pid := range pids {
			// Flags 0: a plain fork whose end signals no one.
			call, cerr := t.syscall(pid, t.seized[pid], unix.SYS_CLONE, 0)
			if call.child == 0 {
				if cerr == nil {
					cerr = fmt.Errorf("fork in %d: %w", pid, unix.Errno(-call.ret))
				}
				err = cerr
				break
			}
			// The parent reaps the child by its number in the parent's
			// PID namespace (the event gave the tracer's).
			nsChild, nerr := NSPid(call.child)
			// The child is traced (PTRACE_O_TRACECLONE) and stopped: kill
			// it; its end is taken below, as its tracer, after which its
			// parent can reap it.
			_ = unix.Kill(call.child, unix.SIGKILL)
			forks = append(forks, fork{pid, call.child, nsChild, cerr == nil && nerr == nil})
			if err = errors.Join(cerr, nerr); err != nil {
				break
			}
		}
		for _, f := range forks {
			if werr := waitExit(f.child); werr != nil {
				err = errors.Join(err, fmt.Errorf("end of the fork of %d: %w", f.pid, werr))
				continue
			}
			if !f.reap {
				continue
			}
			if rerr := t.reap(f.pid, t.seized[f.pid], f.nsChild); rerr != nil {
				err = errors.Join(err, fmt.Errorf("reap the fork of %d: %w", f.pid, rerr))
			}
		}
		return err
	})
}

// Release lets a seized original go: it runs on.
func (t *Tracer) Release(pid int) error {
	return t.do(func() error { return t.release(pid) })
}

// waitExit waits, as its tracer, for a killed process's end.
func waitExit(pid int) error {
	for {
		ws, err := wait(pid)
		if err != nil {
			return err
		}
		if ws.Exited() || ws.Signaled() {
			return nil
		}
		// A stop on the way to the kill: let it go on to it.
		_ = unix.PtraceCont(pid, 0)
	}
}

// ProtectFrozen write-protects the private memory of every process in
// protect, which a frozen cgroup holds with the processes in stop (see
// Protect). A frozen process runs no injected code, so: seize every
// process in protect, stop those in stop with SIGSTOP, thaw (each stops
// instead of running), protect, freeze again, let them go to the freezer
// and continue those in stop (SIGCONT; they stay frozen). On return the
// cgroup is frozen unless thaw or freeze failed; on error some processes
// may be protected and others not.
//
// stop is for processes that are children of this process: a wait for
// one of them by any thread here (a reaper's wait4 or os.Process.Wait)
// would take the report of its ptrace stop, which is meant for the
// tracer, and end as if it had exited. A job-control stop is reported
// only to waits that ask for stops.
func ProtectFrozen(stop, protect []int, thaw, freeze func() error) error {
	t := NewTracer()
	defer t.Close()
	for _, pid := range protect {
		if err := t.Seize(pid); err != nil {
			return fmt.Errorf("%s: %w", describe(pid), err)
		}
	}
	var stopped []int
	defer func() {
		for _, pid := range stopped {
			_ = unix.Kill(pid, unix.SIGCONT)
		}
	}()
	for _, pid := range stop {
		// From an ancestor namespace SIGSTOP reaches a namespace's init
		// too; frozen, it is taken at the thaw, before any user code.
		if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
			return fmt.Errorf("stop %d: %w", pid, err)
		}
		stopped = append(stopped, pid)
	}
	if err := thaw(); err != nil {
		return err
	}
	// The largest first: its fork's end overlaps the others' forks.
	size := make(map[int]int64, len(protect))
	for _, pid := range protect {
		size[pid] = RssAnon(pid)
	}
	order := slices.Clone(protect)
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(size[b], size[a]) })
	err := t.ProtectAll(order...)
	// Frozen again before the release and SIGCONT: they go to the
	// freezer.
	if ferr := freeze(); ferr != nil {
		return errors.Join(err, fmt.Errorf("freeze again: %w", ferr))
	}
	return err
}

// RssAnon is pid's resident private memory in bytes (RssAnon in
// /proc/PID/status), 0 if unknown.
func RssAnon(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// describe names pid by its command and state, for errors.
func describe(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "pid " + strconv.Itoa(pid)
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 >= len(s) {
		return "pid " + strconv.Itoa(pid)
	}
	return fmt.Sprintf("pid %d (%s, state %c)", pid, s[open+1:end], s[end+2])
}

// NSPid returns pid's number in its own PID namespace (the last of
// NSpid).
func NSPid(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.Atoi(f[len(f)-1])
			}
		}
	}
	return 0, fmt.Errorf("pid %d: no NSpid", pid)
}
