package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
)

// TestStatusResourceExhausted: a lack of space is 507 resource_exhausted,
// also when the same error wraps another kind.
func TestStatusResourceExhausted(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("checkpoint x: pool full: %w", errdefs.ErrResourceExhausted),
		errors.Join(fmt.Errorf("hibernate: %w", errdefs.ErrUnavailable), errdefs.ErrResourceExhausted),
	} {
		if code, kind := Status(err); code != http.StatusInsufficientStorage || kind != "resource_exhausted" {
			t.Errorf("Status(%v) = %d %s, want 507 resource_exhausted", err, code, kind)
		}
	}
}
