package core

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/progress"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sbinit"
)

// Fork creates n sandboxes from a checkpoint, or from a sandbox (an fs
// checkpoint of it is taken first). Each fork has its own ID, hostname,
// machine-id and writable root. If any fork fails, the ones already made
// are removed.
func (m *Manager) Fork(ctx context.Context, ref string, req v1.ForkRequest) (meta.ForkResult, error) {
	res, err := m.fork(ctx, ref, req)
	return res, m.exhausted(err)
}

func (m *Manager) fork(ctx context.Context, ref string, req v1.ForkRequest) (meta.ForkResult, error) {
	start := time.Now()
	n := req.N
	if n == 0 {
		n = 1
	}
	if n < 0 || n > 1000 {
		return meta.ForkResult{}, fmt.Errorf("fork: n=%d: want 1..1000: %w", n, errdefs.ErrInvalidArgument)
	}
	fs, err := m.forkSource(ctx, ref, req.Checkpoint)
	if err != nil {
		return meta.ForkResult{}, err
	}
	if err := m.room("fork", int64(n)*metaRoom); err != nil {
		return meta.ForkResult{}, err
	}
	if err := fs.verify(m); err != nil {
		return meta.ForkResult{}, fmt.Errorf("fork: %w", err)
	}
	made := m.makeForks(ctx, fs, n, req.Reseed)
	if err := m.recordForks(made); err != nil {
		for _, r := range made.reverts {
			if r != nil {
				r.Fail()
			}
		}
		return meta.ForkResult{}, fmt.Errorf("fork %s (%w", fs.ck.ID, err)
	}
	res := meta.ForkResult{Checkpoint: fs.ck.ID, Sandboxes: make([]meta.Sandbox, n)}
	for i, r := range made.reverts {
		r.Success()
		res.Sandboxes[i] = m.report(made.recs[i])
	}
	d := time.Since(start)
	res.DurationMS = ms(d)
	res.ForksPerSecond = float64(n) / d.Seconds()
	res.Reseeded = made.reseeded
	m.metrics.forks.Add(float64(n))
	return res, nil
}

// forkFrom is what forks are made from: a checkpoint, the sandbox it was
// taken of, and the checkpoint whose processes they restore (nil: they
// start afresh).
type forkFrom struct {
	ck    checkpointRec
	src   sandboxRec
	procs *checkpointRec
}

// forkSource resolves a fork's source: the checkpoint ckRef, or with none
// given, ref as a sandbox (an fs checkpoint of it is taken first) or as
// a checkpoint.
func (m *Manager) forkSource(ctx context.Context, ref, ckRef string) (forkFrom, error) {
	var fs forkFrom
	sbID := ""
	if ckRef == "" {
		sb, err := m.lookupSandbox(ref)
		if err == nil {
			sbID = sb.ID
			ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS})
			if err != nil {
				return fs, fmt.Errorf("fork: %w", err)
			}
			ckRef = ck.ID
		} else if errors.Is(err, errdefs.ErrNotFound) {
			ckRef = ref
		} else {
			return fs, err
		}
	}
	if err := m.pipe.wait(ctx, ckRef, ""); err != nil {
		return fs, err
	}
	ck, err := m.lookupCheckpoint(ckRef, sbID)
	if err != nil {
		return fs, fmt.Errorf("fork: %w", err)
	}
	fs.ck = ck
	if err := m.db.Get(meta.Sandboxes, ck.Sandbox, &fs.src); err != nil && ck.ImportedFrom != "" {
		// An imported checkpoint's sandbox is not here (bundle.go): its
		// forks are its tenant's, with the daemon's defaults.
		fs.src = sandboxRec{Sandbox: meta.Sandbox{Tenant: ck.Tenant, Seccomp: m.seccompDefault(),
			Resources: m.resolveResources(meta.Resources{})}}
	}
	// An fs checkpoint's forks take its full ancestor's processes when
	// CRIU can restore them, and start afresh otherwise.
	if p, ok := m.processSource(ck); ok && (ck.Kind == v1.KindFull || m.criu != nil) {
		fs.procs = &p
	}
	return fs, nil
}

// verify checks the images the forks restore from, before any is made.
func (fs forkFrom) verify(m *Manager) error {
	if fs.procs == nil {
		return nil
	}
	return m.verify(*fs.procs, false)
}

// madeForks are the forks made, each with its undo, not yet recorded.
type madeForks struct {
	recs     []sandboxRec
	reverts  []*revert.Reverter
	errs     []error
	reseeded int
}

// makeForks makes n forks of fs in parallel, several at a time: a
// restore is partly CPU (CRIU, page faults), partly waiting (cgroup
// moves, btrfs commits).
func (m *Manager) makeForks(ctx context.Context, fs forkFrom, n int, reseed bool) madeForks {
	ck, src := fs.ck, fs.src
	made := madeForks{recs: make([]sandboxRec, n), reverts: make([]*revert.Reverter, n), errs: make([]error, n)}
	// A standby of the checkpoint, if one is ready, becomes the first
	// fork: no restore on its path. Its sandbox prepares another.
	var sby *standby
	if fs.procs != nil && fs.procs.ID == ck.ID {
		if sby = m.takeStandby(ck.Sandbox, ck.ID); sby != nil {
			defer m.scheduleStandby(ck.Sandbox)
		}
	}
	var reseeded, finished atomic.Int64
	progress.Report(ctx, progress.Step{Message: "forking " + ck.ID, Total: int64(n)})
	sem := make(chan struct{}, forkParallelism())
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rec := sandboxRec{Sandbox: meta.Sandbox{
				ID: newID(), Tenant: src.Tenant, Image: ck.Image, Env: src.Env, Resources: src.Resources,
				Head: ck.ID, ForkedFrom: ck.ID, Seccomp: src.Seccomp,
				Network: src.Network, Egress: src.Egress, EffectPolicy: src.EffectPolicy,
			}, MachineID: newMachineID(), SeccompProfile: src.SeccompProfile, RecordLimit: src.RecordLimit,
				ImageConfig: cloneImageConfig(src.ImageConfig)}
			if err := m.forkSecrets(&rec, src); err != nil {
				made.errs[i] = err
				return
			}
			var taken *standby
			if i == 0 {
				taken = sby
			}
			rec, r, err := m.makeFork(ctx, rec, fs, taken)
			if err == nil && reseed {
				var k int
				k, err = m.reseed(ctx, rec)
				reseeded.Add(int64(k))
			}
			if err == nil {
				m.turnReset(ctx, rec)
				id := rec.ID
				r.Add(func() error { m.turnForget(id); return nil })
			}
			made.recs[i], made.reverts[i], made.errs[i] = rec, r, err
			progress.Report(ctx, progress.Step{Message: "forking " + ck.ID, Done: finished.Add(1), Total: int64(n)})
		}()
	}
	wg.Wait()
	made.reseeded = int(reseeded.Load())
	return made
}

// makeFork makes one fork, from the standby sby when one was taken for
// it (and by a restore if the standby cannot be adopted).
func (m *Manager) makeFork(ctx context.Context, rec sandboxRec, fs forkFrom, sby *standby) (sandboxRec, *revert.Reverter, error) {
	if sby != nil {
		made, r, err := m.makeSandbox(ctx, rec, m.ckFS(fs.ck.ID), fs.procs, sby)
		if err == nil {
			m.metrics.forksHot.Inc()
			return made, r, nil
		}
		m.log.Info("standby not adopted by fork; restoring instead", "checkpoint", fs.ck.ID, "err", err)
		rec.ID = newID()
	}
	return m.makeSandbox(ctx, rec, m.ckFS(fs.ck.ID), fs.procs, nil)
}

// recordForks records the forks together, in one transaction, once all
// are made: a call that fails, or a daemon that dies before this, leaves
// none listed (start-up removes the unlisted directories and cgroups).
// It is also one write where there was one per fork. The error names
// the first fork that failed ("N of M): ...").
func (m *Manager) recordForks(made madeForks) error {
	n := len(made.recs)
	for i, err := range made.errs {
		if err != nil {
			return fmt.Errorf("%d of %d): %w", i+1, n, err)
		}
	}
	m.crashpoint("fork:made")
	err := m.db.Update(func(tx *meta.Tx) error {
		for _, rec := range made.recs {
			if err := tx.Put(meta.Sandboxes, rec.ID, rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("1 of %d): record the forks: %w", n, err)
	}
	m.crashpoint("fork:recorded")
	return nil
}

// reseed gives every session of a fork a fresh seed for $RANDOM from the
// kernel ($SRANDOM reads getrandom). $RANDOM is not part of a session's
// state digest, so this is not a turn effect. It returns how many
// sessions it reseeded.
func (m *Manager) reseed(ctx context.Context, rec sandboxRec) (int, error) {
	st, err := m.call(ctx, rec, sbinit.Request{Op: "status"})
	if err != nil {
		return 0, fmt.Errorf("reseed: %w", err)
	}
	for _, s := range st.Sessions {
		r, err := m.call(ctx, rec, sbinit.Request{Op: "session-run", Session: s.Name, Command: "RANDOM=$SRANDOM", TimeoutMS: 5000})
		if err != nil || r.ExitCode != 0 {
			return 0, fmt.Errorf("reseed session %s: %v (exit %d)", s.Name, err, r.ExitCode)
		}
	}
	return len(st.Sessions), nil
}

// forkParallelism is how many forks are made at once. A fork spends much
// of its time waiting, not computing: for RCU grace periods as CRIU
// moves into the fork's cgroups (one per hierarchy) and for btrfs
// commits, which concurrent snapshots share. 8 idle forks on 2 CPUs:
// 28-33 forks/s two at a time, 33-36 four, 39-57 eight.
func forkParallelism() int { return max(8, 2*runtime.NumCPU()) }
