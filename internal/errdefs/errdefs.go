// Package errdefs defines the few error kinds molt distinguishes.
//
// Packages wrap one of these sentinels with context ("rollback %s: %w") and
// callers test the kind with errors.Is. The kinds are mapped to HTTP status
// codes in exactly one place (internal/httpapi) and back to the same
// sentinels in the client, so errors.Is works across the API boundary.
package errdefs

import "errors"

var (
	// ErrNotFound: the named object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: an object with that name or ID already exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: the request is malformed or refers to something
	// that can never be valid (a hostile archive, a bad name).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrFailedPrecondition: the request is valid but the object is not in
	// a state that allows it (exec in a stopped sandbox).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrUnavailable: a transient condition; retrying may succeed.
	ErrUnavailable = errors.New("unavailable")
	// ErrNotSupported: this host or build cannot do it; the message says why.
	ErrNotSupported = errors.New("not supported")
	// ErrResourceExhausted: the host lacks a resource the work needs (disk
	// space in the pool or under it, beyond the configured reserve).
	// Retrying once space is freed may succeed.
	ErrResourceExhausted = errors.New("resource exhausted")
)

// Kind returns the sentinel that err wraps, or nil if it wraps none. A
// lack of space is the cause that matters most to the caller, so it wins
// over any other kind the same error wraps.
func Kind(err error) error {
	for _, k := range []error{ErrResourceExhausted, ErrNotFound, ErrAlreadyExists, ErrInvalidArgument, ErrFailedPrecondition, ErrUnavailable, ErrNotSupported} {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}
