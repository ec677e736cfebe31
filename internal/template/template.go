//go:build linux && amd64

package template

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// seizeOpts are the ptrace options of a seized process: the tracer
// takes the children an injected clone makes.
const seizeOpts = unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEVFORK

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

// Release lets a seized original go: it runs on.
func (t *Tracer) Release(pid int) error {
	return t.do(func() error { return t.release(pid) })
}
