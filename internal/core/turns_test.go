package core

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/testutil"
	"github.com/molt-sh/molt/internal/turn"
)

// execOnce runs argv as a one-shot command (not in a session) and
// returns its exit code.
func execOnce(t *testing.T, m *Manager, sb string, argv ...string) int {
	t.Helper()
	_, c, err := m.Exec(context.Background(), sb, v1.ExecRequest{Args: argv})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	defer c.Close()
	for {
		typ, payload, err := v1.ReadFrame(c)
		if err != nil {
			t.Fatalf("exec %q: %v", argv, err)
		}
		switch typ {
		case v1.FrameExit:
			var st v1.ExitStatus
			_ = json.Unmarshal(payload, &st)
			return st.ExitCode
		case v1.FrameError:
			t.Fatalf("exec %q: %s", argv, payload)
		}
	}
}

func endTurn(t *testing.T, m *Manager, sb string, ignore ...string) meta.TurnResult {
	t.Helper()
	res, err := m.EndTurn(context.Background(), sb, v1.TurnRequest{Ignore: ignore})
	if err != nil {
		t.Fatalf("end turn: %v", err)
	}
	return res
}

func hasFileOp(e meta.TurnEffects, path, op string) bool {
	for _, f := range e.Files {
		if f.Path == path && slices.Contains(f.Ops, op) {
			return true
		}
	}
	return false
}

// TestTurnDecisions is the labelled suite: turns that change files through
// every syscall path, change a session's or a long-lived process's state,
// or only read. The inspector must never say none when state changed, and
// must say none for turns that only read.
func TestTurnDecisions(t *testing.T) {
	m := openManager(t)
	m.cfg.StandbyBudget = 1 << 30
	requireCRIU(t, m)
	if ok, why := turn.InspectorStatus(); !ok {
		testutil.Unavailable(t, "eBPF inspector: "+why)
	}
	ctx := context.Background()
	sb := newSandbox(t, m)
	sess := func(cmd string) {
		t.Helper()
		r, err := m.SessionRun(ctx, sb.ID, "a", v1.SessionRunRequest{Command: cmd, TimeoutMS: 30000})
		if err != nil {
			t.Fatalf("%q: %v", cmd, err)
		}
		if r.ExitCode != 0 {
			t.Fatalf("%q: exit %d: %s%s", cmd, r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	// The session starts: a new long-lived process.
	sess("mkdir -p /root/t && echo seed > /root/t/f && mkfifo /root/t/fifo")
	if r := endTurn(t, m, sb.ID); r.Decision != v1.DecisionFull || len(r.Effects.Sessions) != 1 {
		t.Fatalf("session start: %s %v", r.Decision, r.Reasons)
	}
	if r := endTurn(t, m, sb.ID); r.Decision != v1.DecisionNone || r.Checkpoint != nil {
		t.Fatalf("empty turn: %s %v %+v", r.Decision, r.Reasons, r.Effects)
	}

	py := func(code string) string { return "python3 -B -c '" + code + "'" }
	cases := []struct {
		name, cmd, want string
		path, op        string // a file effect that must be reported
	}{
		// Read-only turns.
		{"cat", "cat /etc/os-release /root/t/f >/dev/null", v1.DecisionNone, "", ""},
		{"ls", "ls -la /usr/bin >/dev/null; ls -R /etc >/dev/null", v1.DecisionNone, "", ""},
		{"grep", "grep -r root /etc >/dev/null || true", v1.DecisionNone, "", ""},
		{"stat", "stat /root/t/f >/dev/null; test -e /nonexistent || true", v1.DecisionNone, "", ""},
		{"python reads", py(`open("/root/t/f").read(); import json, os; os.listdir("/")`), v1.DecisionNone, "", ""},
		{"pipeline", "ps aux | grep -c bash >/dev/null; head -c 100 /dev/urandom | wc -c >/dev/null", v1.DecisionNone, "", ""},
		{"failed write", "echo x > /nonexistent/dir/f 2>/dev/null || true", v1.DecisionNone, "", ""},
		// Files, through every syscall path.
		{"write", "echo x > /root/t/w", v1.DecisionFS, "/root/t/w", "write"},
		{"append", "echo y >> /root/t/w", v1.DecisionFS, "/root/t/w", "write"},
		{"pwrite", py(`import os; fd=os.open("/root/t/w", os.O_WRONLY); os.pwrite(fd, b"Z", 1)`), v1.DecisionFS, "/root/t/w", "write"},
		{"mmap write", py(`import mmap; f=open("/root/t/w","r+b"); mm=mmap.mmap(f.fileno(), 0); mm[0:1]=b"Q"; mm.flush()`), v1.DecisionFS, "/root/t/w", "mmap_write"},
		{"truncate", "truncate -s 1 /root/t/w", v1.DecisionFS, "/root/t/w", "truncate"},
		{"ftruncate", py(`import os; fd=os.open("/root/t/w", os.O_WRONLY); os.ftruncate(fd, 0)`), v1.DecisionFS, "/root/t/w", "truncate"},
		{"open O_TRUNC", ": > /root/t/f", v1.DecisionFS, "/root/t/f", "truncate"},
		{"copy_file_range", py(`import os; a=os.open("/etc/passwd", os.O_RDONLY); b=os.open("/root/t/c", os.O_WRONLY|os.O_CREAT); os.copy_file_range(a, b, 100)`), v1.DecisionFS, "/root/t/c", "write"},
		{"fallocate", "fallocate -l 8192 /root/t/fa", v1.DecisionFS, "/root/t/fa", "create"},
		{"rename", "mv /root/t/w /root/t/w2", v1.DecisionFS, "/root/t/w2", "rename_to"},
		{"link", "ln /root/t/w2 /root/t/w3", v1.DecisionFS, "/root/t/w3", "link"},
		{"symlink", "ln -s w2 /root/t/w4", v1.DecisionFS, "/root/t/w4", "symlink"},
		{"unlink", "rm /root/t/w3", v1.DecisionFS, "/root/t/w3", "delete"},
		{"mkdir", "mkdir /root/t/d", v1.DecisionFS, "/root/t/d", "mkdir"},
		{"rmdir", "rmdir /root/t/d", v1.DecisionFS, "/root/t/d", "rmdir"},
		{"chmod", "chmod 600 /root/t/w2", v1.DecisionFS, "/root/t/w2", "chmod"},
		{"chown", "chown 1:1 /root/t/w2", v1.DecisionFS, "/root/t/w2", "chown"},
		{"utimes", "touch -d 2020-01-01 /root/t/w2", v1.DecisionFS, "/root/t/w2", "utimes"},
		{"setxattr", py(`import os; os.setxattr("/root/t/w2", "user.k", b"v")`), v1.DecisionFS, "/root/t/w2", "xattr"},
		{"relative path", "(cd /root/t && touch rel)", v1.DecisionFS, "/root/t/rel", "create"},
		{"pip-like install", "mkdir -p /usr/local/lib/python3.11/dist-packages/fakepkg-1.0.dist-info /usr/local/lib/python3.11/dist-packages/fakepkg && " +
			"echo 'X = 1' > /usr/local/lib/python3.11/dist-packages/fakepkg/__init__.py && " +
			"printf 'Name: fakepkg\\nVersion: 1.0\\n' > /usr/local/lib/python3.11/dist-packages/fakepkg-1.0.dist-info/METADATA && " +
			py(`import fakepkg; assert fakepkg.X == 1`), v1.DecisionFS, "/usr/local/lib/python3.11/dist-packages/fakepkg/__init__.py", "write"},
		// Session state.
		{"export", "export MOLT_T=1", v1.DecisionFull, "", ""},
		{"cd", "cd /root/t", v1.DecisionFull, "", ""},
		{"alias", "alias ll='ls -l'", v1.DecisionFull, "", ""},
		{"function", "f() { echo f; }", v1.DecisionFull, "", ""},
		{"read-only in changed cwd", "ls >/dev/null; f >/dev/null", v1.DecisionNone, "", ""},
		// Long-lived processes.
		{"background start", "sleep 1000 >/dev/null 2>&1 & sleep 0.3", v1.DecisionFull, "", ""}, // idle by the end of the turn
		{"idle background", "cat /etc/hostname >/dev/null", v1.DecisionNone, "", ""},
		{"background kill", "kill %1; wait %1 2>/dev/null || true", v1.DecisionFull, "", ""},
		{"pipe reader start", "(" + py(`
d = []
while True:
    for line in open("/root/t/fifo"):
        d.append(line)
`) + " &) >/dev/null 2>&1; sleep 0.2", v1.DecisionFull, "", ""},
		{"pipe reader idle", "true", v1.DecisionNone, "", ""},
		{"pipe reader fed", "echo hello > /root/t/fifo; sleep 0.1", v1.DecisionFull, "", ""},
		{"pipe reader idle again", "true", v1.DecisionNone, "", ""},
		{"socket server start", "(" + py(`
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7070)); s.listen()
got = []
while True:
    c, _ = s.accept(); got.append(c.recv(100)); c.close()
`) + " &) >/dev/null 2>&1; sleep 0.3", v1.DecisionFull, "", ""},
		{"socket server idle", "ls / >/dev/null", v1.DecisionNone, "", ""},
		{"socket server fed", py(`import socket; c=socket.create_connection(("127.0.0.1", 7070)); c.sendall(b"hi"); c.close()`) + "; sleep 0.1", v1.DecisionFull, "", ""},
	}
	ckOf := map[string]string{}
	for _, c := range cases {
		sess(c.cmd)
		r := endTurn(t, m, sb.ID)
		if r.Checkpoint != nil {
			ckOf[c.name] = *r.Checkpoint
		}
		if r.Decision != c.want {
			t.Errorf("%s: decision %s, want %s; reasons %v; effects %+v", c.name, r.Decision, c.want, r.Reasons, r.Effects)
			continue
		}
		if c.path != "" && !hasFileOp(r.Effects, c.path, c.op) {
			t.Errorf("%s: effects lack %s %s: %+v", c.name, c.op, c.path, r.Effects.Files)
		}
		if (r.Checkpoint == nil) != (c.want == v1.DecisionNone) {
			t.Errorf("%s: decision %s with checkpoint %v", c.name, r.Decision, r.Checkpoint)
		}
	}

	// One-shot commands (a fresh shell per command).
	if code := execOnce(t, m, sb.ID, "bash", "-c", "cat /etc/passwd >/dev/null"); code != 0 {
		t.Fatalf("exec: %d", code)
	}
	if r := endTurn(t, m, sb.ID); r.Decision != v1.DecisionNone {
		t.Errorf("one-shot read: %s %v", r.Decision, r.Reasons)
	}
	execOnce(t, m, sb.ID, "bash", "-c", "echo z > /root/t/oneshot")
	if r := endTurn(t, m, sb.ID); r.Decision != v1.DecisionFS || !hasFileOp(r.Effects, "/root/t/oneshot", "write") {
		t.Errorf("one-shot write: %s %v %+v", r.Decision, r.Reasons, r.Effects.Files)
	}
	// Ignored paths.
	execOnce(t, m, sb.ID, "bash", "-c", "mkdir -p /tmp/cache && echo 1 > /tmp/cache/x")
	if r := endTurn(t, m, sb.ID, "/tmp/**"); r.Decision != v1.DecisionNone || r.Effects.IgnoredFiles == 0 {
		t.Errorf("ignored write: %s %v ignored %d", r.Decision, r.Reasons, r.Effects.IgnoredFiles)
	}

	// After a rollback the turn baseline is the checkpoint: a turn that
	// does nothing is none, one that writes is fs, whatever the tier.
	kept, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Keep: true, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	endTurn(t, m, sb.ID) // the checkpoint's freeze made the servers restart their calls
	for _, step := range []struct{ ck, tier string }{{ckOf["socket server start"], v1.TierWarm}, {kept.ID, ""}} {
		if err := m.awaitStandbyFor(t, sb.ID, step.ck, step.tier); err != nil {
			t.Fatal(err)
		}
		rb, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: step.ck, Tier: step.tier})
		if err != nil {
			t.Fatal(err)
		}
		if step.tier == "" && rb.Tier != v1.TierHot {
			t.Errorf("rollback to a kept checkpoint: tier %s", rb.Tier)
		}
		if r := endTurn(t, m, sb.ID); r.Decision != v1.DecisionNone {
			t.Errorf("idle turn after a %s rollback: %s %v %+v", rb.Tier, r.Decision, r.Reasons, r.Effects)
		}
		execOnce(t, m, sb.ID, "bash", "-c", "echo after > /root/t/after")
		if r := endTurn(t, m, sb.ID); r.Decision != v1.DecisionFS {
			t.Errorf("write after a %s rollback: %s %v", rb.Tier, r.Decision, r.Reasons)
		}
	}

	// The turn log holds every turn, with its commands.
	turns, err := m.Turns(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(cases) + 5 + 5; len(turns) != want {
		t.Fatalf("%d turns logged, want %d", len(turns), want)
	}
	if c := turns[2].Commands; len(c) != 1 || !strings.HasPrefix(c[0].Command, "cat ") {
		t.Errorf("turn 3 commands: %+v", c)
	}
	last := turns[len(turns)-7]
	if len(last.Commands) != 1 || last.Commands[0].ExitCode != 0 || len(last.Commands[0].Args) != 3 {
		t.Errorf("one-shot command not logged: %+v", last.Commands)
	}
}

// awaitStandbyFor waits until checkpoint ck of sandbox id has a standby
// when tier asks for the hot tier ("").
func (m *Manager) awaitStandbyFor(t *testing.T, id, ck, tier string) error {
	t.Helper()
	if tier != "" {
		return nil
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if s := m.sby.Get(id, ck); s != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("no standby of %s", ck)
}

// TestSetInspectorOff: a sandbox created while the inspector is off is
// not watched (its turns are full, for that reason), and one created
// after it is back on is watched again (a read-only turn needs nothing).
func TestSetInspectorOff(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	if ok, why := turn.InspectorStatus(); !ok {
		testutil.Unavailable(t, "eBPF inspector: "+why)
	}
	m.SetInspector(false)
	off := newSandbox(t, m)
	m.SetInspector(true)
	endTurn(t, m, off.ID)
	execOnce(t, m, off.ID, "cat", "/etc/hostname")
	res := endTurn(t, m, off.ID)
	if res.Decision != v1.DecisionFull || !slices.ContainsFunc(res.Reasons, func(r string) bool { return strings.Contains(r, "inspector unavailable") }) {
		t.Fatalf("unwatched sandbox's turn: %s %v, want full for lack of the inspector", res.Decision, res.Reasons)
	}
	on := newSandbox(t, m)
	endTurn(t, m, on.ID)
	execOnce(t, m, on.ID, "cat", "/etc/hostname")
	if res := endTurn(t, m, on.ID); res.Decision != v1.DecisionNone {
		t.Fatalf("watched sandbox's read-only turn: %s %v, want none", res.Decision, res.Reasons)
	}
}
