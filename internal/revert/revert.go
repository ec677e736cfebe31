// Package revert undoes the completed steps of a multi-step operation
// when a later step fails.
//
//	r := revert.New()
//	defer r.Fail()
//	... step; r.Add(undoStep) ...
//	r.Success()
//
// Fail runs the undo functions in reverse order unless Success was called.
// Undo errors are collected, not hidden: Err holds them, and a Reverter
// made with Logged logs each one.
package revert

import (
	"errors"
	"log/slog"
)

// Reverter collects undo functions.
type Reverter struct {
	fns  []func() error
	done bool
	log  *slog.Logger
	op   string
	// Err holds the joined errors of the undo functions after Fail ran.
	Err error
}

// Logged returns an empty Reverter whose Fail logs each undo that fails
// to l, naming op (what the undone operation was).
func Logged(l *slog.Logger, op string) *Reverter { return &Reverter{log: l, op: op} }

// New returns an empty Reverter.
func New() *Reverter { return &Reverter{} }

// Add registers an undo function for a completed step.
func (r *Reverter) Add(fn func() error) { r.fns = append(r.fns, fn) }

// Success keeps every step: later Fail calls do nothing.
func (r *Reverter) Success() { r.done = true }

// Fail undoes the registered steps in reverse order, unless Success was
// called.
func (r *Reverter) Fail() {
	if r.done {
		return
	}
	r.done = true
	var errs []error
	for i := len(r.fns) - 1; i >= 0; i-- {
		if err := r.fns[i](); err != nil {
			errs = append(errs, err)
			if r.log != nil {
				r.log.Warn("undo of a failed operation failed; what it made may remain until start-up removes it", "op", r.op, "err", err)
			}
		}
	}
	r.Err = errors.Join(errs...)
}
