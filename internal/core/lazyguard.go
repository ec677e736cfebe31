package core

// A lazy resume's guard (sbinit.LazyGuard): a process of its own that
// kills the restored tree if the daemon dies before every page is in,
// holding the page server's socket open meanwhile, so that no task of
// the tree reads a zero page where its memory had not come yet. The
// marker of a lazy fetch (endLazyFetch) stays: a host that restarts
// after the guard was killed too (a whole service cgroup killed) still
// kills the tree at start.

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/molt-sh/molt/internal/sbinit"
)

type lazyGuard struct {
	cmd  *exec.Cmd
	w    *os.File // the daemon's end of the guard's pipe
	once sync.Once
}

// startLazyGuard starts the guard of a lazy resume into cgroup cg, whose
// page server answers on sock.
func (m *Manager) startLazyGuard(cg string, sock *os.File) (*lazyGuard, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(m.launcher.Binary, sbinit.ArgLazyGuard, cg)
	cmd.Env = []string{}
	cmd.Stdin = r
	cmd.ExtraFiles = []*os.File{sock}
	// Not in the daemon's process group: a signal to the group (a
	// terminal's) leaves it, as CRIU's lazy-pages daemon.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("lazy resume guard: %w", err)
	}
	return &lazyGuard{cmd: cmd, w: w}, nil
}

// release ends the guard without a kill: the resume ended (every page
// in, or the tree killed here).
func (g *lazyGuard) release() {
	if g == nil {
		return
	}
	g.end(true)
}

// end closes the guard's pipe, saying done first or not (what a daemon
// that dies does), and reaps the guard.
func (g *lazyGuard) end(done bool) {
	g.once.Do(func() {
		if done {
			_, _ = g.w.Write([]byte{sbinit.LazyGuardDone})
		}
		g.w.Close()
		go func() { _ = g.cmd.Wait() }()
	})
}
