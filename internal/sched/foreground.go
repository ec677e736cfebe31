// Foreground work: while a sandbox rolls back, its background jobs pause
// at their next I/O charge.

package sched

import (
	"context"
	"time"
)

// Foreground marks foreground work (a rollback) of the sandbox as in
// progress until release is called. Call release exactly once: it is not
// idempotent (it panics when it finds no hold to end, but a second release
// while another holder exists goes unnoticed). Meanwhile no background
// job is dispatched and running background jobs block in Task.Charge,
// except the sandbox's own (see the package doc: priority inheritance);
// its queued background jobs are dispatched at once, past the worker
// limit. Foreground("") pauses everything and boosts nothing.
func (s *Scheduler) Foreground(sandbox string) (release func()) {
	s.mu.Lock()
	s.fgAcquireLocked(sandbox)
	if sandbox != "" && s.bgQueued > 0 && s.sandboxes[sandbox] != nil {
		s.dispatchLocked()
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		ok := s.fgReleaseLocked(sandbox)
		s.dispatchLocked()
		s.mu.Unlock()
		if !ok {
			panic("sched: Foreground(" + sandbox + ") released more often than acquired")
		}
	}
}

func (s *Scheduler) fgAcquireLocked(sandbox string) {
	s.fg++
	s.fgN.Store(int32(s.fg))
	if sandbox != "" {
		s.fgBy[sandbox]++
		// The sandbox's own paused Charges may go on.
		s.wakeFgLocked()
	}
}

// fgReleaseLocked ends a foreground hold; false if there was none to end
// (the counters are left alone).
func (s *Scheduler) fgReleaseLocked(sandbox string) bool {
	if s.fg <= 0 || (sandbox != "" && s.fgBy[sandbox] <= 0) {
		return false
	}
	s.fg--
	s.fgN.Store(int32(s.fg))
	if sandbox != "" {
		if n := s.fgBy[sandbox]; n > 1 {
			s.fgBy[sandbox] = n - 1
		} else {
			delete(s.fgBy, sandbox)
		}
	}
	if s.fg == 0 {
		s.wakeFgLocked()
	}
	return true
}

// pausedLocked reports whether background work of the sandbox must wait
// for the foreground.
func (s *Scheduler) pausedLocked(sandbox string) bool {
	return s.fg > 0 && (sandbox == "" || s.fgBy[sandbox] == 0)
}

func (s *Scheduler) waitForeground(ctx context.Context, j *Job) error {
	if s.fgN.Load() == 0 {
		return nil
	}
	var start time.Time
	s.mu.Lock()
	for s.pausedLocked(j.sandbox) && !s.closed {
		if start.IsZero() {
			start = time.Now()
		}
		if s.fgWake == nil {
			s.fgWake = make(chan struct{})
		}
		wake := s.fgWake
		s.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		case <-j.ctx.Done():
			err = j.ctx.Err()
		}
		if err != nil {
			s.paused.Add(int64(time.Since(start)))
			return err
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	if !start.IsZero() {
		s.paused.Add(int64(time.Since(start)))
	}
	return nil
}
