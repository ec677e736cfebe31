package core

import (
	"context"
	"fmt"
	"time"

	"github.com/molt-sh/molt/internal/sched"
)

// Background work (persisting checkpoints, preparing standbys, deleting
// retired roots) runs through the host-wide scheduler (internal/sched):
// few jobs at a time, by priority, fairly between sandboxes, paused while
// any sandbox is in a rollback or a checkpoint's frozen window. With
// WithoutScheduler each job starts at once on its own goroutine, as a
// baseline for benchmarks.

// background runs fn as a job of class for sandbox id. It never blocks
// the caller: back-pressure is applied where work enters (persistRoom).
func (m *Manager) background(id string, class sched.Class, name string, fn func(ctx context.Context, t *sched.Task) error) {
	if m.sch == nil {
		go func() { _ = fn(context.Background(), nil) }()
		return
	}
	if _, err := m.sch.TrySubmit(id, class, name, fn); err == nil {
		return
	}
	// Queue full: wait for room without holding up the caller. The
	// caller's own back-pressure (persistRoom) bounds how many wait.
	go func() {
		if _, err := m.sch.Submit(context.Background(), id, class, name, fn); err != nil {
			m.log.Warn("background job not scheduled; running it now", "sandbox", id, "job", name, "err", err)
			_ = fn(context.Background(), nil)
		}
	}()
}

// foreground marks work an agent waits for (a rollback, a checkpoint's
// capture): background jobs of other sandboxes pause meanwhile.
func (m *Manager) foreground(id string) func() {
	if m.sch == nil {
		return func() {}
	}
	return m.sch.Foreground(id)
}

// charge accounts n bytes written by a background job (t nil: unscheduled).
func charge(ctx context.Context, t *sched.Task, n int64) error {
	if t == nil {
		return nil
	}
	return t.Charge(ctx, n)
}

// persistRoom waits until the sandbox has fewer captured-but-uncommitted
// checkpoints than the scheduler queues per sandbox: a sandbox that
// checkpoints faster than the host stores slows down instead of staging
// images in memory without bound.
func (m *Manager) persistRoom(ctx context.Context, id string) error {
	limit := 8
	if m.sch != nil {
		limit = m.sch.Config().MaxQueuedPerSandbox + 1 // queued + running
	}
	for {
		jobs := m.pipe.matching("", id)
		if len(jobs) < limit {
			return nil
		}
		select {
		case <-jobs[0].done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d pending checkpoints of %s to be stored: %w", len(jobs), id, ctx.Err())
		}
	}
}

// captureSlot waits for one of the host's capture slots: at most as many
// sandboxes are frozen for a checkpoint at once as the host has CPUs.
// Eight CRIU dumps at once on two CPUs freeze every one of the eight for
// four times as long; queued, each waits (unfrozen, running on) and then
// is frozen briefly. Without the scheduler captures are not limited.
func (m *Manager) captureSlot(ctx context.Context) (func(), error) {
	if m.captures == nil {
		return func() {}, nil
	}
	start := time.Now()
	select {
	case m.captures <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	m.metrics.captureWait.Observe(time.Since(start).Seconds())
	return func() { <-m.captures }, nil
}
