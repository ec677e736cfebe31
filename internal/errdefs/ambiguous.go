package errdefs

import (
	"fmt"
	"strings"
)

// AmbiguousError reports a reference that names more than one object.
// Candidates are references that each name exactly one of them (for a
// checkpoint label, SANDBOX:LABEL). It is an ErrInvalidArgument.
type AmbiguousError struct {
	Kind       string // "checkpoint", "sandbox"
	Ref        string
	Candidates []string
}

func (e *AmbiguousError) Error() string {
	return fmt.Sprintf("%s %q is ambiguous (%d matches: %s)", e.Kind, e.Ref, len(e.Candidates), strings.Join(e.Candidates, ", "))
}

// Unwrap makes errors.Is(err, ErrInvalidArgument) hold.
func (e *AmbiguousError) Unwrap() error { return ErrInvalidArgument }
