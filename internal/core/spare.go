package core

import (
	"sync"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/sandbox"
)

// spares holds CRIUs started ahead, per sandbox:
//
//   - for restores (a warm rollback, a standby), once the sandbox has
//     restored processes: a CRIU in fresh namespaces, already moved into
//     the sandbox's cgroups. Moving a process into a cgroup waits for an
//     RCU grace period per hierarchy: 12-18 ms for a sandbox's seven here,
//     which every restore paid on its critical path.
//   - for dumps, once the sandbox has taken a full checkpoint: a CRIU in
//     the namespaces of the sandbox's tree that checkpoints leave out of
//     the images. Starting CRIU until it can dump took 6-7 ms of every
//     checkpoint call (not of the frozen window).
type spares struct {
	mu      sync.Mutex
	m       map[string]*spareEntry   // key -> ready spare
	filling map[string]chan struct{} // key -> closed when its refill ends
	gen     map[string]int           // bumped by dropSpare: a refill under an older one is void
	closed  bool
}

type spareEntry struct {
	s *criu.Spare
	// A dump spare serves a dump of this tree, leaving these namespace
	// types out of the images.
	init    sandbox.Init
	outside int
}

// dumpKey is the key of a sandbox's dump spare (a restore spare's is the
// sandbox's ID).
func dumpKey(id string) string { return "dump:" + id }

// takeSpare takes the sandbox's ready restore spare, if any.
func (m *Manager) takeSpare(id string) *criu.Spare {
	if e := m.takeEntry(id); e != nil {
		// Its restore is the caller's: a standby's room covers its CRIU.
		m.releaseRoom(id, spareRoom)
		return e.s
	}
	return nil
}

// spareRoom is the key of a restore spare's room in its sandbox's limits
// (limits.go).
const spareRoom = "spare"

// takeDumpSpare takes the sandbox's ready dump spare if it runs in the
// namespaces a dump of rec's tree leaving outside out needs; a stale one
// is killed.
func (m *Manager) takeDumpSpare(rec sandboxRec, outside int) *criu.Spare {
	e := m.takeEntry(dumpKey(rec.ID))
	if e == nil {
		return nil
	}
	if e.init != rec.Init || e.outside != outside {
		go e.s.Kill() // waits for its exit: not on the checkpoint's path
		return nil
	}
	return e.s
}

func (m *Manager) takeEntry(key string) *spareEntry {
	m.spr.mu.Lock()
	defer m.spr.mu.Unlock()
	e := m.spr.m[key]
	delete(m.spr.m, key)
	return e
}

// refillSpare starts a restore spare for the sandbox in the background,
// in its cgroup cg, unless one is ready or on its way.
func (m *Manager) refillSpare(id string, cg *cgroup.Cgroup) {
	tool := m.criu
	if tool == nil {
		return
	}
	m.refill(id, func() (*spareEntry, error) {
		// In the sandbox's cgroup namespace, which the tree it restores
		// inherits.
		var join []ns.Ref
		if rec, ok := m.sandboxRecord(id); ok {
			cgns, err := m.cgroupNS(rec, cg)
			if err != nil {
				return nil, err
			}
			if cgns.File != nil {
				defer cgns.File.Close()
				join = append(join, cgns)
			}
		}
		s, err := tool.StartSpare(join...)
		if err != nil {
			return nil, err
		}
		// Not against the sandbox's own limits.
		if rec, ok := m.sandboxRecord(id); ok {
			if err := m.reserveRoom(rec, spareRoom, room{mem: spareRoomBytes, pids: 1}); err != nil {
				s.Kill()
				return nil, err
			}
		}
		if err := cg.Add(s.Pid()); err != nil {
			s.Kill()
			m.releaseRoom(id, spareRoom)
			return nil, err
		}
		return &spareEntry{s: s}, nil
	})
}

// refillDumpSpare starts a dump spare for rec's tree in the background,
// in its namespaces of the types outside.
func (m *Manager) refillDumpSpare(rec sandboxRec, outside int) {
	tool := m.criu
	if tool == nil || outside == 0 {
		return
	}
	m.refill(dumpKey(rec.ID), func() (*spareEntry, error) {
		nss, err := ns.Open(rec.Init.Pid, outside)
		if err != nil {
			return nil, err
		}
		defer ns.Close(nss)
		s, err := tool.StartSpareIn(nss)
		if err != nil {
			return nil, err
		}
		return &spareEntry{s: s, init: rec.Init, outside: outside}, nil
	})
}

// refill runs start in the background and keeps its spare under key,
// unless one is ready or on its way there.
func (m *Manager) refill(key string, start func() (*spareEntry, error)) {
	m.spr.mu.Lock()
	if m.spr.closed || m.spr.m[key] != nil || m.spr.filling[key] != nil {
		m.spr.mu.Unlock()
		return
	}
	if m.spr.filling == nil {
		m.spr.filling, m.spr.m, m.spr.gen = map[string]chan struct{}{}, map[string]*spareEntry{}, map[string]int{}
	}
	done := make(chan struct{})
	m.spr.filling[key] = done
	gen := m.spr.gen[key]
	m.spr.mu.Unlock()
	m.sby.wg.Add(1)
	go func() {
		defer m.sby.wg.Done()
		defer close(done)
		e, err := start()
		m.spr.mu.Lock()
		delete(m.spr.filling, key)
		if err == nil && !m.spr.closed && m.spr.gen[key] == gen {
			m.spr.m[key], e = e, nil
		}
		m.spr.mu.Unlock()
		if err != nil {
			m.log.Debug("no spare CRIU", "spare", key, "err", err)
		} else if e != nil {
			e.s.Kill()
			m.releaseRoom(key, spareRoom)
		}
	}()
}

// dropSpare kills the sandbox's spares and waits for refills in flight
// (whose results are then killed): after it, no spare of the sandbox
// lives in its cgroup or its namespaces until the next refill. Callers
// about to kill or remove the sandbox call it first.
func (m *Manager) dropSpare(id string) {
	m.dropKey(id)
	m.dropKey(dumpKey(id))
}

// dropKey kills the spare under key and waits for a refill in flight.
func (m *Manager) dropKey(key string) {
	m.spr.mu.Lock()
	e := m.spr.m[key]
	delete(m.spr.m, key)
	done := m.spr.filling[key]
	if m.spr.gen != nil {
		m.spr.gen[key]++
	}
	m.spr.mu.Unlock()
	if e != nil {
		e.s.Kill()
	}
	if done != nil {
		<-done
	}
	m.releaseRoom(key, spareRoom) // a dump spare's key has none
}

// closeSpares kills every spare; no refill starts after it.
func (m *Manager) closeSpares() {
	m.spr.mu.Lock()
	m.spr.closed = true
	keys := make([]string, 0, len(m.spr.m)+len(m.spr.filling))
	for k := range m.spr.m {
		keys = append(keys, k)
	}
	for k := range m.spr.filling {
		keys = append(keys, k)
	}
	m.spr.mu.Unlock()
	for _, k := range keys {
		m.dropKey(k)
	}
}
