// Package testutil holds helpers shared by molt's tests.
package testutil

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
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

// StatFields returns the fields of /proc/PID/stat after the command:
// [0] is the state, [1] the parent's pid, [11] utime.
func StatFields(t testing.TB, pid int) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
}

// WaitState waits up to 5 s for pid to be in state want (as
// /proc/PID/stat shows it: "S", "T", "t", ...).
func WaitState(t testing.TB, pid int, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for StatFields(t, pid)[0] != want {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d in state %s, want %s", pid, StatFields(t, pid)[0], want)
		}
		time.Sleep(time.Millisecond)
	}
}

// SystemPython is the interpreter tests run on the host: Debian's, which
// scripts/deps.sh installs. A python3 found on PATH may be a user's
// build (pyenv), whose version, modules and behaviour under CRIU differ
// from machine to machine.
const SystemPython = "/usr/bin/python3"

// Python returns SystemPython, or reports it unavailable.
func Python(t testing.TB) string {
	t.Helper()
	if _, err := os.Stat(SystemPython); err != nil {
		Unavailable(t, "no system python3 (run scripts/deps.sh): "+err.Error())
	}
	return SystemPython
}
