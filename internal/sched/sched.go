package sched

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Class is a kind of work; a lower value has strict priority over a
// higher one.
type Class int

const (
	// Rollback is foreground work on an agent's critical path. Rollback
	// jobs bypass the worker limit, the queue limits and the I/O budget,
	// and hold Foreground for their sandbox while queued or running.
	Rollback Class = iota
	// Persist stores a captured checkpoint's pages and manifest and
	// commits it.
	Persist
	// Standby prepares pre-restored standby process trees.
	Standby
	// GC deletes old roots and snapshots.
	GC

	// NumClasses is the number of classes.
	NumClasses = 4
)

var classNames = [NumClasses]string{"rollback", "persist", "standby", "gc"}

func (c Class) String() string {
	if c.valid() {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", int(c))
}

func (c Class) valid() bool { return c >= 0 && c < NumClasses }

var (
	// ErrQueueFull: the sandbox's queue for the class, or the host's
	// queue, is full (TrySubmit).
	ErrQueueFull = fmt.Errorf("sched: queue full: %w", errdefs.ErrUnavailable)
	// ErrClosed: the scheduler is closed.
	ErrClosed = fmt.Errorf("sched: scheduler closed: %w", errdefs.ErrUnavailable)
	// ErrCanceled: the job was dropped from its queue, or its context was
	// canceled, by CancelSandbox or Close.
	ErrCanceled = errors.New("sched: job canceled")
)

// Config configures a Scheduler. Zero values take the defaults.
type Config struct {
	// Workers is the number of background (non-Rollback) jobs that may
	// run at once host-wide. Default: 1 on hosts with at most 2 CPUs,
	// else NumCPU/2.
	Workers int
	// ClassWorkers caps the running jobs of each background class (the
	// Rollback entry is ignored). Defaults: Persist Workers, Standby
	// max(1, Workers/2), GC 1. Values above Workers are clamped.
	ClassWorkers [NumClasses]int
	// MaxQueuedPerSandbox bounds the queued (not running) jobs of one
	// (sandbox, class) pair. Default 8.
	MaxQueuedPerSandbox int
	// MaxQueued bounds the queued background jobs host-wide. Default 256.
	MaxQueued int
	// BytesPerSec is the I/O budget of background jobs, charged through
	// Task.Charge. 0 (or negative): unlimited.
	BytesPerSec int64
	// Burst is the token bucket's depth in bytes: how much may be charged
	// at once without waiting after a quiet period. Default BytesPerSec/4
	// (a quarter second of budget). Ignored when BytesPerSec is 0.
	Burst int64
}

// withDefaults returns c with its zero values replaced by the defaults.
func (c Config) withDefaults() Config {
	if c.Workers <= 0 {
		c.Workers = defaultWorkers(runtime.NumCPU())
	}
	def := [NumClasses]int{Rollback: 0, Persist: c.Workers, Standby: max(1, c.Workers/2), GC: 1}
	c.ClassWorkers[Rollback] = 0
	for cl := Persist; cl < NumClasses; cl++ {
		if c.ClassWorkers[cl] <= 0 {
			c.ClassWorkers[cl] = def[cl]
		}
		c.ClassWorkers[cl] = min(c.ClassWorkers[cl], c.Workers)
	}
	if c.MaxQueuedPerSandbox <= 0 {
		c.MaxQueuedPerSandbox = 8
	}
	if c.MaxQueued <= 0 {
		c.MaxQueued = 256
	}
	if c.BytesPerSec <= 0 {
		c.BytesPerSec, c.Burst = 0, 0
	} else if c.Burst <= 0 {
		c.Burst = max(c.BytesPerSec/4, 1)
	}
	return c
}

func defaultWorkers(ncpu int) int {
	if ncpu <= 2 {
		return 1
	}
	return ncpu / 2
}

// A Scheduler runs background jobs for the sandboxes of a host. It is
// safe for concurrent use.
type Scheduler struct {
	cfg Config

	base       context.Context         // parent of every job's context
	baseCancel context.CancelCauseFunc // +checklocks:mu
	wg         sync.WaitGroup          // running jobs

	mu        sync.Mutex
	closed    bool
	sandboxes map[string]*sandbox
	ready     [NumClasses][]*lane // round-robin rings of background lanes
	queued    [NumClasses]int
	running   [NumClasses]int
	bgQueued  int           // queued background jobs, against MaxQueued
	bgRunning int           // running background jobs, against Workers
	space     chan struct{} // closed when queue space may have freed; made by waiters
	fg        int           // foreground holders, Rollback jobs included
	fgBy      map[string]int
	fgWake    chan struct{} // closed when paused Charges should look again; made by waiters
	counts    [NumClasses]counts

	fgN       atomic.Int32 // mirror of fg, for Charge's fast path
	bytes     [NumClasses]atomic.Int64
	throttled atomic.Int64 // nanoseconds Charge waited for tokens
	paused    atomic.Int64 // nanoseconds Charge waited for foreground
	bucket    *bucket      // nil: unlimited

	met *metrics
}

type counts struct {
	done, failed, canceled uint64
	wait, run              time.Duration
}

// sandbox is one sandbox's lanes; it exists while a lane does.
type sandbox struct {
	id    string
	lanes [NumClasses]*lane
}

// lane is the FIFO queue of one (sandbox, class) pair, of which at most
// one job runs at a time.
type lane struct {
	sb      *sandbox
	class   Class
	queue   []*Job
	running *Job
	inRing  bool // listed in its class's ring (the entry may be stale: see nextLocked)
}

func (l *lane) isReady() bool { return l.running == nil && len(l.queue) > 0 }

// New returns a Scheduler configured by cfg (zero fields take defaults).
func New(cfg Config) *Scheduler {
	cfg = cfg.withDefaults()
	s := &Scheduler{
		cfg:       cfg,
		sandboxes: map[string]*sandbox{},
		fgBy:      map[string]int{},
	}
	s.base, s.baseCancel = context.WithCancelCause(context.Background())
	if cfg.BytesPerSec > 0 {
		s.bucket = newBucket(cfg.BytesPerSec, cfg.Burst, time.Now())
	}
	s.met = newMetrics(s)
	return s
}

// Config returns the effective configuration, defaults filled in.
func (s *Scheduler) Config() Config { return s.cfg }

type jobKey struct{}

// Submit queues fn to run as a job of the sandbox's class, blocking while
// the (sandbox, class) queue or the host queue is full. ctx bounds only
// that wait: the job runs under its own context, canceled by
// CancelSandbox and Close. A Submit whose ctx comes from a running job of
// this scheduler (nested work) is never blocked by the queue limits.
// Rollback jobs are never blocked either. sandbox may be "" for work that
// belongs to no sandbox.
func (s *Scheduler) Submit(ctx context.Context, sandbox string, class Class, name string, fn func(ctx context.Context, t *Task) error) (*Job, error) {
	return s.submit(ctx, sandbox, class, name, fn, true)
}

// TrySubmit is Submit without the wait: it returns ErrQueueFull at once
// when a queue is full (nested submissions included).
func (s *Scheduler) TrySubmit(sandbox string, class Class, name string, fn func(ctx context.Context, t *Task) error) (*Job, error) {
	return s.submit(context.Background(), sandbox, class, name, fn, false)
}

func (s *Scheduler) submit(ctx context.Context, sbID string, class Class, name string, fn func(context.Context, *Task) error, block bool) (*Job, error) {
	if !class.valid() {
		return nil, fmt.Errorf("sched: submit %q: invalid class %d: %w", name, int(class), errdefs.ErrInvalidArgument)
	}
	if fn == nil {
		return nil, fmt.Errorf("sched: submit %q: nil func: %w", name, errdefs.ErrInvalidArgument)
	}
	nested := false
	if block {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if j, ok := ctx.Value(jobKey{}).(*Job); ok && j.s == s {
			nested = true
		}
	}
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if class == Rollback || nested || s.hasSpaceLocked(sbID, class) {
			break
		}
		if !block {
			s.mu.Unlock()
			return nil, ErrQueueFull
		}
		if s.space == nil {
			s.space = make(chan struct{})
		}
		space := s.space
		s.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
	j := &Job{s: s, sandbox: sbID, class: class, name: name, fn: fn, done: make(chan struct{}), submitted: time.Now()}
	j.task.job = j
	l := s.laneLocked(sbID, class)
	j.lane = l
	l.queue = append(l.queue, j)
	s.queued[class]++
	if class == Rollback {
		s.fgAcquireLocked(sbID)
		if l.running == nil {
			s.startLocked(l)
		}
	} else {
		s.bgQueued++
		if l.running == nil && !l.inRing {
			l.inRing = true
			s.ready[class] = append(s.ready[class], l)
		}
	}
	s.dispatchLocked()
	s.mu.Unlock()
	return j, nil
}

func (s *Scheduler) hasSpaceLocked(sbID string, class Class) bool {
	if s.bgQueued >= s.cfg.MaxQueued {
		return false
	}
	if sb := s.sandboxes[sbID]; sb != nil {
		if l := sb.lanes[class]; l != nil && len(l.queue) >= s.cfg.MaxQueuedPerSandbox {
			return false
		}
	}
	return true
}

func (s *Scheduler) laneLocked(sbID string, class Class) *lane {
	sb := s.sandboxes[sbID]
	if sb == nil {
		sb = &sandbox{id: sbID}
		s.sandboxes[sbID] = sb
	}
	l := sb.lanes[class]
	if l == nil {
		l = &lane{sb: sb, class: class}
		sb.lanes[class] = l
	}
	return l
}

// forgetLocked drops a lane with no work left, and its sandbox with no
// lanes left. A stale ring entry may still point at the lane; it is
// skipped since it holds no work.
func (s *Scheduler) forgetLocked(l *lane) {
	if l.running != nil || len(l.queue) > 0 || l.sb.lanes[l.class] != l {
		return
	}
	l.sb.lanes[l.class] = nil
	for _, o := range l.sb.lanes {
		if o != nil {
			return
		}
	}
	delete(s.sandboxes, l.sb.id)
}

// wakeSpaceLocked tells blocked Submits that queue space may have freed.
func (s *Scheduler) wakeSpaceLocked() {
	if s.space != nil {
		close(s.space)
		s.space = nil
	}
}

// wakeFgLocked tells paused Charges to look at the foreground again.
func (s *Scheduler) wakeFgLocked() {
	if s.fgWake != nil {
		close(s.fgWake)
		s.fgWake = nil
	}
}

// dispatchLocked starts the background jobs that may start now: with no
// foreground, by class priority and round robin up to the worker limits;
// with foreground, only those of the sandboxes that hold it (priority
// inheritance), regardless of the limits.
func (s *Scheduler) dispatchLocked() {
	if s.closed || s.bgQueued == 0 {
		return
	}
	if s.fg > 0 {
		for id := range s.fgBy {
			sb := s.sandboxes[id]
			if sb == nil {
				continue
			}
			for c := Persist; c < NumClasses; c++ {
				if l := sb.lanes[c]; l != nil && l.isReady() {
					s.startLocked(l)
				}
			}
		}
		return
	}
	for s.bgRunning < s.cfg.Workers {
		l := s.nextLocked()
		if l == nil {
			return
		}
		s.startLocked(l)
	}
}

// nextLocked takes the next ready lane off the rings: the highest class
// under its cap with a ready lane, the lane at the front of its ring.
func (s *Scheduler) nextLocked() *lane {
	for c := Persist; c < NumClasses; c++ {
		if s.running[c] >= s.cfg.ClassWorkers[c] {
			continue
		}
		for len(s.ready[c]) > 0 {
			l := s.ready[c][0]
			s.ready[c][0] = nil
			s.ready[c] = s.ready[c][1:]
			l.inRing = false
			// A lane already running (boosted) goes back on the ring
			// when its job ends; an emptied one is forgotten.
			if l.isReady() {
				return l
			}
		}
	}
	return nil
}

// startLocked starts the job at the front of a lane.
func (s *Scheduler) startLocked(l *lane) {
	j := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	if len(l.queue) == 0 {
		l.queue = nil
	}
	l.running = j
	c := l.class
	s.queued[c]--
	s.running[c]++
	if c != Rollback {
		s.bgQueued--
		s.bgRunning++
		s.wakeSpaceLocked()
	}
	j.started = time.Now()
	wait := j.started.Sub(j.submitted)
	s.counts[c].wait += wait
	s.met.wait[c].Observe(wait.Seconds())
	ctx, cancel := context.WithCancelCause(s.base)
	j.ctx, j.cancel = context.WithValue(ctx, jobKey{}, j), cancel
	s.wg.Add(1)
	go s.run(j)
}

func (s *Scheduler) run(j *Job) {
	err := j.call()
	canceled := j.ctx.Err() != nil // by CancelSandbox or Close
	j.cancel(nil)
	if err != nil && canceled && !errors.Is(err, ErrCanceled) {
		err = fmt.Errorf("%w: %w", ErrCanceled, err)
	}
	s.mu.Lock()
	l, c := j.lane, j.class
	l.running = nil
	s.running[c]--
	if c != Rollback {
		s.bgRunning--
	}
	s.counts[c].run += time.Since(j.started)
	switch {
	case err == nil:
		s.counts[c].done++
	case errors.Is(err, ErrCanceled):
		s.counts[c].canceled++
	default:
		s.counts[c].failed++
	}
	j.finishLocked(err)
	if c == Rollback {
		s.fgReleaseLocked(j.sandbox)
		if len(l.queue) > 0 && !s.closed {
			s.startLocked(l)
		}
	} else if len(l.queue) > 0 && !l.inRing {
		l.inRing = true
		s.ready[c] = append(s.ready[c], l)
	}
	s.forgetLocked(l)
	s.dispatchLocked()
	s.mu.Unlock()
	s.wg.Done()
}

// dropLocked ends a job taken off its queue before it ran.
func (s *Scheduler) dropLocked(j *Job) {
	c := j.class
	s.queued[c]--
	if c == Rollback {
		s.fgReleaseLocked(j.sandbox)
	} else {
		s.bgQueued--
	}
	s.counts[c].canceled++
	j.finishLocked(ErrCanceled)
}

// dropLanesLocked drops the queued jobs of every lane of sb and, with
// cancelRunning, cancels its running ones.
func (s *Scheduler) dropLanesLocked(sb *sandbox, cancelRunning bool) {
	for _, l := range sb.lanes {
		if l == nil {
			continue
		}
		q := l.queue
		l.queue = nil
		for _, j := range q {
			s.dropLocked(j)
		}
		if cancelRunning && l.running != nil {
			l.running.cancel(ErrCanceled)
		}
		s.forgetLocked(l)
	}
}

// CancelSandbox drops the sandbox's queued jobs (their Wait returns
// ErrCanceled) and cancels the contexts of its running ones; it does not
// wait for those to return (see WaitSandbox). Later submissions for the
// sandbox are accepted as usual.
func (s *Scheduler) CancelSandbox(sandbox string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[sandbox]
	if sb == nil {
		return
	}
	s.dropLanesLocked(sb, true)
	s.wakeSpaceLocked()
	s.dispatchLocked()
}

// WaitSandbox waits until the sandbox has no queued or running jobs (as
// after CancelSandbox, before removing the sandbox's files), or ctx ends.
func (s *Scheduler) WaitSandbox(ctx context.Context, sandbox string) error {
	for {
		s.mu.Lock()
		sb := s.sandboxes[sandbox]
		var wait *Job
		if sb != nil {
			for _, l := range sb.lanes {
				if l == nil {
					continue
				}
				if n := len(l.queue); n > 0 {
					wait = l.queue[n-1]
				} else if l.running != nil {
					wait = l.running
				}
				if wait != nil {
					break
				}
			}
		}
		s.mu.Unlock()
		if wait == nil {
			return nil
		}
		select {
		case <-wait.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close cancels everything: queued jobs end with ErrCanceled, running
// jobs' contexts are canceled, blocked and later Submits return
// ErrClosed. It waits for the running jobs to return. It must not be
// called from a job.
func (s *Scheduler) Close() error {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		for _, sb := range s.sandboxes {
			s.dropLanesLocked(sb, false) // the base context cancels the running
		}
		for c := range s.ready {
			s.ready[c] = nil
		}
		s.baseCancel(ErrClosed)
		s.wakeSpaceLocked()
		s.wakeFgLocked()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}
