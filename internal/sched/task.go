// A running job's handle: charging its I/O against the host's budget.

package sched

import (
	"context"
	"time"
)

// Task is a running job's handle on the scheduler.
type Task struct {
	job *Job
}

// Job returns the task's job.
func (t *Task) Job() *Job { return t.job }

// Charge accounts n bytes of the job's I/O against the host's budget,
// waiting as long as needed to stay within it, and first and last waits
// while the job is paused by foreground work (n = 0 just waits for the
// pause to end: a yield point). It returns ctx's error, or the job
// context's if the job is canceled, when either ends first. Rollback jobs
// are only counted, never delayed.
func (t *Task) Charge(ctx context.Context, n int64) error {
	j := t.job
	s := j.s
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := j.ctx.Err(); err != nil {
		return err
	}
	if j.class != Rollback {
		if err := s.waitForeground(ctx, j); err != nil {
			return err
		}
		if n > 0 && s.bucket != nil {
			if d := s.bucket.take(n, time.Now()); d > 0 {
				if err := s.throttle(ctx, j, n, d); err != nil {
					return err
				}
				if err := s.waitForeground(ctx, j); err != nil {
					return err
				}
			}
		}
	}
	if n > 0 {
		s.bytes[j.class].Add(n)
	}
	return nil
}

// throttle sleeps for d, the debt of a charge of n; if ctx or the job
// ends first the unslept part is given back to the bucket.
func (s *Scheduler) throttle(ctx context.Context, j *Job, n int64, d time.Duration) error {
	start := time.Now()
	timer := time.NewTimer(d)
	defer timer.Stop()
	var err error
	select {
	case <-timer.C:
	case <-ctx.Done():
		err = ctx.Err()
	case <-j.ctx.Done():
		err = j.ctx.Err()
	}
	slept := time.Since(start)
	s.throttled.Add(int64(slept))
	if err != nil {
		if left := d - slept; left > 0 {
			s.bucket.refund(n, left)
		}
	}
	return err
}
