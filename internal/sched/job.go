// A submitted job: its identity, its result and waiting for it.

package sched

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"
)

// Job is a submitted unit of work.
type Job struct {
	s       *Scheduler
	sandbox string
	class   Class
	name    string
	fn      func(context.Context, *Task) error // nil once ended
	lane    *lane
	task    Task

	// Set when started, under s.mu.
	ctx       context.Context
	cancel    context.CancelCauseFunc
	submitted time.Time
	started   time.Time

	done chan struct{}
	err  error // set before done is closed
}

// Sandbox returns the job's sandbox.
func (j *Job) Sandbox() string { return j.sandbox }

// Class returns the job's class.
func (j *Job) Class() Class { return j.class }

// Name returns the job's name.
func (j *Job) Name() string { return j.name }

// Done is closed when the job has ended: run, failed or been dropped.
func (j *Job) Done() <-chan struct{} { return j.done }

// Err returns the job's result once it has ended, nil before. A job
// dropped from its queue ends with ErrCanceled; one that failed after its
// context was canceled by CancelSandbox or Close with an error wrapping
// both ErrCanceled and its own.
func (j *Job) Err() error {
	select {
	case <-j.done:
		return j.err
	default:
		return nil
	}
}

// Wait waits for the job to end and returns its result, or ctx's error
// if ctx ends first.
func (j *Job) Wait(ctx context.Context) error {
	select {
	case <-j.done:
		return j.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (j *Job) finishLocked(err error) {
	j.err = err
	j.fn = nil
	close(j.done)
}

// call runs the job's function; a panic becomes its error, so that one
// bad job does not take the daemon and every sandbox's work down.
func (j *Job) call() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sched: job %q (sandbox %q, %s) panicked: %v\n%s", j.name, j.sandbox, j.class, r, debug.Stack())
		}
	}()
	return j.fn(j.ctx, &j.task)
}
