package hot

import (
	"context"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
)

// A Target is one rollback as the tiers see it: a sandbox, its lock
// held, going back to a target checkpoint. Core implements it; its
// errors carry their context already.
type Target interface {
	// Requested is the tier the caller asked for: "" (the fastest
	// available), hot, warm or cold.
	Requested() string
	// TakeStandby takes the target's ready standby out of the table
	// (nil if none).
	TakeStandby() *Standby
	// DiscardStandby kills a standby taken and not promoted.
	DiscardStandby(*Standby)
	// VerifyTarget checks the target's stored objects (cached hashes of
	// unchanged files count).
	VerifyTarget() error
	// Promote makes the standby the sandbox's live tree.
	Promote(context.Context, *Standby) (meta.RollbackResult, error)
	// Processes reports whether the target or one of its ancestors holds
	// processes (ok), and whether the target itself does (full).
	Processes() (ok, full bool)
	// VerifyProcesses rehashes every stored object of the checkpoint
	// whose processes would be restored.
	VerifyProcesses() error
	// Restore restores those processes next to the live tree with CRIU
	// (a spare one if ready), on a writable copy of the target's files,
	// and switches to them.
	Restore(context.Context) (meta.RollbackResult, error)
	// Restart switches the root to the target's files and starts a fresh
	// init if the sandbox ran (or was lost or hibernated).
	Restart(context.Context) (meta.RollbackResult, error)
	// Fallback hears that tier was tried and failed with err, and the
	// next tier is tried.
	Fallback(tier string, err error)
}

// A tier tries one way of rolling back. next says the rollback passes to
// the following tier: its preconditions do not hold, or it was tried and
// failed in a way the next can recover from. Otherwise res and err are
// the rollback's.
type tier struct {
	name string
	try  func(context.Context, Target) (res meta.RollbackResult, next bool, err error)
}

// Tiers is the order the tiers are tried in, fastest first.
var Tiers = []string{v1.TierHot, v1.TierWarm, v1.TierCold, v1.TierRestart}

// tiers is the table Run walks, in the order of Tiers.
var tiers = []tier{
	{v1.TierHot, hotTier},
	{v1.TierWarm, warmTier},
	{v1.TierCold, coldTier},
	{v1.TierRestart, restartTier},
}

// Run rolls t back on the first tier whose preconditions hold and that
// succeeds or fails for good. The restart tier always ends it.
func Run(ctx context.Context, t Target) (meta.RollbackResult, error) {
	for _, tr := range tiers {
		res, next, err := tr.try(ctx, t)
		if !next {
			return res, err
		}
	}
	panic("hot: the restart tier passed a rollback on")
}

// hotTier promotes a standby: no CRIU on the critical path.
//
// Preconditions: the caller asked for no tier or for hot; a standby of
// the target is ready. A target that fails verification is refused
// (the invariant holds on every tier, even with a sound standby). A
// standby that cannot be promoted (gone, lost a task) passes the
// rollback to the next tier.
func hotTier(ctx context.Context, t Target) (meta.RollbackResult, bool, error) {
	if r := t.Requested(); r != "" && r != v1.TierHot {
		return meta.RollbackResult{}, true, nil
	}
	s := t.TakeStandby()
	if s == nil {
		return meta.RollbackResult{}, true, nil
	}
	// Objects checked at the standby's preparation are only stat'ed
	// again.
	if err := t.VerifyTarget(); err != nil {
		t.DiscardStandby(s)
		return meta.RollbackResult{}, false, err
	}
	res, err := t.Promote(ctx, s)
	if err != nil {
		t.Fallback(v1.TierHot, err)
		return meta.RollbackResult{}, true, nil
	}
	return res, false, nil
}

// warmTier restores the processes with CRIU.
//
// Preconditions: the caller did not ask for cold; the target or an
// ancestor is a full checkpoint. A failure is the rollback's when the
// target is full; for an fs target (the ancestor's processes may not
// fit its files: CRIU refuses changed open files) the rollback passes
// to the restart tier.
func warmTier(ctx context.Context, t Target) (meta.RollbackResult, bool, error) {
	if t.Requested() == v1.TierCold {
		return meta.RollbackResult{}, true, nil
	}
	return restore(ctx, t, v1.TierWarm)
}

// coldTier is the warm tier after rehashing every stored object of the
// checkpoint whose processes are restored, reported cold.
//
// Preconditions: the caller asked for cold; the target or an ancestor
// is a full checkpoint. A failed verification is the rollback's.
func coldTier(ctx context.Context, t Target) (meta.RollbackResult, bool, error) {
	if t.Requested() != v1.TierCold {
		return meta.RollbackResult{}, true, nil
	}
	if ok, _ := t.Processes(); !ok {
		return meta.RollbackResult{}, true, nil
	}
	if err := t.VerifyProcesses(); err != nil {
		return meta.RollbackResult{}, false, err
	}
	res, next, err := restore(ctx, t, v1.TierCold)
	if err == nil && !next {
		res.Tier = v1.TierCold
	}
	return res, next, err
}

// restore is the CRIU restore of the warm and cold tiers.
func restore(ctx context.Context, t Target, name string) (meta.RollbackResult, bool, error) {
	ok, full := t.Processes()
	if !ok {
		return meta.RollbackResult{}, true, nil
	}
	res, err := t.Restore(ctx)
	if err != nil && !full {
		t.Fallback(name, err)
		return meta.RollbackResult{}, true, nil
	}
	return res, false, err
}

// restartTier switches the files and starts a fresh init.
//
// Preconditions: none; the last tier.
func restartTier(ctx context.Context, t Target) (meta.RollbackResult, bool, error) {
	res, err := t.Restart(ctx)
	return res, false, err
}
