package sbinit

import (
	"os"
	"strings"
	"testing"
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

// TestSessionStateDigest runs a real bash session in this process and
// checks that the state digest moves exactly when the shell's state does.
func TestSessionStateDigest(t *testing.T) {
	if _, err := os.Stat("/bin/bash"); err != nil {
		t.Skip("no bash")
	}
	s := &server{reaper: newReaper(), sessions: map[string]*session{}}
	go s.reaper.loop()
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
