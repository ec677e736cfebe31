package core

import (
	"sync"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
)

// spares holds, per sandbox that has restored processes (a warm rollback,
// a standby), one CRIU started ahead of the next restore and already
// moved into the sandbox's cgroups. Moving a process into a cgroup waits
// for an RCU grace period per hierarchy: 12-18 ms for a sandbox's seven
// here, which every restore paid on its critical path.
type spares struct {
	mu      sync.Mutex
	m       map[string]*criu.Spare   // sandbox ID -> ready spare
	filling map[string]chan struct{} // sandbox ID -> closed when its refill ends
	gen     map[string]int           // bumped by dropSpare: a refill under an older one is void
	closed  bool
}

// takeSpare takes the sandbox's ready spare CRIU, if any.
func (m *Manager) takeSpare(id string) *criu.Spare {
	m.spr.mu.Lock()
	defer m.spr.mu.Unlock()
	s := m.spr.m[id]
	delete(m.spr.m, id)
	return s
}

// refillSpare starts a spare CRIU for the sandbox in the background, in
// its cgroup cg, unless one is ready or on its way.
func (m *Manager) refillSpare(id string, cg *cgroup.Cgroup) {
	tool := m.criu
	if tool == nil {
		return
	}
	m.spr.mu.Lock()
	if m.spr.closed || m.spr.m[id] != nil || m.spr.filling[id] != nil {
		m.spr.mu.Unlock()
		return
	}
	if m.spr.filling == nil {
		m.spr.filling, m.spr.m, m.spr.gen = map[string]chan struct{}{}, map[string]*criu.Spare{}, map[string]int{}
	}
	done := make(chan struct{})
	m.spr.filling[id] = done
	gen := m.spr.gen[id]
	m.spr.mu.Unlock()
	m.sby.wg.Add(1)
	go func() {
		defer m.sby.wg.Done()
		defer close(done)
		s, err := tool.StartSpare()
		if err == nil {
			if err = cg.Add(s.Pid()); err != nil {
				s.Kill()
			}
		}
		m.spr.mu.Lock()
		delete(m.spr.filling, id)
		if err == nil && !m.spr.closed && m.spr.gen[id] == gen {
			m.spr.m[id], s = s, nil
		}
		m.spr.mu.Unlock()
		if err != nil {
			m.log.Debug("no spare CRIU", "sandbox", id, "err", err)
		} else if s != nil {
			s.Kill()
		}
	}()
}

// dropSpare kills the sandbox's spare CRIU and waits for a refill in
// flight (whose result is then killed): after it, no spare of the
// sandbox lives in its cgroup until the next refillSpare. Callers about
// to kill or remove the sandbox's cgroup call it first.
func (m *Manager) dropSpare(id string) {
	m.spr.mu.Lock()
	s := m.spr.m[id]
	delete(m.spr.m, id)
	done := m.spr.filling[id]
	if m.spr.gen != nil {
		m.spr.gen[id]++
	}
	m.spr.mu.Unlock()
	if s != nil {
		s.Kill()
	}
	if done != nil {
		<-done
	}
}

// closeSpares kills every spare; no refill starts after it.
func (m *Manager) closeSpares() {
	m.spr.mu.Lock()
	m.spr.closed = true
	ids := make([]string, 0, len(m.spr.m)+len(m.spr.filling))
	for id := range m.spr.m {
		ids = append(ids, id)
	}
	for id := range m.spr.filling {
		ids = append(ids, id)
	}
	m.spr.mu.Unlock()
	for _, id := range ids {
		m.dropSpare(id)
	}
}
