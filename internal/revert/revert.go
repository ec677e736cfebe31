// Package revert undoes the completed steps of a multi-step operation
// when a later step fails.
//
//	r := revert.New()
//	defer r.Fail()
//	... step; r.Add(undoStep) ...
//	r.Success()
//
// Fail runs the undo functions in reverse order unless Success was called.
// Undo errors are collected, not hidden: the caller may report them.
package revert

import "errors"

// Reverter collects undo functions.
type Reverter struct {
	fns  []func() error
	done bool
	// Err holds the joined errors of the undo functions after Fail ran.
	Err error
}

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
		}
	}
	r.Err = errors.Join(errs...)
}
