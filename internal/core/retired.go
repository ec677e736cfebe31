package core

import (
	"context"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
)

// Roots retired by rollbacks are deleted once their sandbox has not
// rolled back for retireQuiet, or all at once when it holds retireBacklog
// of them: garbage is collected while the sandbox idles, not between the
// rollbacks and captures of a tree search. Deleting right away (a GC job
// per rollback, each deletion a btrfs transaction of its own next to the
// following captures and restores) cost 15-20 % of the nodes of `molt
// bench search`, and a backlog of 64 still about 15 %. A retired root
// holds little of its own (what the sandbox wrote since the checkpoint it
// left); stopping or removing the sandbox deletes them at once, and the
// next daemon start removes any a crash left.
const (
	retireQuiet   = time.Second
	retireBacklog = 256
)

type retiredRoots struct {
	mu     sync.Mutex
	m      map[string][]retiredRoot // sandbox ID -> retired roots not yet deleted
	timers map[string]*time.Timer   // sandbox ID -> pending collection
}

// retiredRoot is a root a rollback replaced, and the init of the tree
// that ran on it (killed, maybe not gone yet).
type retiredRoot struct {
	path string
	init sandbox.Init
}

// remove deletes the root once its tree is gone.
func (r retiredRoot) remove() error {
	waitGone(r.init, 10*time.Second)
	return removeTree(r.path)
}

// retire hands a root that a rollback replaced to the collector.
func (m *Manager) retire(id, root string, init sandbox.Init) {
	m.ret.mu.Lock()
	if m.ret.m == nil {
		m.ret.m, m.ret.timers = map[string][]retiredRoot{}, map[string]*time.Timer{}
	}
	m.ret.m[id] = append(m.ret.m[id], retiredRoot{root, init})
	if t := m.ret.timers[id]; t != nil {
		t.Stop()
		delete(m.ret.timers, id)
	}
	if len(m.ret.m[id]) < retireBacklog {
		m.ret.timers[id] = time.AfterFunc(retireQuiet, func() { m.collectRetired(id) })
		m.ret.mu.Unlock()
		return
	}
	m.ret.mu.Unlock()
	m.collectRetired(id)
}

// takeRetired takes the sandbox's retired roots from the collector and
// cancels their pending collection.
func (m *Manager) takeRetired(id string) []retiredRoot {
	m.ret.mu.Lock()
	defer m.ret.mu.Unlock()
	roots := m.ret.m[id]
	delete(m.ret.m, id)
	if t := m.ret.timers[id]; t != nil {
		t.Stop()
		delete(m.ret.timers, id)
	}
	return roots
}

// collectRetired deletes the sandbox's retired roots in a GC job.
func (m *Manager) collectRetired(id string) {
	roots := m.takeRetired(id)
	if len(roots) == 0 {
		return
	}
	select {
	case <-m.closing:
		return // the next start removes them
	default:
	}
	m.background(id, sched.GC, "remove retired roots", func(context.Context, *sched.Task) error {
		var first error
		for _, r := range roots {
			if err := r.remove(); err != nil {
				m.log.Warn("old root not removed; the next start removes it", "sandbox", id, "root", r.path, "err", err)
				if first == nil {
					first = err
				}
			}
		}
		return first
	})
}

// stopRetiring cancels pending collections (at Close; the roots stay for
// the next start to remove).
func (m *Manager) stopRetiring() {
	m.ret.mu.Lock()
	defer m.ret.mu.Unlock()
	for id, t := range m.ret.timers {
		t.Stop()
		delete(m.ret.timers, id)
	}
}

// removeRetired deletes the sandbox's retired roots now, once their
// trees are gone. Callers have killed the sandbox's processes (it is not
// rolling back).
func (m *Manager) removeRetired(id string) {
	for _, r := range m.takeRetired(id) {
		if err := r.remove(); err != nil {
			m.log.Warn("old root not removed; the next start removes it", "sandbox", id, "root", r.path, "err", err)
		}
	}
}
