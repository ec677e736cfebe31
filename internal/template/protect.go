//go:build linux && amd64

// Write-protecting processes' private memory at an instant (fork and
// reap), for running ones and for the processes of a frozen cgroup.

package template

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

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
