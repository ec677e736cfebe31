package sbinit

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/pid1"
	"github.com/molt-sh/molt/internal/testutil"
)

func TestFindMarker(t *testing.T) {
	const n = "molt0011"
	cases := []struct {
		in         string
		start, end int
		rc         string
	}{
		{"out\n\x1emolt0011 0\x1e", 4, 16, "0"},
		{"no newline\x1emolt0011 127\x1etrailing", 10, 24, "127"},
		{"\x1emolt0011\x1e", 0, 10, ""},
		{"partial \x1emolt0011 1", -1, 0, ""},
		{"other \x1emolt9999 0\x1e", -1, 0, ""},
	}
	for _, c := range cases {
		s, e, rc := findMarker([]byte(c.in), n)
		if s != c.start || (s >= 0 && (e != c.end || rc != c.rc)) {
			t.Errorf("findMarker(%q) = %d, %d, %q; want %d, %d, %q", c.in, s, e, rc, c.start, c.end, c.rc)
		}
	}
}

// testAgent starts pid1 as the init of new PID and network namespaces
// (sharing this process's files) and returns its Agent.
func testAgent(t *testing.T) *Agent {
	t.Helper()
	testutil.RequireRoot(t)
	bin := filepath.Join(t.TempDir(), "pid1")
	if err := os.WriteFile(bin, pid1.Binary(), 0o755); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := exec.Command(bin, PID1Socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID | unix.CLONE_NEWNET, Setsid: true}
	cmd.ExtraFiles = []*os.File{w}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if line, err := bufio.NewReader(r).ReadString('\n'); line != "ok\n" {
		t.Fatalf("pid1: %q, %v", line, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := NewAgent(ctx, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// TestSessionStateDigest runs a real bash session in this process and
// checks that the state digest moves exactly when the shell's state does.
func TestSessionStateDigest(t *testing.T) {
	if _, err := os.Stat("/bin/bash"); err != nil {
		t.Skip("no bash")
	}
	s := testAgent(t)
	t.Cleanup(func() { s.sessionClose("t") })
	run := func(cmd string) string {
		t.Helper()
		r := s.sessionRun(Request{Session: "t", Command: cmd, TimeoutMS: 10000})
		l := s.sessionList()
		if r.Error != "" || len(l) != 1 || strings.HasPrefix(l[0].Digest, "unknown") {
			t.Fatalf("%q: error %q, sessions %+v", cmd, r.Error, l)
		}
		return l[0].Digest
	}
	d := run("true")
	cases := []struct {
		cmd     string
		changes bool
	}{
		{"echo hello; ls / >/dev/null; cat /etc/hostname >/dev/null", false},
		{"x=$RANDOM; unset x", false},
		{"for i in 1 2 3; do :; done; unset i", false},
		{"sleep 0.01", false},
		{"export MOLT_A=1", true},
		{"MOLT_A=1", false},
		{"MOLT_A=2", true},
		{"cd /tmp", true},
		{"cd /tmp", true}, // OLDPWD is now /tmp: `cd -` goes elsewhere
		{"cd /tmp", false},
		{"alias ll='ls -l'", true},
		{"f() { echo f; }", true},
		{"set -o noglob", true},
		{"shopt -s nullglob", true},
		{"umask 077", true},
		{"trap 'echo bye' EXIT", true},
		{"pushd / >/dev/null", true},
		{"v=$'two\nlines'", true},
		{"v=$'two\nlines'", false},
		{"declare -A m=([k]=v)", true},
		{"(export MOLT_SUB=1; cd /)", false},
	}
	for _, c := range cases {
		n := run(c.cmd)
		if got := n != d; got != c.changes {
			t.Errorf("%q: changed = %v, want %v", c.cmd, got, c.changes)
		}
		d = n
	}
	// Asking twice changes nothing; a busy session has no digest.
	if l := s.sessionList(); len(l) != 1 || l[0].Digest != d {
		t.Errorf("session list %+v, want digest %s", l, d)
	}
	s.sessions["t"].call.Lock()
	l := s.sessionList()
	s.sessions["t"].call.Unlock()
	if len(l) != 1 || !strings.HasPrefix(l[0].Digest, "unknown") {
		t.Errorf("busy session: %+v", l)
	}
}

// A new Agent takes over the sessions pid1 keeps (as after a daemon
// restart or a restore): same shell, same state, same pipes.
func TestAgentTakesOverSessions(t *testing.T) {
	a := testAgent(t)
	if r := a.sessionRun(Request{Session: "s", Command: "X=7; cd /tmp", TimeoutMS: 10000}); r.Error != "" || r.ExitCode != 0 {
		t.Fatalf("run: %+v", r)
	}
	pid := a.sessionList()[0].Pid
	// A call cut off mid-command (the daemon died): its output comes
	// after the take-over, and must not show up in the next call.
	a.sessions["s"].call.Lock()
	if _, err := a.sessions["s"].ctl.Write([]byte("moltcutoff sleep 0.3; echo stale\x00")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := NewAgent(ctx, a.hostPid)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	defer b.Close()
	r := b.sessionRun(Request{Session: "s", Command: "echo $X $(pwd); echo err >&2", TimeoutMS: 10000})
	if r.Error != "" || r.Stdout != "7 /tmp\n" || r.Stderr != "err\n" {
		t.Fatalf("after take-over: %+v", r)
	}
	if l := b.sessionList(); len(l) != 1 || l[0].Pid != pid || l[0].Name != "s" {
		t.Fatalf("sessions after take-over: %+v (pid before %d)", l, pid)
	}
	// Closing it ends the shell, and pid1 drops what it kept.
	if r := b.sessionClose("s"); r.Error != "" {
		t.Fatal(r.Error)
	}
	es, err := b.init.Table(ctx)
	if err != nil || len(es) != 0 {
		t.Fatalf("pid1's table after close: %+v, %v", es, err)
	}
}

// TestSessionListShellGone: a session whose shell is gone when the list
// asks for its digest is dropped from the list's agent, not waited on:
// the list must not hold the agent's lock while it runs a command in a
// session (the session's end takes that lock).
func TestSessionListShellGone(t *testing.T) {
	if _, err := os.Stat("/bin/bash"); err != nil {
		t.Skip("no bash")
	}
	s := testAgent(t)
	if r := s.sessionRun(Request{Session: "t", Command: "true", TimeoutMS: 10000}); r.Error != "" {
		t.Fatal(r.Error)
	}
	ss := s.sessions["t"]
	ss.p.signal(unix.SIGKILL, false)
	<-ss.exited
	done := make(chan []SessionInfo, 1)
	go func() { done <- s.sessionList() }()
	select {
	case l := <-done:
		if len(l) != 1 || !strings.HasPrefix(l[0].Digest, "unknown") {
			t.Errorf("a session whose shell is gone: %+v, want it listed with no digest", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the session list waits for good on a session whose shell is gone")
	}
	if l := s.sessionList(); len(l) != 0 {
		t.Errorf("after its end was seen: %+v, want no session", l)
	}
}

// A call under way, or a digest, when the agent closes (a hibernate, a
// stop) returns at once and leaves the shell running: it neither waits
// for a shell that runs on nor kills it at its timeout. The next agent
// takes the shell over with its state.
func TestSessionCallAgentClosed(t *testing.T) {
	if _, err := os.Stat("/bin/bash"); err != nil {
		t.Skip("no bash")
	}
	a := testAgent(t)
	if r := a.sessionRun(Request{Session: "t", Command: "X=7", TimeoutMS: 10000}); r.Error != "" {
		t.Fatal(r.Error)
	}
	ss := a.sessions["t"]
	call := make(chan Response, 1)
	go func() { call <- a.sessionRun(Request{Session: "t", Command: "sleep 3"}) }()
	// A digest taken from a list that was made before the close.
	digest := make(chan string, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		a.Close()
		digest <- a.sessionDigest(ss)
	}()
	select {
	case r := <-call:
		if r.ErrorKind != v1.ErrKindUnavailable {
			t.Errorf("a call under way when the agent closed: %+v, want it unavailable", r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a call under way waits for good once the agent closed")
	}
	select {
	case d := <-digest:
		if !strings.HasPrefix(d, "unknown") {
			t.Errorf("digest of a released session: %q", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a digest of a released session waits for good")
	}
	select {
	case <-ss.exited:
		t.Fatal("the shell ended when the agent closed")
	case <-time.After(100 * time.Millisecond):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := NewAgent(ctx, a.hostPid)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if r := b.sessionRun(Request{Session: "t", Command: "echo $X", TimeoutMS: 20000}); r.Stdout != "7\n" {
		t.Fatalf("after take-over: %+v", r)
	}
}
