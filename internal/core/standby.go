package core

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
	"golang.org/x/sys/unix"
)

// standby is a pre-restored full checkpoint (see hot.Standby). The
// table, its waiters and the budget arithmetic are internal/hot's; what
// needs the sandbox's record, cgroup, CRIU or the checkpoint artifact
// (preparing, promoting, adopting) is here.
type standby = hot.Standby

// newStandbys makes the manager's standby table, its hooks over the
// sandboxes' records and the job scheduler.
func (m *Manager) newStandbys() *hot.Standbys {
	return hot.NewStandbys(hot.StandbyHooks{
		Head: func(id string) (string, bool) {
			var rec sandboxRec
			if m.db.Get(meta.Sandboxes, id, &rec) != nil {
				return "", false
			}
			return rec.Head, true
		},
		Prepare: func(id string) (<-chan struct{}, bool) {
			done := make(chan struct{})
			select {
			case <-m.closing:
				close(done)
				return done, false
			default:
			}
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
			// Unscheduled, the job runs whatever happens: wait for it.
			return done, m.sch == nil
		},
		Release: func(s *standby) {
			m.releaseRoom(s.Sandbox, s.Room)
			_ = removeTree(s.Root)
			m.forgetTakeover(s.Key)
		},
	})
}

// standbyOf returns the standby of the sandbox's head, if one is ready.
func (m *Manager) standbyOf(id string) *standby {
	var rec sandboxRec
	if m.db.Get(meta.Sandboxes, id, &rec) != nil {
		return nil
	}
	return m.sby.Get(id, rec.Head)
}

// standbyCheckpoints lists the checkpoints with a standby ready.
func (m *Manager) standbyCheckpoints(id string) []string { return m.sby.Checkpoints(id) }

// standbyBytes is the memory the sandbox's standbys hold.
func (m *Manager) standbyBytes(id string) int64 { return m.sby.Bytes(id) }

// discard kills the standby's processes (with kill; else they are gone
// already), removes its root and deletes its takeover record.
func (m *Manager) discard(s *standby, kill bool) { m.sby.Discard(s, kill) }

// dropStandby forgets the sandbox's standbys, killing their processes
// unless they are already gone, and removes their roots.
func (m *Manager) dropStandby(id string, kill bool) { m.sby.Drop(id, kill) }

// dropStandbyOf drops the sandbox's standby of checkpoint ck, if any.
func (m *Manager) dropStandbyOf(id, ck string, kill bool) { m.sby.DropOf(id, ck, kill) }

// takeStandby takes the sandbox's standby of checkpoint ck out of the
// pool.
func (m *Manager) takeStandby(id, ck string) *standby { return m.sby.Take(id, ck) }

// scheduleStandby prepares, in the background, the standbys the policy
// wants for the sandbox, once its head has stayed put for standbyDelay.
func (m *Manager) scheduleStandby(id string) {
	m.scheduleStandbyAfter(id, standbyDelay)
}

func (m *Manager) scheduleStandbyAfter(id string, delay time.Duration) {
	if m.cfg.StandbyBudget <= 0 || m.criu == nil {
		return
	}
	m.sby.Schedule(id, delay)
}

const standbyDelay = hot.Delay

// wantedStandbys lists, in order, the checkpoints the policy wants
// standbys for: the head if full, then kept full checkpoints, newest
// first.
func (m *Manager) wantedStandbys(rec sandboxRec) []checkpointRec {
	var out []checkpointRec
	var head checkpointRec
	if rec.Head != "" && m.db.Get(meta.Checkpoints, rec.Head, &head) == nil && head.Kind == v1.KindFull {
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

// admitStandbys keeps the wanted checkpoints whose standbys fit the
// sandbox's budget and the host's (hot.Admit).
func (m *Manager) admitStandbys(rec sandboxRec, wanted []checkpointRec) (admitted []checkpointRec, refused error) {
	return hot.Admit(rec.ID, m.sandboxStandbyBudget(rec), m.cfg.StandbyBudget, m.sby.OthersBytes(rec.ID), wanted,
		func(c checkpointRec) (string, int64) { return c.ID, c.ImageBytes })
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
		if s := m.sby.Get(id, c.ID); s == nil || !s.Init.Alive() {
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
	var victims []hot.Task
	// A key shredded while the standby was restored: it must not outlive
	// the state it copies (ShredDataKeys).
	err = m.keyAlive(ck)
	if err == nil && rec.Resources.MemoryBytes > 0 {
		var tree []int
		if tree, _, err = m.treePids(id, init); err == nil {
			victims, err = hot.FirstVictims(tree)
		}
	}
	// Recorded before a rollback can promote it, so that the promotion
	// itself writes nothing more than it did without the record.
	var key string
	if err == nil {
		key, err = m.recordTakeover(id, "standby-"+newID(), hot.Record{Init: init, Path: root, Head: ck.ID})
	}
	if err != nil {
		_ = init.Signal(unix.SIGKILL)
		waitGone(init, 5*time.Second)
		m.releaseRoom(id, roomKey)
		_ = removeTree(root)
		return false, err
	}
	m.sby.Put(&standby{Sandbox: id, Checkpoint: ck.ID, Init: init, Root: root, Bytes: ck.ImageBytes, Key: key,
		Room: roomKey, Tasks: victims, OOMSeen: oomSeen})
	return len(missing) > 1, nil
}

// promote makes the standby s the sandbox's live tree: the old tree is
// killed, the standby's tasks continue, its root becomes the sandbox's.
// Caller holds the sandbox lock and has taken s out of the pool.
func (m *Manager) promote(ctx context.Context, rec *sandboxRec, ck checkpointRec, s *standby) (meta.RollbackResult, error) {
	if !s.Init.Alive() {
		m.discard(s, false)
		return meta.RollbackResult{}, fmt.Errorf("standby of %s is gone", ck.ID)
	}
	if err := m.keyAlive(ck); err != nil {
		m.discard(s, true)
		return meta.RollbackResult{}, err
	}
	// A task of it may have met the OOM killer (its first choice in the
	// cgroup) since watchRooms last looked.
	if len(s.Tasks) > 0 && m.oomKills(rec.ID) != s.OOMSeen && !s.Intact() {
		m.discard(s, true)
		return meta.RollbackResult{}, fmt.Errorf("standby of %s lost a task", ck.ID)
	}
	if err := hot.RestoreAdj(s.Tasks); err != nil {
		m.discard(s, true)
		return meta.RollbackResult{}, fmt.Errorf("standby of %s: %w", ck.ID, err)
	}
	old := rec.Init
	// The standby runs first; then it takes over (the old tree, in its
	// own namespaces and on its own root, goes in the background).
	// The turn inspector follows the standby's tree before it runs.
	ts := m.turns.Prepare(rec.ID, s.Init)
	if err := m.continueTree(*rec, s.Init, m.ckImages(ck.ID)); err != nil {
		ts.Abandon()
		m.discard(s, true)
		return meta.RollbackResult{}, err
	}
	if err := m.takeOver(rec, s.Init, s.Root); err != nil {
		ts.Abandon()
		m.discard(s, true)
		return meta.RollbackResult{}, err
	}
	rec.Init, rec.State, rec.Reason, rec.Head, rec.IDs = s.Init, v1.StateRunning, "", ck.ID, ck.IDs
	if err := m.netActivate(*rec, s.Init); err != nil {
		m.log.Warn("egress: the promoted standby has no network", "sandbox", rec.ID, "err", err)
	}
	// The promoted tree is charged as the tree it replaces: the room
	// goes once that one has exited.
	m.releaseWhenGone(rec.ID, s.Room, old)
	ts.BaselineAsync()
	if err := m.commitTakeover(*rec, s.Key); err != nil {
		return meta.RollbackResult{}, err
	}
	return meta.RollbackResult{Sandbox: rec.ID, Checkpoint: ck.ID, Tier: v1.TierHot}, nil
}

// adoptStandby makes a standby taken from another sandbox's pool the tree
// of the new sandbox rec (a fork), whose root is already the standby's:
// the fork's identity is written, the stopped tree moves into the new
// cgroup, gets the fork's hostname and continues.
func (m *Manager) adoptStandby(rec *sandboxRec, s *standby, cg *cgroup.Cgroup) (sandbox.Init, error) {
	if !s.Init.Alive() {
		return sandbox.Init{}, fmt.Errorf("standby of %s is gone", s.Checkpoint)
	}
	if len(s.Tasks) > 0 && m.oomKills(s.Sandbox) != s.OOMSeen && !s.Intact() {
		return sandbox.Init{}, fmt.Errorf("standby of %s lost a task", s.Checkpoint)
	}
	if err := hot.RestoreAdj(s.Tasks); err != nil {
		return sandbox.Init{}, fmt.Errorf("standby of %s: %w", s.Checkpoint, err)
	}
	if err := m.withHeadroom(*rec, func() error { return sandbox.WriteIdentity(m.sbRoot(rec.ID), rec.Hostname, rec.MachineID) }); err != nil {
		return sandbox.Init{}, err
	}
	tree, _, err := m.treePids(s.Sandbox, s.Init)
	if err != nil {
		return sandbox.Init{}, err
	}
	for _, pid := range tree {
		if err := cg.Add(pid); err != nil {
			return sandbox.Init{}, fmt.Errorf("move standby process %d: %w", pid, err)
		}
	}
	if err := sandbox.SetHostname(s.Init.Pid, rec.Hostname); err != nil {
		return sandbox.Init{}, err
	}
	if err := m.continueTree(*rec, s.Init, m.ckImages(s.Checkpoint)); err != nil {
		return sandbox.Init{}, err
	}
	// The moved tree's memory stays charged to the sandbox it was
	// restored in (the kernel moves no charges), whose room therefore
	// stays until the tree exits.
	m.releaseWhenGone(s.Sandbox, s.Room, s.Init)
	s.Room = ""
	return s.Init, nil
}

// continueTree sends SIGCONT to every process of the sandbox's cgroup
// that lives in init's PID namespace (a tree restored stopped), but for
// those the images it was restored from (a checkpoint's images
// directory) record as stopped by job control: they were stopped at the
// instant and stay so (CRIU restored them stopped). Images that cannot
// be read leave every process to be continued, as a tree with no
// stopped process is.
func (m *Manager) continueTree(rec sandboxRec, init sandbox.Init, images string) error {
	tree, _, err := m.treePids(rec.ID, init)
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
	if m.db.Get(meta.Checkpoints, id, &ck) == nil {
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
func (m *Manager) treePids(id string, init sandbox.Init) (tree, others []int, err error) {
	cg, err := cgroup.Load(m.cgroupName(id))
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
		tree, strays, _ := m.treePids(rec.ID, rec.Init)
		if cg, err := cgroup.Load(m.cgroupName(rec.ID)); err == nil {
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
