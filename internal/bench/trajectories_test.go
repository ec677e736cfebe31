package bench

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func strp(s string) *string   { return &s }
func f64p(f float64) *float64 { return &f }

func traj(agent, task string, turns ...TrajectoryTurn) Trajectory {
	return Trajectory{Agent: agent, TaskID: task, Turns: turns}
}

func TestSelectTrajectories(t *testing.T) {
	var ts []Trajectory
	add := func(agent string, n int) {
		for i := range n {
			ts = append(ts, traj(agent, agent[:1]+string(rune('a'+i))))
		}
	}
	// File order mixes the agents, as the data does.
	add(AgentOpenHands, 5)
	add(AgentMini, 5)
	add(AgentSWE, 2)
	tasks := func(sel []Trajectory) string {
		var s []string
		for _, t := range sel {
			s = append(s, t.TaskID)
		}
		return strings.Join(s, ",")
	}
	for _, c := range []struct {
		n    int
		all  bool
		want string
	}{
		{3, false, "oa,ma,sa"},
		{4, false, "oa,ma,sa,ob"},
		// swe-agent runs out: the rest goes to the others.
		{9, false, "oa,ma,sa,ob,mb,sb,oc,mc,od"},
		{0, false, ""},
		{0, true, "oa,ma,sa,ob,mb,sb,oc,mc,od,md,oe,me"},
		{100, false, "oa,ma,sa,ob,mb,sb,oc,mc,od,md,oe,me"},
	} {
		if got := tasks(SelectTrajectories(ts, c.n, c.all)); got != c.want {
			t.Errorf("SelectTrajectories(%d, %v) = %s, want %s", c.n, c.all, got, c.want)
		}
	}
	// Deterministic.
	if a, b := tasks(SelectTrajectories(ts, 7, false)), tasks(SelectTrajectories(ts, 7, false)); a != b {
		t.Errorf("not deterministic: %s vs %s", a, b)
	}
}

func TestWorkspaceDirs(t *testing.T) {
	tr := traj(AgentOpenHands, "x",
		TrajectoryTurn{Command: strp("ls -R /workspace/scikit-learn__scikit-learn__0.22")},
		TrajectoryTurn{Command: strp(`cd /workspace/django__django__3.0; python /workspace/reproduce.py "/workspace/django__django__3.0/x.py"`)},
		TrajectoryTurn{Command: strp("cat '/workspace/sympy__sympy__1.1/setup.py' && ls /workspace/reproduce_issue")},
		TrajectoryTurn{Command: nil},
		TrajectoryTurn{Command: strp("echo see /workspace/pydata__xarray__0.12.")},
	)
	want := []string{"/workspace/django__django__3.0", "/workspace/pydata__xarray__0.12", "/workspace/scikit-learn__scikit-learn__0.22", "/workspace/sympy__sympy__1.1"}
	if got := WorkspaceDirs(tr); !reflect.DeepEqual(got, want) {
		t.Errorf("WorkspaceDirs = %q, want %q", got, want)
	}
	if got := WorkspaceDirs(traj(AgentOpenHands, "y")); len(got) != 0 {
		t.Errorf("no commands: %q", got)
	}
}

func TestTurnCommand(t *testing.T) {
	for _, c := range []struct {
		agent string
		turn  TrajectoryTurn
		cmd   string
		run   bool
	}{
		{AgentMini, TrajectoryTurn{Command: strp("ls")}, "ls", true},
		{AgentMini, TrajectoryTurn{Kind: "other"}, "", false},
		{AgentOpenHands, TrajectoryTurn{Command: strp("C-c"), IsInput: true}, "", false},
		{AgentSWE, TrajectoryTurn{Command: strp("str_replace_editor view /testbed"), ShellEquivalent: strp("find /testbed")}, "find /testbed", true},
		{AgentSWE, TrajectoryTurn{Command: strp("ls -la")}, "ls -la", true},
		// Only SWE-agent's renderings replace the command.
		{AgentOpenHands, TrajectoryTurn{Command: strp("a"), ShellEquivalent: strp("b")}, "a", true},
	} {
		cmd, run := TurnCommand(c.agent, c.turn)
		if cmd != c.cmd || run != c.run {
			t.Errorf("TurnCommand(%s, %+v) = %q, %v; want %q, %v", c.agent, c.turn, cmd, run, c.cmd, c.run)
		}
	}
}

func TestLLMWait(t *testing.T) {
	tr := traj(AgentMini, "x",
		TrajectoryTurn{TS: f64p(100)},
		TrajectoryTurn{TS: f64p(110)},
		TrajectoryTurn{TS: f64p(111), TimedOut: true},
		TrajectoryTurn{TS: f64p(175)},
		TrajectoryTurn{TS: f64p(575)},
		TrajectoryTurn{TS: nil},
	)
	cfg := WaitConfig{Scale: 0.1, Default: 2 * time.Second, Max: 60 * time.Second}
	for _, c := range []struct {
		i        int
		prevExec time.Duration
		want     time.Duration
		recorded bool
	}{
		{0, 0, 200 * time.Millisecond, false}, // nothing before the first response
		{1, 0, time.Second, true},
		{1, 4 * time.Second, 600 * time.Millisecond, true},
		{1, 20 * time.Second, 0, true}, // clamped at 0
		{2, 0, 100 * time.Millisecond, true},
		{3, time.Second, 400 * time.Millisecond, true}, // the timed-out turn took the recorded 60 s
		{4, 0, 6 * time.Second, true},                  // capped at 60 s
		{5, 0, 200 * time.Millisecond, false},          // no timestamp
		{9, 0, 200 * time.Millisecond, false},
	} {
		got, rec := LLMWait(tr, c.i, c.prevExec, cfg)
		if got != c.want || rec != c.recorded {
			t.Errorf("LLMWait(%d, %v) = %v, %v; want %v, %v", c.i, c.prevExec, got, rec, c.want, c.recorded)
		}
	}
	// No cap.
	if got, _ := LLMWait(tr, 4, 0, WaitConfig{Scale: 1}); got != 400*time.Second {
		t.Errorf("uncapped: %v", got)
	}
	// Agents without timestamps get the default.
	sw := traj(AgentSWE, "y", TrajectoryTurn{}, TrajectoryTurn{})
	if got, rec := LLMWait(sw, 1, 0, cfg); got != 200*time.Millisecond || rec {
		t.Errorf("swe-agent: %v, %v", got, rec)
	}
}

func TestNormalizeReason(t *testing.T) {
	for in, want := range map[string]string{
		"long-lived process python3 (1234) started":              "long-lived process python3 started",
		"long-lived process gunicorn: worker (77) ran":           "long-lived process gunicorn: worker ran",
		"session main changed":                                   "session changed",
		"session probe-2 created":                                "session created",
		"write of /proc/123/oom_score_adj on proc":               "write of /proc/N/... on proc",
		"create,write of /dev/shm/x on tmpfs":                    "create,write of /dev/shm/... on tmpfs",
		"write of /x on tmpfs":                                   "write of /x on tmpfs",
		"unknown effect: 12 inspector events lost":               "unknown effect: N inspector events lost",
		"unknown effect: inspector: cut: deadline exceeded":      "unknown effect: inspector",
		"the full checkpoint of turn 12 failed: criu: boom":      "the full checkpoint of turn N failed: criu: boom",
		"inspector unavailable (no BTF): files may have changed": "inspector unavailable (no BTF): files may have changed",
	} {
		if got := NormalizeReason(in); got != want {
			t.Errorf("NormalizeReason(%q) = %q, want %q", in, got, want)
		}
	}
	if got := NormalizeReason(strings.Repeat("x", 200)); len(got) != 80 {
		t.Errorf("long reason not cut: %d", len(got))
	}
}

func TestCommandProgram(t *testing.T) {
	for in, want := range map[string]string{
		"python reproduce.py": "python",
		"cd /workspace/django__django__3.0 && python -m pytest": "python",
		"cd /testbed; ls":                   "ls",
		"cd /testbed":                       "cd",
		"export X=1":                        "export",
		"FOO=1 BAR=2 ./runtests.py x":       "runtests.py",
		"(cd /x && make)":                   "make",
		"/usr/bin/env python3 x.py":         "env",
		"grep -rn foo . | head -20":         "grep",
		"":                                  "(empty)",
		"cat <<'EOF' > a.py\nprint(1)\nEOF": "cat",
	} {
		if got := CommandProgram(in); got != want {
			t.Errorf("CommandProgram(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLoadTrajectories(t *testing.T) {
	p := filepath.Join(t.TempDir(), "t.jsonl")
	data := `{"agent":"mini-swe-agent","task_id":"a__b-1","turns":[{"i":0,"kind":"shell","command":"ls","ts":1.5},{"i":1,"kind":"other","command":null,"ts":2}]}

{"agent":"openhands-codeact","task_id":"c__d-2","turns":[{"i":0,"kind":"shell","command":"C-c","is_input":true}]}
`
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	ts, err := LoadTrajectories(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || len(ts[0].Turns) != 2 || *ts[0].Turns[0].TS != 1.5 || ts[0].Turns[1].Command != nil || !ts[1].Turns[0].IsInput {
		t.Errorf("loaded %+v", ts)
	}
	if err := os.WriteFile(p, []byte("{nope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTrajectories(p); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("bad line: %v", err)
	}
}
