package core

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
	"github.com/molt-sh/molt/internal/store"
	"golang.org/x/sys/unix"
)

// A standby is a sandbox's full checkpoint restored ahead of need: its
// processes restored by CRIU, stopped, on their own writable snapshot of
// the checkpoint's files, in the sandbox's cgroup. A rollback to that
// checkpoint promotes it (continue the standby, kill the live tree,
// switch the root): the hot tier, with no CRIU on the critical path.
//
// Policy: a sandbox keeps standbys for the checkpoints a rollback most
// likely returns to: its head, when the head is a full checkpoint, and
// the full checkpoints the caller marked to keep (newest first). They
// are made in the background, one at a time, once the head has stayed
// put for standbyDelay. Their memory (the size of their checkpoints'
// images) is bounded per sandbox (v1.Resources.StandbyBudgetBytes, or
// Config.SandboxStandbyBudget) and across the host
// (Config.StandbyBudget): the wanted checkpoints are admitted in that
// order while they fit both, and a sandbox's standbys that no longer
// fit (a new head before kept ones) are evicted; other sandboxes'
// standbys are not. Standbys live only in the daemon: a
// restarted daemon kills the ones it finds and makes new ones on the
// next checkpoint or rollback.
type standby struct {
	sandbox string // whose pool it is in
	ck      string
	init    sandbox.Init
	root    string
	bytes   int64
	key     string // of its takeover record (takeoverRec)
	// Its room in the sandbox's limits (limits.go), its tasks, and the
	// OOM kills of the cgroup when it was made.
	room    string
	tasks   []standbyTask
	oomSeen int64
}

type standbys struct {
	mu sync.Mutex
	m  map[string]map[string]*standby // sandbox ID -> checkpoint ID -> standby
	// waiting marks sandboxes with a scheduleStandby waiter.
	waiting map[string]bool
	wg      sync.WaitGroup // preparations and retirements in flight
}

// standbyOf returns the standby of the sandbox's head, if one is ready.
func (m *Manager) standbyOf(id string) *standby {
	var rec sandboxRec
	if m.db.Get(store.Sandboxes, id, &rec) != nil {
		return nil
	}
	m.sby.mu.Lock()
	defer m.sby.mu.Unlock()
	return m.sby.m[id][rec.Head]
}

// standbyCheckpoints lists the checkpoints with a standby ready.
func (m *Manager) standbyCheckpoints(id string) []string {
	m.sby.mu.Lock()
	defer m.sby.mu.Unlock()
	var out []string
	for ck := range m.sby.m[id] {
		out = append(out, ck)
	}
	sort.Strings(out)
	return out
}

// standbyBytes is the memory the sandbox's standbys hold.
func (m *Manager) standbyBytes(id string) int64 {
	m.sby.mu.Lock()
	defer m.sby.mu.Unlock()
	var n int64
	for _, s := range m.sby.m[id] {
		n += s.bytes
	}
	return n
}

// discard kills the standby's processes (with kill; else they are gone
// already), removes its root and deletes its takeover record.
func (m *Manager) discard(s *standby, kill bool) {
	if kill && s.init.Signal(unix.SIGKILL) == nil {
		waitGone(s.init, 5*time.Second)
	}
	m.releaseRoom(s.sandbox, s.room)
	_ = removeTree(s.root)
	m.forgetTakeover(s.key)
}

// dropStandby forgets the sandbox's standbys, killing their processes
// unless they are already gone, and removes their roots.
func (m *Manager) dropStandby(id string, kill bool) {
	m.sby.mu.Lock()
	set := m.sby.m[id]
	delete(m.sby.m, id)
	m.sby.mu.Unlock()
	for _, s := range set {
		m.discard(s, kill)
	}
}

// dropStandbyOf drops the sandbox's standby of checkpoint ck, if any.
func (m *Manager) dropStandbyOf(id, ck string, kill bool) {
	if s := m.takeStandby(id, ck); s != nil {
		m.discard(s, kill)
	}
}

// takeStandby takes the sandbox's standby of checkpoint ck out of the
// pool.
func (m *Manager) takeStandby(id, ck string) *standby {
	m.sby.mu.Lock()
	defer m.sby.mu.Unlock()
	s := m.sby.m[id][ck]
	if s != nil {
		delete(m.sby.m[id], ck)
	}
	return s
}

// scheduleStandby prepares, in the background, the standbys the policy
// wants for the sandbox, once its head has stayed put for standbyDelay.
func (m *Manager) scheduleStandby(id string) {
	m.scheduleStandbyAfter(id, standbyDelay)
}

func (m *Manager) scheduleStandbyAfter(id string, delay time.Duration) {
	if m.cfg.StandbyBudget <= 0 || m.criu == nil {
		return
	}
	// One waiter per sandbox: it follows the head until it stays put.
	m.sby.mu.Lock()
	if m.sby.waiting == nil {
		m.sby.waiting = map[string]bool{}
	}
	if m.sby.waiting[id] {
		m.sby.mu.Unlock()
		return
	}
	m.sby.waiting[id] = true
	m.sby.mu.Unlock()
	var head string
	var rec sandboxRec
	if m.db.Get(store.Sandboxes, id, &rec) == nil {
		head = rec.Head
	}
	m.sby.wg.Add(1)
	go func() {
		defer m.sby.wg.Done()
		// Wait until the head has stayed put for delay: a caller that
		// moves the sandbox again at once (a tree search, an RL loop)
		// would make a standby of it useless, and its CRIU restore would
		// only take CPU from the foreground. (An fs checkpoint moves the
		// head too; the kept standbys are still wanted then.)
		for {
			select {
			case <-time.After(delay):
			case <-m.closing:
				m.standbyWaitDone(id)
				return
			}
			if m.db.Get(store.Sandboxes, id, &rec) != nil {
				m.standbyWaitDone(id)
				return
			}
			if rec.Head == head {
				break
			}
			head = rec.Head
		}
		m.standbyWaitDone(id)
		done := make(chan struct{})
		m.background(id, sched.Standby, "prepare standby", func(ctx context.Context, _ *sched.Task) error {
			defer close(done)
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			more, err := m.prepareStandby(ctx, id)
			if err != nil {
				m.log.Info("no standby", "sandbox", id, "reason", err)
				return err
			}
			if more {
				m.scheduleStandbyAfter(id, 0)
			}
			return nil
		})
		if m.sch == nil {
			<-done
			return
		}
		// A job dropped at Close never runs: do not wait for it then.
		select {
		case <-done:
		case <-m.closing:
		}
	}()
}

func (m *Manager) standbyWaitDone(id string) {
	m.sby.mu.Lock()
	delete(m.sby.waiting, id)
	m.sby.mu.Unlock()
}

// standbyDelay is how long a sandbox's head must stay put before a
// standby is prepared for it. An agent waiting for its model leaves it
// far longer.
const standbyDelay = 100 * time.Millisecond

// wantedStandbys lists, in order, the checkpoints the policy wants
// standbys for: the head if full, then kept full checkpoints, newest
// first.
func (m *Manager) wantedStandbys(rec sandboxRec) []checkpointRec {
	var out []checkpointRec
	var head checkpointRec
	if rec.Head != "" && m.db.Get(store.Checkpoints, rec.Head, &head) == nil && head.Kind == v1.KindFull {
		out = append(out, head)
	}
	cks, _ := m.checkpointsOf(rec.ID)
	for i := len(cks) - 1; i >= 0; i-- {
		if c := cks[i]; c.Keep && c.Kind == v1.KindFull && c.ID != rec.Head {
			out = append(out, c)
		}
	}
	return out
}

// sandboxStandbyBudget is the bound of the sandbox's standbys' memory
// (before the host's): -1 for none allowed, 0 for no bound of its own.
func (m *Manager) sandboxStandbyBudget(rec sandboxRec) int64 {
	if b := rec.Resources.StandbyBudgetBytes; b != 0 {
		return b
	}
	return m.cfg.SandboxStandbyBudget
}

// admitStandbys keeps, in order, the wanted checkpoints whose standbys
// fit the sandbox's budget and what the other sandboxes' standbys leave
// of the host's; refused says why the first one left out was (nil if
// none was).
func (m *Manager) admitStandbys(rec sandboxRec, wanted []checkpointRec) (admitted []checkpointRec, refused error) {
	own := m.sandboxStandbyBudget(rec)
	if own < 0 {
		if len(wanted) > 0 {
			refused = fmt.Errorf("sandbox %s allows no standbys", rec.ID)
		}
		return nil, refused
	}
	m.sby.mu.Lock()
	var others int64
	for id, set := range m.sby.m {
		if id == rec.ID {
			continue
		}
		for _, s := range set {
			others += s.bytes
		}
	}
	m.sby.mu.Unlock()
	var sum int64
	for _, c := range wanted {
		switch {
		case own > 0 && sum+c.ImageBytes > own:
			if refused == nil {
				refused = fmt.Errorf("standby of %s needs %d bytes; the sandbox's standbys before it take %d of its budget of %d", c.ID, c.ImageBytes, sum, own)
			}
		case others+sum+c.ImageBytes > m.cfg.StandbyBudget:
			if refused == nil {
				refused = fmt.Errorf("standby of %s needs %d bytes; %d of the host's budget of %d are taken", c.ID, c.ImageBytes, others+sum, m.cfg.StandbyBudget)
			}
		default:
			admitted = append(admitted, c)
			sum += c.ImageBytes
		}
	}
	return admitted, refused
}

// prepareStandby drops the sandbox's standbys the policy no longer wants
// and prepares the first wanted one that is missing; more reports that
// others are still missing.
func (m *Manager) prepareStandby(ctx context.Context, id string) (more bool, err error) {
	rec, unlock, err := m.lockSandbox(id)
	if err != nil {
		return false, err
	}
	defer unlock()
	if m.report(rec).State != v1.StateRunning {
		return false, nil
	}
	wanted, refused := m.admitStandbys(rec, m.wantedStandbys(rec))
	want := map[string]bool{}
	for _, c := range wanted {
		want[c.ID] = true
	}
	for _, ck := range m.standbyCheckpoints(id) {
		if !want[ck] {
			m.dropStandbyOf(id, ck, true)
		}
	}
	var missing []checkpointRec
	for _, c := range wanted {
		m.sby.mu.Lock()
		s := m.sby.m[id][c.ID]
		m.sby.mu.Unlock()
		if s == nil || !s.init.Alive() {
			m.dropStandbyOf(id, c.ID, true)
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return false, refused
	}
	ck := missing[0]
	if err := m.verify(ck, false); err != nil {
		return false, err
	}
	root := filepath.Join(m.sbDir(id), "standby-"+ck.ID)
	if err := removeTree(root); err != nil {
		return false, err
	}
	// The snapshot commits the pool: not while a capture is under way on
	// this host (commitgate.go).
	releaseCommits, err := m.commits.background(ctx)
	if err != nil {
		return false, err
	}
	err = fsnap.SnapshotIn(m.ckFS(ck.ID), root, false, m.groupsOfID(id)...)
	releaseCommits()
	if err != nil {
		return false, err
	}
	// The standby does not count against the sandbox's own limits: they
	// are raised by its room first (limits.go).
	tasks, err := criu.TreeTasks(m.ckImages(ck.ID))
	if err != nil {
		_ = removeTree(root)
		return false, err
	}
	roomKey := "standby-" + newID()
	if err := m.reserveRoom(rec, roomKey, standbyRoom(ck, tasks)); err != nil {
		_ = removeTree(root)
		return false, err
	}
	oomSeen := m.oomKills(id)
	init, err := m.restoreTree(ctx, &rec, ck, root, true, true, true)
	if err != nil {
		m.releaseRoom(id, roomKey)
		_ = removeTree(root)
		return false, err
	}
	// Only a memory limit makes the standby compete with the sandbox's
	// own tasks for the OOM killer; the others pay nothing at promotion.
	var victims []standbyTask
	if rec.Resources.MemoryBytes > 0 {
		victims, err = firstVictims(id, init)
	}
	// Recorded before a rollback can promote it, so that the promotion
	// itself writes nothing more than it did without the record.
	var key string
	if err == nil {
		key, err = m.recordTakeover(id, "standby-"+newID(), takeoverRec{Init: init, Path: root, Head: ck.ID})
	}
	if err != nil {
		_ = init.Signal(unix.SIGKILL)
		waitGone(init, 5*time.Second)
		m.releaseRoom(id, roomKey)
		_ = removeTree(root)
		return false, err
	}
	m.sby.mu.Lock()
	if m.sby.m == nil {
		m.sby.m = map[string]map[string]*standby{}
	}
	if m.sby.m[id] == nil {
		m.sby.m[id] = map[string]*standby{}
	}
	m.sby.m[id][ck.ID] = &standby{sandbox: id, ck: ck.ID, init: init, root: root, bytes: ck.ImageBytes, key: key,
		room: roomKey, tasks: victims, oomSeen: oomSeen}
	m.sby.mu.Unlock()
	return len(missing) > 1, nil
}

// promote makes the standby s the sandbox's live tree: the old tree is
// killed, the standby's tasks continue, its root becomes the sandbox's.
// Caller holds the sandbox lock and has taken s out of the pool.
func (m *Manager) promote(ctx context.Context, rec *sandboxRec, ck checkpointRec, s *standby) (v1.RollbackResult, error) {
	if !s.init.Alive() {
		m.discard(s, false)
		return v1.RollbackResult{}, fmt.Errorf("standby of %s is gone", ck.ID)
	}
	// A task of it may have met the OOM killer (its first choice in the
	// cgroup) since watchRooms last looked.
	if len(s.tasks) > 0 && m.oomKills(rec.ID) != s.oomSeen && !s.intact() {
		m.discard(s, true)
		return v1.RollbackResult{}, fmt.Errorf("standby of %s lost a task", ck.ID)
	}
	if err := restoreAdj(s.tasks); err != nil {
		m.discard(s, true)
		return v1.RollbackResult{}, fmt.Errorf("standby of %s: %w", ck.ID, err)
	}
	old := rec.Init
	// The standby runs first; then it takes over (the old tree, in its
	// own namespaces and on its own root, goes in the background).
	// The turn inspector follows the standby's tree before it runs.
	ts := m.turns.Prepare(rec.ID, s.init)
	if err := continueTree(*rec, s.init, m.ckImages(ck.ID)); err != nil {
		ts.Abandon()
		m.discard(s, true)
		return v1.RollbackResult{}, err
	}
	if err := m.takeOver(rec, s.init, s.root); err != nil {
		ts.Abandon()
		m.discard(s, true)
		return v1.RollbackResult{}, err
	}
	rec.Init, rec.State, rec.Reason, rec.Head, rec.IDs = s.init, v1.StateRunning, "", ck.ID, ck.IDs
	// The promoted tree is charged as the tree it replaces: the room
	// goes once that one has exited.
	m.releaseWhenGone(rec.ID, s.room, old)
	ts.BaselineAsync()
	if err := m.commitTakeover(*rec, s.key); err != nil {
		return v1.RollbackResult{}, err
	}
	return v1.RollbackResult{Sandbox: rec.ID, Checkpoint: ck.ID, Tier: v1.TierHot}, nil
}

// adoptStandby makes a standby taken from another sandbox's pool the tree
// of the new sandbox rec (a fork), whose root is already the standby's:
// the fork's identity is written, the stopped tree moves into the new
// cgroup, gets the fork's hostname and continues.
func (m *Manager) adoptStandby(rec *sandboxRec, s *standby, cg *cgroup.Cgroup) (sandbox.Init, error) {
	if !s.init.Alive() {
		return sandbox.Init{}, fmt.Errorf("standby of %s is gone", s.ck)
	}
	if len(s.tasks) > 0 && m.oomKills(s.sandbox) != s.oomSeen && !s.intact() {
		return sandbox.Init{}, fmt.Errorf("standby of %s lost a task", s.ck)
	}
	if err := restoreAdj(s.tasks); err != nil {
		return sandbox.Init{}, fmt.Errorf("standby of %s: %w", s.ck, err)
	}
	if err := m.withHeadroom(*rec, func() error { return sandbox.WriteIdentity(m.sbRoot(rec.ID), rec.Hostname, rec.MachineID) }); err != nil {
		return sandbox.Init{}, err
	}
	tree, _, err := treePids(s.sandbox, s.init)
	if err != nil {
		return sandbox.Init{}, err
	}
	for _, pid := range tree {
		if err := cg.Add(pid); err != nil {
			return sandbox.Init{}, fmt.Errorf("move standby process %d: %w", pid, err)
		}
	}
	if err := sandbox.SetHostname(s.init.Pid, rec.Hostname); err != nil {
		return sandbox.Init{}, err
	}
	if err := continueTree(*rec, s.init, m.ckImages(s.ck)); err != nil {
		return sandbox.Init{}, err
	}
	// The moved tree's memory stays charged to the sandbox it was
	// restored in (the kernel moves no charges), whose room therefore
	// stays until the tree exits.
	m.releaseWhenGone(s.sandbox, s.room, s.init)
	s.room = ""
	return s.init, nil
}

// continueTree sends SIGCONT to every process of the sandbox's cgroup
// that lives in init's PID namespace (a tree restored stopped), but for
// those the images it was restored from (a checkpoint's images
// directory) record as stopped by job control: they were stopped at the
// instant and stay so (CRIU restored them stopped). Images that cannot
// be read leave every process to be continued, as a tree with no
// stopped process is.
func continueTree(rec sandboxRec, init sandbox.Init, images string) error {
	tree, _, err := treePids(rec.ID, init)
	if err != nil {
		return err
	}
	stopped, _ := criu.StoppedTasks(images)
	level := -1
	if len(stopped) > 0 {
		if ids, err := nsPids(init.Pid); err == nil {
			level = len(ids) - 1
		}
	}
	for _, pid := range tree {
		if level >= 0 {
			if ids, err := nsPids(pid); err == nil && len(ids) > level && stopped[ids[level]] {
				continue
			}
		}
		_ = unix.Kill(pid, unix.SIGCONT)
	}
	return nil
}

// headImages returns the images directory of the processes of
// checkpoint id: its own, or for an fs checkpoint its full ancestor's.
func (m *Manager) headImages(id string) string {
	var ck checkpointRec
	if m.db.Get(store.Checkpoints, id, &ck) == nil {
		if p, ok := m.processSource(ck); ok {
			return m.ckImages(p.ID)
		}
	}
	return m.ckImages(id)
}

// nsPids returns pid's numbers in each of its PID namespaces, the
// host's first (NSpid in /proc/PID/status).
func nsPids(pid int) ([]int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			var out []int
			for _, f := range strings.Fields(v) {
				n, err := strconv.Atoi(f)
				if err != nil {
					return nil, fmt.Errorf("pid %d: NSpid %q", pid, v)
				}
				out = append(out, n)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("pid %d: no NSpid", pid)
}

// treePids splits the processes of sandbox id's cgroup into those of
// init's tree (in its PID namespace or one below it) and the others
// (standbys, CRIU at work, strays of an earlier daemon).
func treePids(id string, init sandbox.Init) (tree, others []int, err error) {
	cg, err := cgroup.Load(cgroupName(id))
	if err != nil {
		return nil, nil, err
	}
	pids, err := cg.Pids()
	if err != nil {
		return nil, nil, err
	}
	var ns unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(init.Pid)+"/ns/pid", &ns); err != nil {
		return nil, nil, fmt.Errorf("init %d: %w", init.Pid, err)
	}
	for _, pid := range pids {
		d, err := pidNSDepth(pid, ns.Ino)
		switch {
		case err != nil: // exited meanwhile
		case d >= 0:
			tree = append(tree, pid)
		default:
			others = append(others, pid)
		}
	}
	return tree, others, nil
}

// killStrays kills the processes of a sandbox's cgroup that are not in
// its live init's PID namespace (standbys of a previous daemon, a tree
// restored for a rollback that did not finish) and removes their roots
// and the retired roots a crash left.
func (m *Manager) killStrays(rec sandboxRec) {
	// The rooms of a previous daemon's standbys go with them.
	defer m.resetLimits(rec)
	dirs, _ := filepath.Glob(filepath.Join(m.sbDir(rec.ID), "standby-*"))
	retired, _ := filepath.Glob(filepath.Join(m.sbDir(rec.ID), "root.old-*"))
	dirs = append(dirs, retired...)
	dirs = append(dirs, filepath.Join(m.sbDir(rec.ID), "root.next"))
	if rec.Init.Alive() {
		// Killed through pidfds, and only while still in the sandbox's
		// cgroup: these PIDs were read before, from a previous daemon's
		// sandbox.
		tree, strays, _ := treePids(rec.ID, rec.Init)
		if cg, err := cgroup.Load(cgroupName(rec.ID)); err == nil {
			for _, pid := range strays {
				_ = cg.KillMember(pid)
			}
			// And a copy pid1 made of itself for a template capture the
			// daemon died in before it held the copy (copies.go).
			for _, pid := range pid1Copies(rec.Init.Pid, tree) {
				_ = cg.KillMember(pid)
			}
		}
	}
	for _, d := range dirs {
		m.removeOrSetAside(d, "sandbox-"+rec.ID+"-"+filepath.Base(d), "a leftover of a rollback or a standby")
	}
}
