// Package errdefs defines the few error kinds molt distinguishes.
//
// Packages wrap one of these sentinels with context ("rollback %s: %w") and
// callers test the kind with errors.Is. The kinds are mapped to HTTP status
// codes in exactly one place (internal/httpapi); the sentinels are
// api/v1's, which the client maps each wire kind back to, so errors.Is
// works across the API boundary with either package's names.
package errdefs

import (
	"errors"

	v1 "github.com/molt-sh/molt/api/v1"
)

// The sentinels are api/v1's values, not copies: the client returns
// errors that wrap the same values, so errors.Is(err, ErrNotFound) holds
// for an error from the engine and for one that crossed the API.
var (
	// ErrNotFound: the named object does not exist.
	ErrNotFound = v1.ErrNotFound
	// ErrAlreadyExists: an object with that name or ID already exists.
	ErrAlreadyExists = v1.ErrAlreadyExists
	// ErrInvalidArgument: the request is malformed or refers to something
	// that can never be valid (a hostile archive, a bad name).
	ErrInvalidArgument = v1.ErrInvalidArgument
	// ErrFailedPrecondition: the request is valid but the object is not in
	// a state that allows it (exec in a stopped sandbox).
	ErrFailedPrecondition = v1.ErrFailedPrecondition
	// ErrUnavailable: a transient condition; retrying may succeed.
	ErrUnavailable = v1.ErrUnavailable
	// ErrConflict: the request would break what others rely on (a
	// rollback past a consumed effect); the message lists what.
	ErrConflict = v1.ErrConflict
	// ErrNotSupported: this host or build cannot do it; the message says why.
	ErrNotSupported = v1.ErrNotSupported
	// ErrResourceExhausted: the host lacks a resource the work needs (disk
	// space in the pool or under it, beyond the configured reserve).
	// Retrying once space is freed may succeed.
	ErrResourceExhausted = v1.ErrResourceExhausted
	// ErrUnauthenticated: no valid token; ErrPermissionDenied: the
	// token may not do this.
	ErrUnauthenticated  = v1.ErrUnauthenticated
	ErrPermissionDenied = v1.ErrPermissionDenied
)

// Kind returns the sentinel that err wraps, or nil if it wraps none. A
// lack of space is the cause that matters most to the caller, so it wins
// over any other kind the same error wraps.
func Kind(err error) error {
	for _, k := range []error{ErrResourceExhausted, ErrNotFound, ErrAlreadyExists, ErrInvalidArgument, ErrFailedPrecondition, ErrUnavailable, ErrNotSupported, ErrConflict, ErrUnauthenticated, ErrPermissionDenied} {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}
