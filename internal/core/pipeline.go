package core

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/molt-sh/molt/internal/progress"
)

// The checkpoint pipeline: a full checkpoint returns once its consistent
// instant is captured (after the thaw); storing the images, the manifest
// and the commit run in the background. Until committed the checkpoint
// is pending: listed from memory, never from the metadata, so a crash
// before the commit leaves nothing listed (start-up removes its
// directory and moves a head that named it back). Each sandbox's pending
// checkpoints commit in order, since each shares the pages of the one
// before. Anything that needs a pending checkpoint (rollback, fork,
// verify, delete) waits for it.

type pendingJob struct {
	ck   checkpointRec
	prev *pendingJob // the sandbox's previous pending job, or nil
	done chan struct{}
	err  error
	// written counts the bytes its images have written to the pool so
	// far (progress of a waiter).
	written atomic.Int64
}

func (j *pendingJob) waitPrevious() {
	if j.prev != nil {
		<-j.prev.done
	}
}

type pipeline struct {
	mu sync.Mutex
	// By checkpoint ID, until committed.
	jobs map[string]*pendingJob // +checklocks:mu
	// By sandbox ID: the newest job.
	last map[string]*pendingJob // +checklocks:mu
	wg   sync.WaitGroup
}

// add registers a captured checkpoint as pending.
func (p *pipeline) add(ck checkpointRec) *pendingJob {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.jobs == nil {
		p.jobs, p.last = map[string]*pendingJob{}, map[string]*pendingJob{}
	}
	j := &pendingJob{ck: ck, prev: p.last[ck.Sandbox], done: make(chan struct{})}
	p.jobs[ck.ID] = j
	p.last[ck.Sandbox] = j
	p.wg.Add(1)
	return j
}

// done records the outcome of a job and releases its waiters.
func (p *pipeline) done(j *pendingJob, ck checkpointRec, err error) {
	p.mu.Lock()
	j.ck, j.err = ck, err
	delete(p.jobs, ck.ID)
	if p.last[ck.Sandbox] == j {
		delete(p.last, ck.Sandbox)
	}
	p.mu.Unlock()
	close(j.done)
	p.wg.Done()
}

// reparent moves pending children of a checkpoint taken out of the tree.
func (p *pipeline) reparent(id, parent string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, j := range p.jobs {
		if j.ck.Parent == id {
			j.ck.Parent = parent
		}
	}
}

// matching returns the pending jobs a checkpoint reference may name (ID,
// ID prefix or label) or, with sandbox set, all of that sandbox's.
func (p *pipeline) matching(ref, sandbox string) []*pendingJob {
	p.mu.Lock()
	defer p.mu.Unlock()
	// SANDBOX:LABEL: waiting for every pending checkpoint with the label
	// is enough (a wider wait, never a narrower one).
	if _, label, ok := strings.Cut(ref, ":"); ok {
		ref = label
	}
	var out []*pendingJob
	for _, j := range p.jobs {
		if (sandbox != "" && j.ck.Sandbox == sandbox) ||
			(ref != "" && (j.ck.ID == ref || j.ck.Label == ref || (len(ref) >= 4 && strings.HasPrefix(j.ck.ID, ref)))) {
			out = append(out, j)
		}
	}
	return out
}

// wait waits for the jobs ref or sandbox names to end.
func (p *pipeline) wait(ctx context.Context, ref, sandbox string) error {
	for _, j := range p.matching(ref, sandbox) {
		if err := p.waitJob(ctx, j); err != nil {
			return err
		}
	}
	return nil
}

// waitJob waits for job j to end, reporting the bytes it has written
// to ctx's progress receiver as it goes.
func (p *pipeline) waitJob(ctx context.Context, j *pendingJob) error {
	if !progress.Enabled(ctx) {
		select {
		case <-j.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	id := p.ckOf(j).ID
	report := func() {
		progress.Report(ctx, progress.Step{Message: "storing checkpoint " + id + " (new pages only)", Done: j.written.Load(), Unit: "bytes"})
	}
	report()
	t := time.NewTicker(progressTick)
	defer t.Stop()
	for {
		select {
		case <-j.done:
			report()
			return nil
		case <-t.C:
			report()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// progressTick is how often a waiter reports a pending checkpoint's
// storage.
const progressTick = 250 * time.Millisecond

// job returns the pending job of checkpoint id, or nil.
func (p *pipeline) job(id string) *pendingJob {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.jobs[id]
}

// ckOf returns a copy of a job's checkpoint record.
func (p *pipeline) ckOf(j *pendingJob) checkpointRec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return j.ck
}

// pending lists a sandbox's pending checkpoints.
func (p *pipeline) pending(sandbox string) []checkpointRec {
	var out []checkpointRec
	for _, j := range p.matching("", sandbox) {
		out = append(out, p.ckOf(j))
	}
	return out
}
