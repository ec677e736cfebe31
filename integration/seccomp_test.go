package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// seccompStatus is pid1's Seccomp line in a sandbox: 2 filtered, 0 not.
func seccompStatus(t *testing.T, sb string) string {
	t.Helper()
	return strings.TrimSpace(sh(t, sb, "grep ^Seccomp: /proc/1/status | cut -f2"))
}

// TestSeccompCLI: molt create --seccomp default, unconfined and a
// profile file (read by the CLI, sent as content); a missing or broken
// file is refused before anything is created.
func TestSeccompCLI(t *testing.T) {
	def := newSandbox(t)
	if got := seccompStatus(t, def); got != "2" {
		t.Fatalf("default sandbox: pid1 Seccomp %q", got)
	}
	if r := molt(t, "exec", def, "--", "unshare", "-U", "true"); r.code == 0 {
		t.Fatal("unshare -U works in a default sandbox")
	}
	un := newSandbox(t, "--seccomp", "unconfined")
	if got := seccompStatus(t, un); got != "0" {
		t.Fatalf("unconfined sandbox: pid1 Seccomp %q", got)
	}
	dir := t.TempDir()
	prof := filepath.Join(dir, "profile.json")
	if err := os.WriteFile(prof, []byte(`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
		{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cu := newSandbox(t, "--seccomp", prof)
	var s struct{ Seccomp string }
	if mustJSON(t, &s, "inspect", cu); s.Seccomp != "custom" {
		t.Fatalf("inspect: seccomp %q, want custom", s.Seccomp)
	}
	if r := molt(t, "exec", cu, "--", "mkdir", "/tmp/d"); r.code == 0 || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("mkdir under the profile: exit %d, %q", r.code, r.stderr)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"defaultAction": `), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ arg, want string }{
		{filepath.Join(dir, "missing.json"), "no such file"},
		{bad, "not JSON"},
	} {
		if r := molt(t, "create", image, "--seccomp", c.arg); r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("create --seccomp %s: exit %d, %q; want an error mentioning %q", c.arg, r.code, r.stderr, c.want)
		}
	}
}
