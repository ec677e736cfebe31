package v1

import (
	"errors"
	"testing"
)

// Each kind but internal has its own sentinel; method_not_allowed is the
// caller's mistake.
func TestKindSentinel(t *testing.T) {
	seen := map[error]string{}
	for _, kind := range []string{ErrKindNotFound, ErrKindAlreadyExists, ErrKindInvalidArgument,
		ErrKindFailedPrecondition, ErrKindUnavailable, ErrKindNotSupported, ErrKindResourceExhausted} {
		err := KindSentinel(kind)
		if err == nil {
			t.Fatalf("%s: no sentinel", kind)
		}
		if other, ok := seen[err]; ok {
			t.Fatalf("%s and %s share the sentinel %v", kind, other, err)
		}
		seen[err] = kind
	}
	if err := KindSentinel(ErrKindMethodNotAllowed); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("method_not_allowed: %v", err)
	}
	for _, kind := range []string{ErrKindInternal, "", "from_the_future"} {
		if err := KindSentinel(kind); err != nil {
			t.Errorf("%q: %v, want none", kind, err)
		}
	}
}
