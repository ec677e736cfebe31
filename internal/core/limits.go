package core

import (
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

// The daemon keeps processes of its own in a sandbox's cgroup: standbys
// (a whole restored tree each), the spare CRIU of the next restore, the
// copies of a template capture until they are dumped. None of them may
// count against the sandbox's --memory and --pids, or a sandbox using
// more than half of its memory is OOM-killed by its own standby and one
// near its pids limit gets none. So the daemon raises the cgroup's
// limits by exactly the room each of them takes (a room: its memory and
// its tasks) while it is there, and lowers them again once it is gone.
//
// They stay in the sandbox's cgroup rather than a sibling one because
// the kernel does not move memory charges with a task (cgroup v2 never
// does; v1's memory.move_charge_at_immigrate is refused on this kernel
// line): a standby restored in a sibling cgroup and moved in at its
// promotion would keep its memory charged outside the sandbox's limit
// for as long as the promoted tree lives. Kept in the cgroup, a promoted
// tree is charged exactly as the tree it replaces, and promotion writes
// no limit: the room of a promoted standby is given back once the old
// tree has exited (docs/architecture.md has the numbers).
//
// A sandbox that exceeds its own limit while the cgroup holds a room
// meets the OOM killer; the standby's tasks are made its first victims
// (oom_score_adj 1000, given back at promotion), and the room of a
// standby that lost a task is given back at once (watchRooms), so the
// sandbox's own processes get no more than their limit for longer than
// that.
type room struct{ mem, pids int64 }

type rooms struct {
	mu      sync.Mutex
	m       map[string]map[string]room // sandbox -> key -> room
	base    map[string]meta.Resources  // sandbox -> its own limits
	pending map[string]bool            // sandboxes whose limits are above what their rooms allow
	oom     map[string]int64           // oom kills last seen per sandbox
	// until when a sandbox's standbys are looked at on every tick: an
	// OOM-killed task takes a moment to exit.
	suspect map[string]time.Time // +checklocks:mu
	watch   sync.Once
	// watchRooms and releaseWhenGone's waiters, which end at Close (a
	// waiter can outlive everything else: a fork's tree).
	wg sync.WaitGroup
}

const (
	// restoreRoomBytes is what the restoring CRIU itself holds in the
	// cgroup besides the tree (its own memory, the restorer blob, the
	// image pages in flight).
	restoreRoomBytes = 16 << 20
	// spareRoomBytes is what an idle spare CRIU holds (measured 2-3 MiB
	// of charge; rounded up for other builds).
	spareRoomBytes = 8 << 20
	// roomsTick is how often watchRooms looks for OOM kills.
	roomsTick = 20 * time.Millisecond
)

// standbyRoom is the room of a standby of ck, whose tree has tasks tasks.
func standbyRoom(ck checkpointRec, tasks int64) room {
	// The images' pages plus the kernel's share of the tree (page
	// tables, stacks: under 1/32 of the pages here) and the CRIU that
	// restores it, which is one task more.
	return room{mem: ck.ImageBytes + ck.ImageBytes/32 + restoreRoomBytes, pids: tasks + 1}
}

func limited(r meta.Resources) bool { return r.MemoryBytes > 0 || r.Pids > 0 }

// limitsLocked is what the sandbox's cgroup limits are with its rooms.
// Caller holds m.lim.mu.
func (m *Manager) limitsLocked(id string) cgroup.Resources {
	return m.withRoomsLocked(id, m.lim.base[id])
}

// withRoomsLocked is what the cgroup limits of sandbox id, whose own
// limits are base, are with its rooms. The rooms hold memory and tasks;
// CPU and I/O weight stay the sandbox's own (restores and copies share
// its CPU quota). Caller holds m.lim.mu.
func (m *Manager) withRoomsLocked(id string, base meta.Resources) cgroup.Resources {
	res := cgResources(base)
	for _, r := range m.lim.m[id] {
		if res.MemoryMax > 0 {
			res.MemoryMax += r.mem
		}
		if res.PidsMax > 0 {
			res.PidsMax += r.pids
		}
	}
	return res
}

// reserveRoom raises the sandbox's limits by r, under key, before the
// daemon puts what r is for into its cgroup. A sandbox without limits
// needs no room.
func (m *Manager) reserveRoom(rec sandboxRec, key string, r room) error {
	if !limited(rec.Resources) {
		return nil
	}
	cg, err := cgroup.Load(m.cgroupName(rec.ID))
	if err != nil {
		return err
	}
	m.lim.watch.Do(func() {
		m.lim.wg.Add(1)
		go m.watchRooms()
	})
	m.lim.mu.Lock()
	defer m.lim.mu.Unlock()
	if m.lim.m == nil {
		m.lim.m, m.lim.base, m.lim.pending, m.lim.oom = map[string]map[string]room{}, map[string]meta.Resources{}, map[string]bool{}, map[string]int64{}
		m.lim.suspect = map[string]time.Time{}
	}
	if m.lim.m[rec.ID] == nil {
		m.lim.m[rec.ID] = map[string]room{}
		m.lim.oom[rec.ID], _ = cg.OOMKills()
	}
	m.lim.base[rec.ID] = rec.Resources
	m.lim.m[rec.ID][key] = r
	if err := cg.SetLimits(m.limitsLocked(rec.ID)); err != nil {
		delete(m.lim.m[rec.ID], key)
		m.lowerLocked(rec.ID)
		return err
	}
	return nil
}

// releaseRoom gives back the room under key, once what it was made for
// has left the cgroup (or is charged elsewhere no more).
func (m *Manager) releaseRoom(id, key string) {
	m.lim.mu.Lock()
	defer m.lim.mu.Unlock()
	if _, ok := m.lim.m[id][key]; !ok {
		return
	}
	delete(m.lim.m[id], key)
	m.lowerLocked(id)
}

// lowerLocked sets the sandbox's limits to what its rooms allow. v1
// refuses a memory limit below the charge it cannot reclaim (EBUSY):
// then the sandbox's own processes took a room's memory meanwhile (a
// standby they pushed into the OOM killer); the limit is clamped at the
// charge, so that they get no further, and lowered again on the next
// tick. (v2 reclaims and OOM-kills down to the limit instead.)
// Caller holds m.lim.mu.
func (m *Manager) lowerLocked(id string) {
	want := m.limitsLocked(id)
	done := func() {
		delete(m.lim.pending, id)
		if len(m.lim.m[id]) == 0 {
			delete(m.lim.m, id)
			delete(m.lim.base, id)
			delete(m.lim.oom, id)
		}
	}
	cg, err := cgroup.Load(m.cgroupName(id))
	if err != nil {
		done() // the sandbox is gone
		return
	}
	if err := cg.SetLimits(want); err == nil {
		done()
		return
	}
	m.lim.pending[id] = true
	if st, err := cg.Stats(); err == nil && want.MemoryMax > 0 && st.MemoryBytes > want.MemoryMax {
		clamp := want
		clamp.MemoryMax = st.MemoryBytes
		if cg.SetLimits(clamp) == nil {
			return
		}
	}
	m.log.Warn("cannot lower the sandbox's limits to its own", "sandbox", id, "memory", want.MemoryMax, "pids", want.PidsMax)
}

// watchRooms gives back the rooms of standbys that lost a task (to the
// OOM killer: the sandbox exceeded its own limit) and lowers limits that
// could not be lowered at once, until the Manager closes.
func (m *Manager) watchRooms() {
	defer m.lim.wg.Done()
	t := time.NewTicker(roomsTick)
	defer t.Stop()
	for {
		select {
		case <-m.closing:
			return
		case <-t.C:
		}
		var killed []string
		now := time.Now()
		m.lim.mu.Lock()
		for id := range m.lim.m {
			cg, err := cgroup.Load(m.cgroupName(id))
			if err != nil {
				continue
			}
			if n, err := cg.OOMKills(); err == nil && n != m.lim.oom[id] {
				m.lim.oom[id] = n
				m.lim.suspect[id] = now.Add(time.Second)
			}
		}
		for id, until := range m.lim.suspect {
			if now.After(until) {
				delete(m.lim.suspect, id)
			} else {
				killed = append(killed, id)
			}
		}
		for id := range m.lim.pending {
			m.lowerLocked(id)
		}
		m.lim.mu.Unlock()
		for _, id := range killed {
			m.dropBrokenStandbys(id)
		}
	}
}

// dropBrokenStandbys discards the sandbox's standbys that lost a task.
func (m *Manager) dropBrokenStandbys(id string) {
	for _, ck := range m.standbyCheckpoints(id) {
		if s := m.sby.Get(id, ck); s != nil && !s.Intact() {
			m.log.Info("standby lost a task (the sandbox exceeded its memory limit); dropped", "sandbox", id, "checkpoint", ck)
			m.dropStandbyOf(id, ck, true)
		}
	}
}

// resetLimits sets a sandbox's limits to its own, as a daemon finds
// them after a restart (the rooms of the previous one's standbys).
func (m *Manager) resetLimits(rec sandboxRec) {
	if !limited(rec.Resources) {
		return
	}
	if cg, err := cgroup.Load(m.cgroupName(rec.ID)); err == nil {
		_ = cg.SetLimits(cgResources(rec.Resources))
	}
}

// releaseWhenGone gives back the room under key of sandbox id once init
// has exited (the tree that held it), or when the Manager closes.
func (m *Manager) releaseWhenGone(id, key string, init sandbox.Init) {
	if key == "" {
		return
	}
	m.lim.wg.Add(1)
	go func() {
		defer m.lim.wg.Done()
		// A retired tree exits within milliseconds; a fork that adopted
		// a standby lives on, and is looked at less and less often.
		for wait := time.Millisecond; init.Alive(); wait = min(2*wait, time.Second) {
			select {
			case <-m.closing:
				return
			case <-time.After(wait):
			}
		}
		m.releaseRoom(id, key)
	}()
}

// sandboxRecord reads the sandbox's record (its own limits).
func (m *Manager) sandboxRecord(id string) (sandboxRec, bool) {
	var rec sandboxRec
	if m.db.Get(meta.Sandboxes, id, &rec) != nil {
		return rec, false
	}
	return rec, true
}

// oomKills is the count of OOM kills in sandbox id's cgroup (-1 if it
// cannot be read).
func (m *Manager) oomKills(id string) int64 {
	cg, err := cgroup.Load(m.cgroupName(id))
	if err != nil {
		return -1
	}
	n, err := cg.OOMKills()
	if err != nil {
		return -1
	}
	return n
}

// copiesRoom is the key of the room of checkpoint ck's template copies.
func copiesRoom(ck string) string { return "copies-" + ck }
