package integration

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestExecOutputAndExitCodes(t *testing.T) {
	sb := newSandbox(t)

	r := molt(t, "exec", sb, "--", "bash", "-c", "echo out; echo err >&2; exit 7")
	if r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("got exit %d stdout %q stderr %q; want 7, out, err", r.code, r.stdout, r.stderr)
	}
	if r := moltIn(t, "line1\nline2\n", "exec", sb, "--", "wc", "-l"); r.code != 0 || strings.TrimSpace(r.stdout) != "2" {
		t.Fatalf("stdin: got exit %d stdout %q", r.code, r.stdout)
	}
	if r := moltIn(t, "ignored\n", "exec", "--no-stdin", sb, "--", "cat"); r.code != 0 || r.stdout != "" {
		t.Fatalf("--no-stdin: got exit %d stdout %q", r.code, r.stdout)
	}
	out := must(t, "exec", "-e", "FOO=bar", "-w", "/tmp", "-u", "nobody", sb, "--", "bash", "-c", "echo $FOO $(pwd) $(id -u)")
	if out != "bar /tmp 65534\n" {
		t.Fatalf("env/cwd/user: got %q", out)
	}
	if r := molt(t, "exec", sb, "--", "no-such-command"); r.code != 127 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("missing command: exit %d stderr %q; want 127", r.code, r.stderr)
	}
	if r := molt(t, "exec", sb, "--timeout", "300ms", "--", "sleep", "30"); r.code != 124 {
		t.Fatalf("timeout: exit %d; want 124", r.code)
	}
	if r := molt(t, "exec", sb, "--", "bash", "-c", "kill -9 $$"); r.code != 137 {
		t.Fatalf("killed by signal: exit %d; want 137", r.code)
	}
	// Large output arrives whole and in order.
	out = must(t, "exec", sb, "--", "python3", "-c", "import sys\nfor i in range(200000): sys.stdout.write('%d\\n' % i)")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 200000 || lines[199999] != "199999" {
		t.Fatalf("large output: %d lines", len(lines))
	}
	// A detached command keeps running after exec returns.
	pid := strings.TrimSpace(must(t, "exec", "--detach", sb, "--", "sleep", "300"))
	if got := sh(t, sb, "cat /proc/"+pid+"/comm"); got != "sleep\n" {
		t.Fatalf("detached process %s: comm %q", pid, got)
	}
	// The sandbox is isolated: own hostname, PID namespace, loopback only.
	if got := sh(t, sb, "hostname; cat /proc/1/cmdline | tr '\\0' ' '; ls /sys/class/net"); !strings.Contains(got, "/.molt/init") || !strings.HasSuffix(got, "lo\n") {
		t.Fatalf("isolation: %q", got)
	}
	// Capabilities are reduced: no mounting, no device nodes.
	if r := molt(t, "exec", sb, "--", "bash", "-c", "mknod /tmp/sda b 8 0"); r.code == 0 {
		t.Fatal("mknod of a block device succeeded inside the sandbox")
	}
	if r := molt(t, "exec", sb, "--", "bash", "-c", "mount -t tmpfs none /mnt"); r.code == 0 {
		t.Fatal("mount succeeded inside the sandbox")
	}
}

func TestSessionPersistence(t *testing.T) {
	sb := newSandbox(t)
	run := func(session, text string) result {
		t.Helper()
		return molt(t, "exec", sb, "--session", session, "--", text)
	}
	if r := run("a", "export X=42; cd /tmp; greet() { echo hello $1; }; alias ll='echo aliased'; echo set"); r.code != 0 || r.stdout != "set\n" {
		t.Fatalf("first call: %+v", r)
	}
	r := run("a", "echo $X; pwd; greet molt; ll; echo oops >&2; false")
	if r.code != 1 || r.stdout != "42\n/tmp\nhello molt\naliased\n" || r.stderr != "oops\n" {
		t.Fatalf("state did not persist: exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	// Sessions are independent.
	if r := run("b", "echo \"[$X]\"; pwd"); r.stdout != "[]\n/root\n" {
		t.Fatalf("session b sees session a's state: %q", r.stdout)
	}
	// A command reading stdin gets EOF, not the next request.
	if r := run("a", "cat; echo after"); r.code != 0 || r.stdout != "after\n" {
		t.Fatalf("stdin in session: %+v", r)
	}
	// Output without a trailing newline stays intact.
	if r := run("a", "printf abc"); r.stdout != "abc" {
		t.Fatalf("no newline: %q", r.stdout)
	}
	// A timeout kills the running command; the session survives.
	if r := molt(t, "exec", sb, "--session", "a", "--timeout", "300ms", "--", "sleep 30"); r.code != 124 {
		t.Fatalf("session timeout: exit %d", r.code)
	}
	if r := run("a", "echo $X"); r.stdout != "42\n" {
		t.Fatalf("session lost state after timeout: %q", r.stdout)
	}
	// exit ends the session with its status; the next call starts afresh.
	if r := run("a", "exit 5"); r.code != 5 {
		t.Fatalf("exit 5: got %d", r.code)
	}
	if r := run("a", "echo \"[$X]\""); r.stdout != "[]\n" {
		t.Fatalf("new session kept old state: %q", r.stdout)
	}
	var res struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
	}
	mustJSON(t, &res, "exec", sb, "--session", "c", "--", "echo json")
	if res.Stdout != "json\n" || res.ExitCode != 0 {
		t.Fatalf("--json session: %+v", res)
	}
}

// TestExecClientGoneKillsCommand: when the client of an exec goes away,
// the command is killed; a command that ends as the client sends the end
// of its stdin still reports its exit status.
func TestExecClientGoneKillsCommand(t *testing.T) {
	sb := newSandbox(t)
	cmd := exec.Command(env.bin, "--socket", env.socket, "exec", sb, "--", "sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(sh(t, sb, "ps -eo comm"), "sleep") {
		if time.Now().After(deadline) {
			t.Fatal("sleep did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for strings.Contains(sh(t, sb, "ps -eo comm"), "sleep") {
		if time.Now().After(deadline) {
			t.Fatal("the command outlived its client")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 0; i < 20; i++ {
		if r := moltIn(t, "x", "exec", sb, "--", "true"); r.code != 0 {
			t.Fatalf("quick command with stdin, run %d: exit %d %q", i, r.code, r.stderr)
		}
	}
}
