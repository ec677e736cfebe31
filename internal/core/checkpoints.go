package core

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/revert"
	"golang.org/x/sys/unix"
)

// checkpointRec is a checkpoint's record (meta.CheckpointRecord).
type checkpointRec = meta.CheckpointRecord

// The checkpoint's directory, its files and its writable copy of them
// (see ckstore.FSNextDir).
func (m *Manager) ckDir(id string) string    { return m.cks.Dir(id) }
func (m *Manager) ckFS(id string) string     { return m.cks.FS(id) }
func (m *Manager) ckFSNext(id string) string { return m.cks.FSNext(id) }

// Checkpoint takes a checkpoint of a sandbox: kind fs (the sandbox is
// frozen, its root snapshotted read-only, and thawed; listed once its
// manifest is on disk) or full (files and processes; see
// fullCheckpointLocked: pending until committed in the background).
func (m *Manager) Checkpoint(ctx context.Context, ref string, req v1.CheckpointRequest) (meta.Checkpoint, error) {
	return m.checkpoint(ctx, ref, req, false)
}

// checkpoint is Checkpoint; holdFrozen (full only) leaves the sandbox
// frozen from its capture on (see Hibernate).
func (m *Manager) checkpoint(ctx context.Context, ref string, req v1.CheckpointRequest, holdFrozen bool) (meta.Checkpoint, error) {
	if err := req.Validate(); err != nil {
		return meta.Checkpoint{}, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	if req.Kind == v1.KindAuto {
		return meta.Checkpoint{}, fmt.Errorf("checkpoint kind auto ends a turn: use EndTurn: %w", errdefs.ErrInvalidArgument)
	}
	if req.Label != "" {
		if err := validName("checkpoint label", req.Label); err != nil {
			return meta.Checkpoint{}, err
		}
	}
	began := time.Now()
	if r, err := m.lookupSandbox(ref); err == nil {
		// Room first: a full checkpoint may store as much as the tree's
		// private memory.
		var need int64
		if req.Kind == v1.KindFull {
			if pids, _, err := m.treePids(r.ID, r.Init); err == nil {
				need = capture.AnonBytes(pids)
			}
		}
		if err := m.room("checkpoint "+r.ID, need); err != nil {
			m.metrics.checkpoint.WithLabelValues(cmp.Or(req.Kind, v1.KindFS), "failed").Inc()
			return meta.Checkpoint{}, err
		}
		if req.Kind == v1.KindFull {
			if err := m.persistRoom(ctx, r.ID); err != nil {
				return meta.Checkpoint{}, err
			}
		}
	}
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return meta.Checkpoint{}, err
	}
	slot, err := m.captureSlot(ctx)
	if err != nil {
		unlock()
		return meta.Checkpoint{}, err
	}
	release := m.foreground(rec.ID)
	var ck meta.Checkpoint
	if req.Kind == v1.KindFull {
		ck, err = m.fullCheckpointLocked(ctx, rec, ckOpts{label: req.Label, keep: req.Keep, holdFrozen: holdFrozen})
	} else {
		ck, err = m.checkpointLocked(ctx, rec, ckOpts{label: req.Label})
	}
	release()
	slot()
	unlock()
	if err != nil {
		kind := req.Kind
		if kind == "" {
			kind = v1.KindFS
		}
		m.metrics.checkpoint.WithLabelValues(kind, "failed").Inc()
		return meta.Checkpoint{}, fmt.Errorf("checkpoint %s: %w", rec.ID, m.exhausted(err))
	}
	m.metrics.checkpointed(ck, time.Since(began))
	if ck.Pending && req.Wait {
		return m.awaitCheckpoint(ctx, ck.ID)
	}
	return ck, nil
}

// awaitCheckpoint waits until checkpoint id is committed and returns its
// record, or the error that kept it from committing.
func (m *Manager) awaitCheckpoint(ctx context.Context, id string) (meta.Checkpoint, error) {
	for _, j := range m.pipe.matching(id, "") {
		if m.pipe.ckOf(j).ID != id {
			continue
		}
		if err := m.pipe.waitJob(ctx, j); err != nil {
			return meta.Checkpoint{}, err
		}
		if j.err != nil {
			return meta.Checkpoint{}, fmt.Errorf("checkpoint %s was captured but not committed: %w", id, j.err)
		}
	}
	var ck checkpointRec
	if err := m.db.Get(meta.Checkpoints, id, &ck); err != nil {
		return meta.Checkpoint{}, err
	}
	return ck.Checkpoint, nil
}

// ckOpts are the options of one checkpoint.
type ckOpts struct {
	label string
	keep  bool // keep a standby (full)
	// frozen, if set, runs inside the frozen window once the state is
	// captured (the turn inspector starts the next turn there).
	frozen func()
	// holdFrozen leaves a full checkpoint's sandbox frozen after a
	// successful capture: nothing runs after the captured instant until
	// the caller thaws or kills it. It takes the plain copy capture
	// (the others run work in the sandbox after the thaw).
	holdFrozen bool
	// turn is the turn whose end takes the checkpoint (0: none).
	turn int
}

// checkpointLocked takes an fs checkpoint. The checkpoint's directory
// and manifest are written first, then the snapshot is taken into it: the
// snapshot ioctl commits a btrfs transaction, which makes directory,
// manifest and snapshot durable together, with no fsync of our own. The
// metadata record (one bbolt transaction with the sandbox's new head) is
// the commit point: a crash before it leaves an unlisted directory,
// which reconcile removes.
func (m *Manager) checkpointLocked(ctx context.Context, rec sandboxRec, o ckOpts) (meta.Checkpoint, error) {
	m.enforceLimits(&rec, "checkpoint")
	label := o.label
	start := time.Now()
	id := newID()
	root := m.sbRoot(rec.ID)
	r := revert.Logged(m.log, "fs checkpoint of "+rec.ID)
	defer r.Fail()

	ck := checkpointRec{Checkpoint: meta.Checkpoint{
		ID: id, Sandbox: rec.ID, Parent: rec.Head, Kind: v1.KindFS, Label: label,
		Created: time.Now().UTC(),
	}, Image: rec.Image, LedgerHead: m.ledger.Head(rec.ID), Turn: o.turn}
	if _, err := m.cks.Create(id); err != nil {
		return meta.Checkpoint{}, err
	}
	r.Add(func() error { return m.cks.Delete(id) })
	mb, err := m.writeManifest(ck)
	if err != nil {
		return meta.Checkpoint{}, err
	}
	if err := m.fail("checkpoint:manifest"); err != nil {
		return meta.Checkpoint{}, err
	}

	var cg *cgroup.Cgroup
	if m.report(rec).State == v1.StateRunning {
		c, err := cgroup.Load(m.cgroupName(rec.ID))
		if err != nil {
			return meta.Checkpoint{}, err
		}
		cg = c
	}
	// The snapshot flushes the sandbox's dirty data inside the frozen
	// window. When there is much of it, flush it before freezing instead.
	if cg == nil || flushFirst(cg.DirtyBytes()) {
		if err := fsnap.SyncFS(root); err != nil {
			return meta.Checkpoint{}, err
		}
	}
	freezeStart := time.Now()
	var fw *capture.Watch
	if cg != nil {
		var wctx context.Context
		wctx, fw = capture.WatchFrozen(ctx, cg, m.frozenDeadline(0))
		defer fw.Stop()
		fw.Arm("the freeze")
		if err := cg.Freeze(wctx); err != nil {
			return meta.Checkpoint{}, err
		}
		fw.Enter("the root's snapshot")
	}
	snapErr := snapshotRoot(root, m.ckFS(id), m.groupsOf(rec))
	if snapErr == nil {
		snapErr = m.fail("checkpoint:frozen")
	}
	if err := fw.Stop(); err != nil {
		snapErr = errors.Join(err, snapErr)
	}
	if snapErr == nil && o.frozen != nil {
		o.frozen()
	}
	if cg != nil {
		if err := cg.Thaw(); err != nil {
			return meta.Checkpoint{}, errors.Join(snapErr, fmt.Errorf("thaw: %w", err))
		}
	}
	stall := time.Since(freezeStart)
	if snapErr != nil {
		return meta.Checkpoint{}, snapErr
	}

	ck.StallMS = ms(stall)
	ck.BytesWritten = int64(len(mb))
	m.crashpoint("fs:snapshotted")
	if err := m.fail("checkpoint:record"); err != nil {
		return meta.Checkpoint{}, err
	}
	rec.Head = id
	ck.DurationMS = ms(time.Since(start))
	err = m.db.Update(func(tx *meta.Tx) error {
		if err := tx.Put(meta.Checkpoints, id, ck); err != nil {
			return err
		}
		return tx.Put(meta.Sandboxes, rec.ID, rec)
	})
	if err != nil {
		return meta.Checkpoint{}, err
	}
	r.Success()
	m.scheduleUpload(rec.ID, id)
	return ck.Checkpoint, nil
}

// syncBeforeFreeze is the amount of dirty page cache of a sandbox above
// which a checkpoint flushes it before freezing (syncfs, ~3 ms even when
// little is dirty) rather than inside the frozen window (the snapshot
// flushes at about 3 ms per MiB on a loop pool).
const syncBeforeFreeze = 1 << 20

// flushFirst reports whether dirty bytes (-1: unknown) call for a flush
// before freezing.
func flushFirst(dirty int64) bool { return dirty < 0 || dirty > syncBeforeFreeze }

// writeManifest writes the checkpoint's manifest into its directory. It
// is not fsynced: the snapshot that follows commits it (see
// checkpointLocked), and reconcile rewrites a manifest a host crash lost.
func (m *Manager) writeManifest(ck checkpointRec) ([]byte, error) {
	return m.cks.Writer(ck.ID).Commit(m.manifestOf(ck, false))
}

// manifestOf is the manifest of ck, committed or not yet.
func (m *Manager) manifestOf(ck checkpointRec, committed bool) ckstore.Manifest {
	return ckstore.Manifest{
		Format: ckstore.Format, ID: ck.ID, Sandbox: ck.Sandbox, Parent: ck.Parent, Kind: ck.Kind, Label: ck.Label,
		Image: ck.Image, Created: ck.Created, Molt: m.cfg.Version, Kernel: m.kernel,
		Arch: runtime.GOARCH, CRIU: ck.CRIU, ExternalNet: ck.ExternalNet,
		ExternalUTS: ck.ExternalUTS, ExternalIPC: ck.ExternalIPC, IDs: ck.IDs, Objects: ck.Objects, LedgerHead: ck.LedgerHead, EgressAddr: ck.EgressAddr, Turn: ck.Turn, DataKey: ck.DataKey, KeyTenant: ck.KeyTenant,
		Tenant: ck.Tenant, ImportedFrom: ck.ImportedFrom, ImportSigner: ck.ImportSigner,
		ParentDigest: m.digestOf(ck.Parent),
		Committed:    committed, Keep: ck.Keep, Capture: ck.Capture, CaptureNote: ck.CaptureNote,
		StallMS: ck.StallMS, StallParts: (*v1.StallParts)(ck.StallParts), DurationMS: ck.DurationMS, BytesWritten: ck.BytesWritten,
	}
}

// digestOf is the content digest of checkpoint id's manifest ("" for
// none, or one that cannot be read: the link then fails verification).
func (m *Manager) digestOf(id string) string {
	if id == "" || m.cks == nil {
		return ""
	}
	mf, err := m.cks.ReadManifest(id)
	if err != nil {
		return ""
	}
	return mf.Digest()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (m *Manager) checkpointsOf(sandboxID string) ([]checkpointRec, error) {
	out, err := checkpointRecs.ListBy(m.db, m.ix.ckBySandbox, sandboxID)
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// Checkpoints lists a sandbox's checkpoints, oldest first.
func (m *Manager) Checkpoints(ref string) ([]meta.Checkpoint, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return nil, err
	}
	cks, err := m.checkpointsOf(rec.ID)
	if err != nil {
		return nil, err
	}
	out := make([]meta.Checkpoint, 0, len(cks))
	for _, c := range cks {
		out = append(out, c.Checkpoint)
	}
	pending := map[string]bool{}
	for _, c := range m.pipe.pending(rec.ID) {
		c.Pending = true
		pending[c.ID] = true
		out = append(out, c.Checkpoint)
	}
	for _, c := range m.failedOf(rec.ID) {
		if !pending[c.ID] { // recorded failed just before its job ends
			out = append(out, c.Checkpoint)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// lookupCheckpoint finds a checkpoint by ID, unique ID prefix, label, or
// SANDBOX:REF (REF, a label or ID prefix, among that sandbox's
// checkpoints only).
//
// Labels are per sandbox. They are looked up among the checkpoints of
// sandboxID first (when given: the sandbox a rollback or fork names);
// within one sandbox the newest checkpoint with the label wins, as a
// moving tag would. A bare label that other sandboxes' checkpoints carry
// resolves only if they are all one sandbox's: otherwise it is ambiguous
// (an *errdefs.AmbiguousError listing SANDBOX:LABEL for each), so a
// command never acts on another sandbox's checkpoint by accident.
func (m *Manager) lookupCheckpoint(ref, sandboxID string) (checkpointRec, error) {
	var rec checkpointRec
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return rec, fmt.Errorf("empty checkpoint reference: %w", errdefs.ErrInvalidArgument)
	}
	scoped := false
	if sbRef, rest, ok := strings.Cut(ref, ":"); ok {
		if sbRef == "" || rest == "" {
			return rec, fmt.Errorf("checkpoint reference %q: want SANDBOX:LABEL: %w", ref, errdefs.ErrInvalidArgument)
		}
		sb, err := m.lookupSandbox(sbRef)
		if err != nil {
			return rec, fmt.Errorf("checkpoint %q: %w", ref, err)
		}
		ref, sandboxID, scoped = rest, sb.ID, true
	}
	var byID checkpointRec
	if err := m.db.Get(meta.Checkpoints, ref, &byID); err == nil && (!scoped || byID.Sandbox == sandboxID) {
		return byID, nil
	}
	withLabel, err := checkpointRecs.ListBy(m.db, m.ix.ckByLabel, ref)
	if err != nil {
		return rec, err
	}
	var own, labelled, prefixed []checkpointRec
	for _, c := range withLabel {
		if scoped && c.Sandbox != sandboxID {
			continue
		}
		labelled = append(labelled, c)
		if c.Sandbox == sandboxID {
			own = append(own, c)
		}
	}
	if isPrefixRef(ref) {
		cands, err := byIDPrefix(m.db, checkpointRecs, ref)
		if err != nil {
			return rec, err
		}
		for _, c := range cands {
			if !scoped || c.Sandbox == sandboxID {
				prefixed = append(prefixed, c)
			}
		}
	}
	newest := func(set []checkpointRec) checkpointRec {
		sort.Slice(set, func(i, j int) bool { return set[i].Created.After(set[j].Created) })
		return set[0]
	}
	if len(own) > 0 {
		return newest(own), nil
	}
	if len(labelled) > 0 {
		bySandbox := map[string]bool{}
		for _, c := range labelled {
			bySandbox[c.Sandbox] = true
		}
		if len(bySandbox) == 1 {
			return newest(labelled), nil
		}
		names := map[string]string{}
		if sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes); err == nil {
			for _, s := range sbs {
				if s.Name != "" {
					names[s.ID] = s.Name
				}
			}
		}
		var cands []string
		for sb := range bySandbox {
			n := names[sb]
			if n == "" {
				n = sb
			}
			cands = append(cands, n+":"+ref)
		}
		sort.Strings(cands)
		return rec, &errdefs.AmbiguousError{Kind: "checkpoint label", Ref: ref, Candidates: cands}
	}
	switch len(prefixed) {
	case 0:
		if c, ok := m.findFailed(ref, sandboxID); ok {
			return rec, failedError(c)
		}
		return rec, notFound("checkpoint", ref)
	case 1:
		return prefixed[0], nil
	}
	var cands []string
	for _, c := range prefixed {
		cands = append(cands, c.ID)
	}
	sort.Strings(cands)
	return rec, &errdefs.AmbiguousError{Kind: "checkpoint", Ref: ref, Candidates: cands}
}

// CheckpointInfo returns one checkpoint.
func (m *Manager) CheckpointInfo(ref string) (meta.Checkpoint, error) {
	for _, j := range m.pipe.matching(ref, "") {
		ck := m.pipe.ckOf(j)
		ck.Pending = true
		return ck.Checkpoint, nil
	}
	c, err := m.lookupCheckpoint(ref, "")
	if err != nil {
		if f, ok := m.findFailed(ref, ""); ok {
			return f.Checkpoint, nil
		}
	}
	return c.Checkpoint, err
}

// DeleteCheckpoint deletes a checkpoint; its children are re-parented to
// its parent, so the tree stays connected. A failed checkpoint's record
// goes. The checkpoint a hibernated sandbox is hibernated at is refused:
// without it, resume would bring back older state.
func (m *Manager) DeleteCheckpoint(ctx context.Context, ref string) error {
	if err := m.pipe.wait(ctx, ref, ""); err != nil {
		return err
	}
	ck, err := m.lookupCheckpoint(ref, "")
	if err != nil {
		if f, ok := m.findFailed(ref, ""); ok {
			return m.deleteFailed(f)
		}
		return err
	}
	unlock := m.lock(ck.Sandbox)
	defer unlock()
	var sb sandboxRec
	if err := m.db.Get(meta.Sandboxes, ck.Sandbox, &sb); err == nil && sb.State == v1.StateHibernated && sb.Head == ck.ID {
		return fmt.Errorf("delete checkpoint %s: sandbox %s is hibernated at it (resume it, or remove the sandbox): %w", ck.ID, sb.ID, errdefs.ErrFailedPrecondition)
	}
	if err := m.deleteCheckpoint(ck); err != nil {
		return err
	}
	// Its recipe in the store goes, unless the sandbox is offloaded: its
	// document there names the checkpoint, and another host may have
	// resumed it. (Whether or not the record says it is in the store:
	// an upload may have just put it there.)
	if sb.ID == ck.Sandbox && !sb.Offloaded {
		m.dropStored(ck.Sandbox, sb.Head, []string{ck.ID}, false)
	}
	m.pruneTurns(ck.Sandbox)
	return nil
}

func (m *Manager) deleteCheckpoint(ck checkpointRec) error {
	m.dropStandbyOf(ck.Sandbox, ck.ID, true)
	if err := m.reparent(ck, true); err != nil {
		return err
	}
	m.dropViews(func(id, _ string) bool { return id == ck.ID })
	return m.cks.Delete(ck.ID)
}

// reparent takes ck out of the tree: its children (committed or
// pending) and its sandbox's head move to its parent; with drop, its
// record goes too. The records change in one transaction, so a crash
// leaves the tree before or after, never half moved (a checkpoint
// directory left without its record is removed at start-up). Caller
// holds the sandbox lock.
func (m *Manager) reparent(ck checkpointRec, drop bool) error {
	// Pending children first: one that commits from here on names the
	// parent.
	m.pipe.reparent(ck.ID, ck.Parent)
	var moved []checkpointRec
	err := m.db.Update(func(tx *meta.Tx) error {
		moved = moved[:0]
		all, err := meta.ListIn[checkpointRec](tx, meta.Checkpoints)
		if err != nil {
			return err
		}
		for _, c := range all {
			if c.Parent == ck.ID {
				c.Parent = ck.Parent
				if err := tx.Put(meta.Checkpoints, c.ID, c); err != nil {
					return err
				}
				moved = append(moved, c)
			}
		}
		var sb sandboxRec
		if err := tx.Get(meta.Sandboxes, ck.Sandbox, &sb); err == nil && sb.Head == ck.ID {
			sb.Head = ck.Parent
			if err := tx.Put(meta.Sandboxes, sb.ID, sb); err != nil {
				return err
			}
		}
		if drop {
			return tx.Delete(meta.Checkpoints, ck.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// The children's manifests name their new parent and its digest,
	// signed again: the chain goes on past the deleted checkpoint. A
	// manifest that cannot be written leaves a link that verification
	// reports; the records, which restores trust, are right either way.
	for _, c := range moved {
		if c.Pending || c.Failed || c.Offloaded {
			continue // its manifest is written when it commits, or is fetched
		}
		if err := m.cks.Backend().PutManifest(c.ID, m.committedManifest(c)); err != nil {
			m.log.Warn("checkpoint manifest not re-linked to its new parent", "checkpoint", c.ID, "parent", c.Parent, "err", err)
		}
	}
	return nil
}

// Rollback returns a sandbox to a checkpoint. For an fs checkpoint the
// root is switched to a writable snapshot of the checkpoint and the
// sandbox's processes are restarted (there is no process state to
// restore); the result says so.
func (m *Manager) Rollback(ctx context.Context, ref, ckRef string) (meta.RollbackResult, error) {
	return m.RollbackWith(ctx, ref, v1.RollbackRequest{Checkpoint: ckRef})
}

// RollbackWith is Rollback with the request's options: req.Tier "warm"
// skips a standby and restores from the images, "cold" also rehashes
// every object first; "" takes the fastest tier available.
func (m *Manager) RollbackWith(ctx context.Context, ref string, req v1.RollbackRequest) (meta.RollbackResult, error) {
	res, err := m.rollback(ctx, ref, req)
	err = m.exhausted(err)
	if err == nil {
		m.metrics.rollback.WithLabelValues(res.Tier).Observe(seconds(res.DurationMS))
	}
	return res, err
}

func (m *Manager) rollback(ctx context.Context, ref string, req v1.RollbackRequest) (meta.RollbackResult, error) {
	ckRef := req.Checkpoint
	switch req.Tier {
	case "", v1.TierHot, v1.TierWarm, v1.TierCold:
	default:
		return meta.RollbackResult{}, fmt.Errorf("rollback tier %q: want hot, warm or cold: %w", req.Tier, errdefs.ErrInvalidArgument)
	}
	start := time.Now()
	if r, err := m.lookupSandbox(ref); err == nil {
		// Background work of other sandboxes pauses meanwhile; this
		// sandbox's own (a pending checkpoint it waits for) goes on.
		defer m.foreground(r.ID)()
	}
	// A pending checkpoint is waited for, outside the sandbox's lock
	// (its commit may need it).
	if err := m.pipe.wait(ctx, ckRef, ""); err != nil {
		return meta.RollbackResult{}, err
	}
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return meta.RollbackResult{}, err
	}
	defer unlock()
	// The target is committed: now this sandbox's own background work
	// (storing its later checkpoints, a commit's syncfs) pauses as well,
	// at its next yield. Under the sandbox's lock no job of the sandbox
	// holds anything the rollback needs.
	defer m.foreground("")()
	ck, err := m.lookupCheckpoint(ckRef, rec.ID)
	if err != nil {
		return meta.RollbackResult{}, err
	}
	if ck.Sandbox != rec.ID && ck.ID != rec.ForkedFrom {
		return meta.RollbackResult{}, fmt.Errorf("rollback %s: checkpoint %s belongs to sandbox %s (fork it instead): %w", rec.ID, ck.ID, ck.Sandbox, errdefs.ErrInvalidArgument)
	}
	// What the rollback does to the effects the world has: refused when
	// it would orphan one someone consumed that nothing compensates.
	plan, err := m.rollbackPlan(rec, ck, req.DryRun)
	if err != nil {
		return meta.RollbackResult{}, err
	}
	if req.DryRun {
		return meta.RollbackResult{Sandbox: rec.ID, Checkpoint: ck.ID, Plan: plan}, nil
	}
	if err := blocked(rec.ID, ck.ID, plan); err != nil && !req.Force {
		return meta.RollbackResult{}, err
	}
	m.enforceLimits(&rec, "restore")
	if err := m.room("rollback "+rec.ID, 0); err != nil {
		return meta.RollbackResult{}, err
	}
	// The compensations are planned (durably) before the switch and run
	// after it (compensate.go says why).
	batch, err := m.planCompensation(rec, ck, plan)
	if err != nil {
		return meta.RollbackResult{}, err
	}
	// The tiers, fastest first (hot.Run).
	res, err := hot.Run(ctx, &rollbackTarget{m: m, rec: &rec, ck: ck, req: req})
	if err != nil {
		m.cancelCompensation(rec, batch, plan, err)
		return meta.RollbackResult{}, err
	}
	m.ledgerRewind(rec.ID, ck)
	// The turns go on from the checkpoint's; a recovery under way is
	// over (Recover arms its own after this).
	m.turns.Disarm(rec.ID)
	if ck.Sandbox == rec.ID {
		m.turns.Continue(rec.ID, m.turnOf(rec.ID, ck.ID))
	} else {
		m.turns.Continue(rec.ID, 0)
	}
	if plan != nil && len(plan.Orphan) > 0 {
		res.Plan = plan
	}
	res.Compensation = m.compensate(context.WithoutCancel(ctx), rec.ID, ck.ID, batch)
	res.DurationMS = ms(time.Since(start))
	if res.Tier != v1.TierRestart {
		m.scheduleStandby(rec.ID)
	}
	return res, nil
}

// switchRoot replaces the sandbox's root by a writable snapshot of the
// checkpoint (restart says that the caller starts a fresh init next)
// and returns the key of the switch's takeover record, which
// the caller deletes as it writes the sandbox's new head
// (commitTakeover). The snapshot is made first, so a failure there
// leaves the sandbox untouched; then the processes are killed and the
// directories exchanged.
func (m *Manager) switchRoot(ctx context.Context, rec sandboxRec, ck checkpointRec, restart bool) (string, error) {
	if err := m.ensureLocal(ctx, &ck); err != nil {
		return "", err
	}
	next := filepath.Join(m.sbDir(rec.ID), "root.next")
	if err := removeTree(next); err != nil {
		return "", err
	}
	if err := fsnap.SnapshotIn(m.ckFS(ck.ID), next, false, m.groupsOf(rec)...); err != nil {
		return "", err
	}
	if err := m.fail("rollback:snapshot"); err != nil {
		_ = removeTree(next)
		return "", err
	}
	// No tree takes over: a daemon that dies past the exchange leaves a
	// sandbox on the checkpoint's files, which start-up records as its
	// head, and restarts with restart.
	key, err := m.recordTakeover(rec.ID, "rollback", hot.Record{Path: next, Head: ck.ID, Restart: restart})
	if err != nil {
		_ = removeTree(next)
		return "", err
	}
	if err := m.killProcesses(ctx, rec); err != nil {
		_ = removeTree(next)
		m.forgetTakeover(key)
		return "", err
	}
	retired, err := m.replaceRoot(rec.ID, next)
	if err != nil {
		_ = removeTree(next)
		m.forgetTakeover(key)
		return "", err
	}
	if retired != "" {
		// The old root's processes are gone. One left behind is a
		// root.old-*, which start-up removes.
		if err := removeTree(retired); err != nil {
			m.log.Warn("cannot remove the sandbox's old root", "sandbox", rec.ID, "path", retired, "err", err)
		}
	}
	return key, nil
}

// replaceRoot puts next in place as the sandbox's root and returns where
// the old root went (root.old-*, which start-up removes if a crash
// leaves it). The two trade places in one exchange (renameat2
// RENAME_EXCHANGE), so that at every instant the sandbox has a root, the
// old or the new: with two renames a crash between them left none, and
// start-up then removed the only copy as a retired root. On failure
// nothing moved.
func (m *Manager) replaceRoot(id, next string) (string, error) {
	root := m.sbRoot(id)
	err := unix.Renameat2(unix.AT_FDCWD, next, unix.AT_FDCWD, root, unix.RENAME_EXCHANGE)
	if errors.Is(err, unix.ENOENT) {
		if _, serr := os.Lstat(root); errors.Is(serr, fs.ErrNotExist) {
			// No root to trade with: next simply moves in.
			return "", os.Rename(next, root)
		}
	}
	if err != nil {
		return "", &os.LinkError{Op: "exchange", Old: next, New: root, Err: err}
	}
	m.crashpoint("takeover:switched")
	retired := filepath.Join(m.sbDir(id), "root.old-"+newID())
	if err := os.Rename(next, retired); err != nil {
		// The old root stays where next was: the caller removes it
		// from there.
		return next, nil
	}
	return retired, nil
}
