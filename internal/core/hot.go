package core

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
	"golang.org/x/sys/unix"
)

// This file joins internal/hot (standbys, spare CRIUs, retired roots,
// takeover records, the rollback tiers) to the manager: hot owns the
// tables and their goroutines, core hands it what it needs of a sandbox.

// openHot makes the manager's hot tables; Close closes them.
func (m *Manager) openHot() {
	m.sby = m.newStandbys()
	m.spr = hot.NewSpares(func(key string) { m.releaseRoom(key, spareRoom) }, func(key string, err error) {
		m.log.Debug("no spare CRIU", "spare", key, "err", err)
	})
	m.ret = hot.NewRetired(m.collectRetired, removeTree)
	m.tko = hot.NewTakeovers(m.db)
}

var waitGone = hot.WaitGone

// takeSpare takes the sandbox's ready restore spare, if any.
func (m *Manager) takeSpare(id string) *criu.Spare {
	if e := m.spr.Take(id); e != nil {
		// Its restore is the caller's: a standby's room covers its CRIU.
		m.releaseRoom(id, spareRoom)
		return e.S
	}
	return nil
}

// spareRoom is the key of a restore spare's room in its sandbox's limits
// (limits.go).
const spareRoom = "spare"

// takeDumpSpare takes the sandbox's ready dump spare if it runs in the
// namespaces a dump of rec's tree leaving outside out needs.
func (m *Manager) takeDumpSpare(rec sandboxRec, outside int) *criu.Spare {
	return m.spr.TakeDump(rec.ID, rec.Init, outside)
}

// refillSpare starts a restore spare for the sandbox in the background,
// in its cgroup cg, unless one is ready or on its way.
func (m *Manager) refillSpare(id string, cg *cgroup.Cgroup) {
	tool := m.criu
	if tool == nil {
		return
	}
	m.spr.Refill(id, func(context.Context) (*hot.Spare, error) {
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
		return &hot.Spare{S: s}, nil
	})
}

// refillDumpSpare starts a dump spare for rec's tree in the background,
// in its namespaces of the types outside.
func (m *Manager) refillDumpSpare(rec sandboxRec, outside int) {
	tool := m.criu
	if tool == nil || outside == 0 {
		return
	}
	m.spr.Refill(hot.DumpKey(rec.ID), func(context.Context) (*hot.Spare, error) {
		nss, err := ns.Open(rec.Init.Pid, outside)
		if err != nil {
			return nil, err
		}
		defer ns.Close(nss)
		s, err := tool.StartSpareIn(nss)
		if err != nil {
			return nil, err
		}
		return &hot.Spare{S: s, Init: rec.Init, Outside: outside}, nil
	})
}

// dropSpare kills the sandbox's spares and waits for refills in flight.
func (m *Manager) dropSpare(id string) { m.spr.Drop(id) }

// retire hands a root that a rollback replaced to the collector.
func (m *Manager) retire(id, root string, init sandbox.Init) { m.ret.Retire(id, root, init) }

// collectRetired deletes the sandbox's retired roots in a GC job.
func (m *Manager) collectRetired(id string, roots []hot.RetiredRoot) {
	select {
	case <-m.closing:
		return // the next start removes them
	default:
	}
	m.background(id, sched.GC, "remove retired roots", func(context.Context, *sched.Task) error {
		return m.ret.Remove(roots, m.retiredNotRemoved(id))
	})
}

// removeRetired deletes the sandbox's retired roots now, once their
// trees are gone. Callers have killed the sandbox's processes (it is not
// rolling back).
func (m *Manager) removeRetired(id string) {
	_ = m.ret.Remove(m.ret.Take(id), m.retiredNotRemoved(id))
}

func (m *Manager) retiredNotRemoved(id string) func(hot.RetiredRoot, error) {
	return func(r hot.RetiredRoot, err error) {
		m.log.Warn("old root not removed; the next start removes it", "sandbox", id, "root", r.Path, "err", err)
	}
}

// recordTakeover writes the takeover t of sandbox id (hot.Record) under
// the key id/name and returns the key.
func (m *Manager) recordTakeover(id, name string, t hot.Record) (string, error) {
	return m.tko.Record(id, name, t)
}

// commitTakeover writes the sandbox's record after a switch and deletes
// the switch's takeover record, in one transaction.
func (m *Manager) commitTakeover(rec sandboxRec, key string) error {
	return m.tko.Commit(key, func(tx *meta.Tx) error { return tx.Put(meta.Sandboxes, rec.ID, rec) })
}

// forgetTakeover deletes a takeover record that can no longer happen.
func (m *Manager) forgetTakeover(key string) {
	if err := m.tko.Forget(key); err != nil {
		m.log.Warn("cannot delete takeover record", "key", key, "err", err)
	}
}

// finishTakeovers completes, at start-up, the switches of sandboxes'
// live trees a crashed daemon left half done (see hot.Record), and
// deletes every takeover record. sbs are the sandboxes' records, updated
// in place.
func (m *Manager) finishTakeovers(ctx context.Context, sbs []sandboxRec) error {
	var restart []*sandboxRec
	pending, stale, err := m.tko.Pending(func(key string, err error) {
		m.log.Warn("dropping unreadable takeover record", "key", key, "err", err)
	})
	if err != nil {
		return err
	}
	for i := range sbs {
		s := &sbs[i]
		ts := pending[s.ID]
		// A restart a crash interrupted (after its kill, before its new
		// init's record) is done again.
		if s.Restarting {
			m.log.Warn("completing a restart a crash interrupted", "sandbox", s.ID)
			restart = append(restart, s)
		}
		if len(ts) == 0 {
			continue
		}
		root, err := fsnap.SubvolumeUUID(m.sbRoot(s.ID))
		if err != nil {
			m.log.Warn("cannot tell whether a rollback switched the sandbox's root", "sandbox", s.ID, "err", err)
			continue
		}
		for _, t := range hot.Switched(ts, root) {
			m.log.Warn("completing a rollback a crash interrupted", "sandbox", s.ID, "checkpoint", t.Head, "init", t.Init.Pid)
			if old := s.Init; old != t.Init && old.Signal(unix.SIGKILL) == nil {
				waitGone(old, 5*time.Second)
			}
			s.Head = t.Head
			// An fs rollback's switch has no tree of its own: the
			// sandbox's processes were killed before it. It starts a
			// fresh init below if the rollback would have, else it is
			// reported lost until started.
			if t.Restart && !slices.Contains(restart, s) {
				restart = append(restart, s)
			}
			if t.Init != (sandbox.Init{}) {
				s.Init, s.State, s.Reason = t.Init, v1.StateRunning, ""
				if t.Init.Alive() {
					if err := m.continueTree(*s, t.Init, m.headImages(t.Head)); err != nil {
						m.log.Warn("cannot continue the sandbox's new tree", "sandbox", s.ID, "err", err)
					}
				}
			}
			// After the exchange t.Path holds the old root, unless it
			// was already moved aside (root.old-*, removed with the
			// other leftovers).
			if err := removeTree(t.Path); err != nil {
				m.log.Warn("cannot remove the sandbox's old root", "sandbox", s.ID, "path", t.Path, "err", err)
			}
			if err := m.db.Put(meta.Sandboxes, s.ID, *s); err != nil {
				return fmt.Errorf("complete the rollback of %s: %w", s.ID, err)
			}
		}
	}
	if err := m.tko.Clear(stale); err != nil {
		return err
	}
	for _, s := range restart {
		if err := m.restart(ctx, s); err != nil {
			m.log.Warn("cannot restart the sandbox after its interrupted rollback or restart; start it by hand", "sandbox", s.ID, "err", err)
		}
	}
	return nil
}

// rollbackTarget is one rollback of rec to ck, its sandbox's lock held,
// as the tiers of hot.Run see it.
type rollbackTarget struct {
	m   *Manager
	rec *sandboxRec
	ck  checkpointRec
	req v1.RollbackRequest
}

func (t *rollbackTarget) wrap(err error) error {
	return fmt.Errorf("rollback %s to %s: %w", t.rec.ID, t.ck.ID, err)
}

func (t *rollbackTarget) Requested() string { return t.req.Tier }

func (t *rollbackTarget) TakeStandby() *hot.Standby { return t.m.takeStandby(t.rec.ID, t.ck.ID) }

func (t *rollbackTarget) DiscardStandby(s *hot.Standby) { t.m.discard(s, true) }

func (t *rollbackTarget) VerifyTarget() error {
	if err := t.m.verify(t.ck, false); err != nil {
		return t.wrap(err)
	}
	return nil
}

func (t *rollbackTarget) Promote(ctx context.Context, s *hot.Standby) (meta.RollbackResult, error) {
	return t.m.promote(ctx, t.rec, t.ck, s)
}

func (t *rollbackTarget) Processes() (ok, full bool) {
	_, ok = t.m.processSource(t.ck)
	return ok, t.ck.Kind == v1.KindFull
}

func (t *rollbackTarget) VerifyProcesses() error {
	p, _ := t.m.processSource(t.ck)
	if err := t.m.verify(p, true); err != nil {
		return t.wrap(err)
	}
	return nil
}

func (t *rollbackTarget) Restore(ctx context.Context) (meta.RollbackResult, error) {
	procs, _ := t.m.processSource(t.ck)
	res, err := t.m.rollbackProcesses(ctx, t.rec, t.ck, procs)
	if err != nil && t.ck.Kind == v1.KindFull {
		return meta.RollbackResult{}, t.wrap(err)
	}
	if err != nil {
		return meta.RollbackResult{}, err // to Fallback, as is
	}
	return res, nil
}

func (t *rollbackTarget) Restart(ctx context.Context) (meta.RollbackResult, error) {
	m, rec, ck := t.m, t.rec, t.ck
	// The record may still say running when its init has died behind
	// molt's back: the reported state says lost then, and a lost
	// sandbox is started again like a running one.
	now := m.report(*rec).State
	restart := now == v1.StateRunning || now == v1.StateLost || rec.State == v1.StateLost || rec.State == v1.StateHibernated
	key, err := m.switchRoot(ctx, *rec, ck, restart)
	if err != nil {
		return meta.RollbackResult{}, t.wrap(err)
	}
	rec.Head = ck.ID
	// The files are the checkpoint's from here on, whatever happens to
	// the restart: the record says so first.
	if err := m.commitTakeover(*rec, key); err != nil {
		return meta.RollbackResult{}, err
	}
	res := meta.RollbackResult{Sandbox: rec.ID, Checkpoint: ck.ID, Tier: v1.TierRestart}
	if restart {
		if err := m.restart(ctx, rec); err != nil {
			return meta.RollbackResult{}, fmt.Errorf("rollback %s to %s: files restored, but the sandbox did not start: %w", rec.ID, ck.ID, err)
		}
		res.ProcessesRestarted = true
		res.Note = "fs checkpoint: files restored; processes were restarted (neither it nor an ancestor holds usable process state)"
	} else {
		res.Note = "fs checkpoint: files restored; the sandbox stays " + rec.State
	}
	return res, nil
}

func (t *rollbackTarget) Fallback(tier string, err error) {
	if tier == v1.TierHot {
		t.m.log.Info("standby not promoted; restoring instead", "sandbox", t.rec.ID, "checkpoint", t.ck.ID, "err", err)
		return
	}
	procs, _ := t.m.processSource(t.ck)
	// The processes of the full ancestor do not fit this checkpoint's
	// files (CRIU refuses changed open files): restart instead.
	t.m.log.Info("restoring the full ancestor's processes failed; restarting", "sandbox", t.rec.ID, "checkpoint", t.ck.ID, "ancestor", procs.ID, "err", err)
}
