package core

import (
	"os"
	"strconv"
	"time"

	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/criu"
)

// DefaultFrozenDeadline is Config.FrozenDeadline's default
// (capture.DefaultFrozenDeadline).
const DefaultFrozenDeadline = capture.DefaultFrozenDeadline

// networkLock is CRIU's network locking for dumps and restores
// (capture.NetworkLock).
const networkLock = capture.NetworkLock

// frozenDeadline is the deadline of a frozen window over a tree with anon
// bytes of private memory; 0 means none.
func (m *Manager) frozenDeadline(anon int64) time.Duration {
	return capture.Deadline(m.cfg.FrozenDeadline, anon)
}

// streamPipes is how many pipes the host keeps ready for streamed dumps:
// 1 MiB each at the default fs.pipe-max-size, enough for a 150 MiB tree
// without making one while CRIU writes.
const streamPipes = 160

// pipePool returns the host's pool of stream pipes, made and filled at
// the first use (before that dump's freeze).
func (m *Manager) pipePool() *criu.PipePool {
	m.streamMu.Lock()
	defer m.streamMu.Unlock()
	if m.pipes == nil {
		m.pipes = criu.NewPipePool(streamPipes)
		if err := m.pipes.Fill(); err != nil {
			m.log.Debug("stream pipes", "err", err)
		}
	}
	return m.pipes
}

// refillPipes tops the pool up in the background, off the frozen window.
func (m *Manager) refillPipes() {
	p := m.pipePool()
	go func() {
		if err := p.Fill(); err != nil {
			m.log.Debug("stream pipes", "err", err)
		}
	}()
}

// waitCopies waits for the dumps of the sandbox's template capture, if
// one is under way.
func (m *Manager) waitCopies(id string) {
	m.mu.Lock()
	done := m.copying[id]
	m.mu.Unlock()
	if done != nil {
		<-done
	}
}

// startCopies dumps the copies of a template capture in the background
// (Captured.Start), at once rather than through the scheduler: until
// they are dumped, the copies are processes of the sandbox, which waits
// for them (waitCopies).
func (m *Manager) startCopies(id string, c *capture.Captured) {
	if c.Mode != capture.Template {
		return
	}
	done := make(chan struct{})
	m.mu.Lock()
	m.copying[id] = done
	m.mu.Unlock()
	c.Start(func() {
		m.mu.Lock()
		delete(m.copying, id)
		m.mu.Unlock()
		close(done)
	})
}

// pid1Copies returns the processes of tree that run the init's program
// but are not the init: copies pid1 made of itself.
func pid1Copies(init int, tree []int) []int {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(init) + "/exe")
	if err != nil {
		return nil
	}
	var out []int
	for _, pid := range tree {
		if pid == init {
			continue
		}
		if e, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); err == nil && e == exe {
			out = append(out, pid)
		}
	}
	return out
}
