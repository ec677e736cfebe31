// Package testutil holds helpers shared by molt's tests.
package testutil

import (
	"os"
	"testing"
)

// RequireRoot skips t when the test does not run as root, unless
// MOLT_REQUIRE_PRIVILEGED=1 (set by CI), in which case a missing privilege
// is a failure: CI must never skip a root test silently.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("MOLT_REQUIRE_PRIVILEGED") == "1" {
		t.Fatalf("test needs root, and MOLT_REQUIRE_PRIVILEGED=1 forbids skipping")
	}
	t.Skip("test needs root (run as root, or in CI with MOLT_REQUIRE_PRIVILEGED=1)")
}

// Unavailable reports a missing host capability: it skips t with reason,
// or fails it when MOLT_REQUIRE_PRIVILEGED=1.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("MOLT_REQUIRE_PRIVILEGED") == "1" {
		t.Fatalf("required capability missing: %s", reason)
	}
	t.Skip(reason)
}
