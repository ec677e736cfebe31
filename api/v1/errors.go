package v1

import "errors"

// Error kinds: the Kind of an Error body. The daemon maps each kind to
// one HTTP status (docs/api.md); clients map the kind back to its
// sentinel below, so that errors.Is works across the API.
const (
	ErrKindNotFound           = "not_found"
	ErrKindAlreadyExists      = "already_exists"
	ErrKindInvalidArgument    = "invalid_argument"
	ErrKindFailedPrecondition = "failed_precondition"
	ErrKindUnavailable        = "unavailable"
	ErrKindNotSupported       = "not_supported"
	// ErrKindResourceExhausted: no space left beyond the daemon's reserve.
	ErrKindResourceExhausted = "resource_exhausted"
	// ErrKindMethodNotAllowed: the path exists for other methods only.
	ErrKindMethodNotAllowed = "method_not_allowed"
	// ErrKindConflict: the request would break what others rely on (a
	// rollback past an effect someone consumed); the message says what.
	ErrKindConflict = "conflict"
	// ErrKindUnauthenticated: the request carries no valid token (401).
	ErrKindUnauthenticated = "unauthenticated"
	// ErrKindPermissionDenied: the token may not do this (403): an
	// operation outside its scopes, or one only the host admin does.
	ErrKindPermissionDenied = "permission_denied"
	// ErrKindInternal: none of the above; no sentinel.
	ErrKindInternal = "internal"
)

// The error kinds as sentinels, one value shared by the daemon (its
// internal/errdefs names these same values) and the Go client: test a
// kind with errors.Is, never by comparing messages.
var (
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrUnavailable        = errors.New("unavailable")
	ErrNotSupported       = errors.New("not supported")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrConflict           = errors.New("conflict")
	ErrUnauthenticated    = errors.New("unauthenticated")
	ErrPermissionDenied   = errors.New("permission denied")
)

// KindSentinel returns the sentinel of an error kind, nil for internal
// and for a kind this version does not know. A method the daemon does
// not serve on a path is the caller's mistake: invalid argument.
func KindSentinel(kind string) error {
	switch kind {
	case ErrKindNotFound:
		return ErrNotFound
	case ErrKindAlreadyExists:
		return ErrAlreadyExists
	case ErrKindInvalidArgument, ErrKindMethodNotAllowed:
		return ErrInvalidArgument
	case ErrKindFailedPrecondition:
		return ErrFailedPrecondition
	case ErrKindUnavailable:
		return ErrUnavailable
	case ErrKindNotSupported:
		return ErrNotSupported
	case ErrKindResourceExhausted:
		return ErrResourceExhausted
	case ErrKindConflict:
		return ErrConflict
	case ErrKindUnauthenticated:
		return ErrUnauthenticated
	case ErrKindPermissionDenied:
		return ErrPermissionDenied
	}
	return nil
}
