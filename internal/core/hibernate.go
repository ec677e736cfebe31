package core

import (
	"context"
	"errors"
	"fmt"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/progress"
)

// Hibernate takes a full checkpoint of a running sandbox, then stops its
// processes, which frees their memory. The sandbox is "hibernated" at
// that checkpoint until Resume, also across daemon and host restarts.
//
// The sandbox stays frozen from the captured instant until its
// processes are killed: nothing it does after the instant (a write to a
// file, output to a client) can be lost by the resume. If the checkpoint
// cannot be committed (a full disk), the sandbox is thawed and runs on
// as if nothing happened, and the checkpoint is listed as failed.
func (m *Manager) Hibernate(ctx context.Context, ref string) (meta.Sandbox, error) {
	// Earlier pending checkpoints first: their background work may need
	// the sandbox to run (the dumps of a template capture's copies).
	if r, err := m.lookupSandbox(ref); err == nil {
		if err := m.pipe.wait(ctx, "", r.ID); err != nil {
			return meta.Sandbox{}, err
		}
	}
	// Capture, then wait for the commit with the sandbox unlocked (a
	// failed commit needs the lock to unlink the checkpoint), and stop
	// the processes only once the checkpoint is durable.
	progress.Report(ctx, progress.Step{Message: "capturing processes and files"})
	ck, err := m.checkpoint(ctx, ref, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}, true)
	if err != nil {
		if r, lerr := m.lookupSandbox(ref); lerr == nil {
			err = errors.Join(err, m.thawSandbox(r.ID))
		}
		return meta.Sandbox{}, fmt.Errorf("hibernate: %w", err)
	}
	rec, unlock, err := m.lockSandbox(ck.Sandbox)
	if err != nil {
		return meta.Sandbox{}, errors.Join(err, m.thawSandbox(ck.Sandbox))
	}
	defer unlock()
	if rec.Head != ck.ID {
		return meta.Sandbox{}, errors.Join(fmt.Errorf("hibernate %s: the sandbox moved to %s while checkpoint %s was stored; not stopped: %w", rec.ID, rec.Head, ck.ID, errdefs.ErrUnavailable), m.thawSandbox(rec.ID))
	}
	m.crashpoint("hibernate:committed")
	progress.Report(ctx, progress.Step{Message: "stopping the processes"})
	next, err := m.stopTree(ctx, rec, v1.StateHibernated, "hibernated at checkpoint "+ck.ID)
	if err != nil {
		return meta.Sandbox{}, errors.Join(fmt.Errorf("hibernate %s: checkpoint %s taken, but stopping failed: %w", rec.ID, ck.ID, err), m.thawSandbox(rec.ID))
	}
	// Its cgroup stays, empty; a resume restores into it, thawed.
	if err := m.thawSandbox(rec.ID); err != nil {
		m.log.Warn("cannot thaw a hibernated sandbox's empty cgroup", "sandbox", rec.ID, "err", err)
	}
	return m.report(next), nil
}

// thawSandbox thaws a sandbox's cgroup, if it has one.
func (m *Manager) thawSandbox(id string) error {
	cg, err := cgroup.Load(m.cgroupName(id))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := cg.Thaw(); err != nil {
		return fmt.Errorf("thaw %s: %w", id, err)
	}
	return nil
}

// Resume restores a hibernated sandbox from its checkpoint. A sandbox
// offloaded to the store is fetched first; one this daemon does not
// know is adopted from the store (offload.go).
func (m *Manager) Resume(ctx context.Context, ref string) (meta.Sandbox, error) {
	return m.ResumeWith(ctx, ref, v1.ResumeRequest{})
}

// ResumeWith is Resume with what a migration's source hands over
// (req.Handover), used if the sandbox is adopted from the store.
func (m *Manager) ResumeWith(ctx context.Context, ref string, req v1.ResumeRequest) (meta.Sandbox, error) {
	r, err := m.lookupSandbox(ref)
	if err == nil && r.Offloaded && m.store != nil {
		dropped, derr := m.dropMovedOn(ctx, r.ID)
		if derr != nil {
			return meta.Sandbox{}, fmt.Errorf("resume %s: %w", ref, derr)
		}
		if dropped {
			ref, err = r.ID, errdefs.ErrNotFound
		}
	}
	if errors.Is(err, errdefs.ErrNotFound) && m.store != nil {
		progress.Report(ctx, progress.Step{Message: "looking up sandbox " + ref + " in the store"})
		if aerr := m.adopt(ctx, ref, req.Handover); aerr != nil {
			return meta.Sandbox{}, fmt.Errorf("resume %s: %w", ref, aerr)
		}
	} else if err == nil {
		if err := m.pipe.wait(ctx, "", r.ID); err != nil {
			return meta.Sandbox{}, err
		}
	}
	rec, unlock, err := m.lockHibernated(ref, "resume")
	if err != nil {
		return meta.Sandbox{}, err
	}
	defer unlock()
	var ck checkpointRec
	var lf *lazyFetch
	resumed := false
	if err := m.db.Get(meta.Checkpoints, rec.Head, &ck); err != nil {
		return meta.Sandbox{}, fmt.Errorf("resume %s: its checkpoint %s is gone: %w", rec.ID, rec.Head, errdefs.ErrFailedPrecondition)
	}
	if rec.Offloaded {
		if err := m.claim(ctx, rec); err != nil {
			return meta.Sandbox{}, fmt.Errorf("resume %s: %w", rec.ID, err)
		}
		// A resume that fails gives the claim back: a migration's source
		// then takes its sandbox back (migrate.go).
		id := rec.ID
		defer func() {
			if !resumed {
				m.unclaim(ctx, id)
			}
		}()
		if ck.Offloaded {
			var err error
			lf, err = m.startFetch(ctx, &ck)
			if err != nil {
				return meta.Sandbox{}, fmt.Errorf("resume %s: %w", rec.ID, err)
			}
			if lf != nil {
				ctx = withLazy(ctx, lf)
				defer lf.abandon() // unless the restore ran
			}
		}
	}
	if lf == nil {
		// Here already: lazily too, for much memory (lazylocal.go).
		var err error
		if lf, err = m.startLocalLazy(ctx, ck); err != nil {
			return meta.Sandbox{}, fmt.Errorf("resume %s: %w", rec.ID, err)
		}
		if lf != nil {
			ctx = withLazy(ctx, lf)
			defer lf.abandon() // unless the restore ran
		}
	}
	m.enforceLimits(&rec, "restore")
	progress.Report(ctx, progress.Step{Message: "restoring from checkpoint " + ck.ID})
	if _, err := m.rollbackProcesses(ctx, &rec, ck, ck); err != nil {
		if lf != nil && lf.failed() != nil {
			// The tree was killed because its memory could not come.
			err = lf.failed()
		}
		return meta.Sandbox{}, fmt.Errorf("resume %s: %w", rec.ID, err)
	}
	if rec.Offloaded {
		rec.Offloaded = false
		if err := m.db.Put(meta.Sandboxes, rec.ID, rec); err != nil {
			return meta.Sandbox{}, err
		}
	}
	resumed = true
	m.scheduleStandby(rec.ID)
	return m.report(rec), nil
}

// lockHibernated locks sandbox ref, which must be hibernated (for op).
func (m *Manager) lockHibernated(ref, op string) (sandboxRec, func(), error) {
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return rec, nil, err
	}
	if rec.State != v1.StateHibernated {
		unlock()
		return rec, nil, fmt.Errorf("%s %s: the sandbox is %s, not hibernated: %w", op, rec.ID, m.report(rec).State, errdefs.ErrFailedPrecondition)
	}
	return rec, unlock, nil
}
