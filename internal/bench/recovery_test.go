package bench

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

func sp(s string) *string { return &s }

func TestBuildScriptEffects(t *testing.T) {
	tr := Trajectory{Agent: AgentMini, Turns: []TrajectoryTurn{
		{Command: sp("ls")}, {Command: nil}, {Command: sp("cat a")}, {Command: sp("echo b")}, {Command: sp("pwd")},
	}}
	s := BuildScript(tr, "run1", 4, 2)
	var got []string
	for _, a := range s {
		switch {
		case a.Effect != "":
			got = append(got, "pay:"+a.Effect)
		case a.Command == "":
			got = append(got, "-")
		default:
			got = append(got, a.Command)
		}
	}
	want := []string{"ls", "-", "pay:e1", "cat a", "echo b", "pay:e2"}
	if !slices.Equal(got, want) {
		t.Fatalf("script %v, want %v", got, want)
	}
	if e := Effects(s); !slices.Equal(e, []string{"e1", "e2"}) {
		t.Errorf("Effects = %v", e)
	}
	// The effect command names the run and the effect, and makes a new
	// key on every execution (its text is the same each time).
	c := s[2].Command
	if !strings.Contains(c, `\x22run\x22: \x22run1\x22`) || !strings.Contains(c, `\x22effect\x22: \x22e1\x22`) || !strings.Contains(c, "uuid.uuid4()") || !strings.Contains(c, "Idempotency-Key") {
		t.Errorf("effect command %q", c)
	}
	if strings.Count(c, "'") != 2 {
		t.Errorf("effect command is not one single-quoted python program: %q", c)
	}
	if s2 := BuildScript(tr, "run1", 4, 2); s2[2].Command != c {
		t.Error("effect command is not deterministic")
	}
	if n := len(BuildScript(tr, "r", 0, 0)); n != 5 {
		t.Errorf("no cap, no effects: %d actions", n)
	}
}

func TestPickCrashes(t *testing.T) {
	a := PickCrashes(7, 3, 12, 3)
	b := PickCrashes(7, 3, 12, 3)
	if !slices.Equal(a, b) {
		t.Fatalf("not deterministic: %v %v", a, b)
	}
	if len(a) != 3 {
		t.Fatalf("%d crashes", len(a))
	}
	kinds := map[string]bool{}
	for i, c := range a {
		if c.Turn < 1 || c.Turn > 10 {
			t.Errorf("crash turn %d outside [1, 10]", c.Turn)
		}
		if i > 0 && c.Turn <= a[i-1].Turn {
			t.Errorf("crash turns not distinct and sorted: %v", a)
		}
		kinds[c.Kind] = true
	}
	if len(kinds) != 3 {
		t.Errorf("three crashes of a trajectory have kinds %v, want all three", kinds)
	}
	// Other seeds or trajectories draw other turns (somewhere).
	differ := false
	for s := uint64(0); s < 20 && !differ; s++ {
		differ = !slices.Equal(turnsOf(PickCrashes(s, 3, 40, 3)), turnsOf(a))
	}
	if !differ {
		t.Error("the seed does not change the crash turns")
	}
	if got := PickCrashes(1, 0, 4, 5); len(got) != 2 {
		t.Errorf("4 turns leave 2 crash points, got %v", got)
	}
	if got := PickCrashes(1, 0, 2, 3); got != nil {
		t.Errorf("2 turns: %v", got)
	}
}

func turnsOf(cs []CrashPoint) []int {
	var out []int
	for _, c := range cs {
		out = append(out, c.Turn)
	}
	return out
}

func TestFakeLLMTurnChoice(t *testing.T) {
	script := []Action{{Command: "ls -la"}, {}, {Command: "cat <<'EOF'\n```\nEOF"}}
	f := NewFakeLLM()
	f.Set("r1", script)
	srv := httptest.NewServer(f)
	defer srv.Close()
	ask := func(msgs []chatMessage) string {
		b, _ := json.Marshal(chatRequest{Model: "r1", Messages: msgs})
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Choices []struct{ Message chatMessage } `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("reply: %v %+v", err, out)
		}
		return out.Choices[0].Message.Content
	}
	msgs := []chatMessage{{"system", "s"}, {"user", "task"}}
	r0 := ask(msgs)
	if cmd, ok := CommandOf(r0); !ok || cmd != "ls -la" {
		t.Fatalf("turn 0: %q -> %q %v", r0, cmd, ok)
	}
	// The same request again (a restarted agent) gets the same reply.
	if again := ask(msgs); again != r0 {
		t.Errorf("repeated request: %q, then %q", r0, again)
	}
	msgs = append(msgs, chatMessage{"assistant", r0}, chatMessage{"user", "out"})
	if r1 := ask(msgs); strings.Contains(r1, "```") {
		t.Errorf("turn 1 has no command: %q", r1)
	}
	msgs = append(msgs, chatMessage{"assistant", "x"}, chatMessage{"user", "y"})
	if cmd, ok := CommandOf(ask(msgs)); !ok || cmd != script[2].Command {
		t.Errorf("turn 2: %q %v", cmd, ok)
	}
	msgs = append(msgs, chatMessage{"assistant", "x"}, chatMessage{"user", "y"})
	if r := ask(msgs); r != DoneReply {
		t.Errorf("past the end: %q", r)
	}
	if n := f.Calls("r1"); n != 5 {
		t.Errorf("calls %d", n)
	}
}

func TestDiffState(t *testing.T) {
	want := State{
		Files:     map[string]string{"/a": "f 644 1 x", "/b": "l /a", "/etc/hostname": "f 644 3 h1", "/v": "f 644 1 q"},
		Sessions:  map[string]string{"main": "d1"},
		Processes: []string{"bash x", "init"},
		Effects:   map[string]int{"e1": 1, "e2": 1},
	}
	same := State{
		Files:     map[string]string{"/a": "f 644 1 x", "/b": "l /a", "/etc/hostname": "f 644 3 h2", "/v": "f 644 1 other"},
		Sessions:  map[string]string{"main": "d1"},
		Processes: []string{"bash x", "init"},
		Effects:   map[string]int{"e1": 1, "e2": 1},
	}
	if d := Diff(want, same, []string{"/v"}); len(d) != 0 {
		t.Fatalf("equal states (volatile paths aside) differ: %v", d)
	}
	got := State{
		Files:     map[string]string{"/a": "f 755 1 x", "/c": "d 755", "/etc/hostname": "x", "/x/__pycache__/m.pyc": "f 1"},
		Sessions:  map[string]string{"main": "d2", "other": "d3"},
		Processes: []string{"init"},
		Effects:   map[string]int{"e1": 2},
	}
	d := Diff(want, got, nil)
	for _, w := range []string{"file /a: f 755 1 x, want f 644 1 x", "file /b: missing", "file /c: extra", "file /v: missing",
		"session main: shell state differs", "session other: extra", "effect e1: received 2 times", "effect e2: missing"} {
		if !slices.Contains(d, w) {
			t.Errorf("diff lacks %q: %v", w, d)
		}
	}
	if !slices.ContainsFunc(d, func(s string) bool { return strings.HasPrefix(s, "processes: ") }) {
		t.Errorf("diff lacks the processes: %v", d)
	}
	for _, s := range d {
		if strings.Contains(s, "hostname") || strings.Contains(s, "pycache") {
			t.Errorf("volatile path compared: %s", s)
		}
	}
}

func TestVolatileAndPatterns(t *testing.T) {
	for p, want := range map[string]bool{
		"/etc/hostname": true, "/testbed/__pycache__/a.pyc": true, "/a/b/__pycache__/c/d": true,
		"/root/.cache/pip/x": true, "/var/log/apt/h.log": true, "/x.pyc": true,
		"/testbed/a.py": false, "/etc/hostname2": false, "/root/.cachex": false, "/var/logs": false,
	} {
		if got := matchVolatile(p, VolatilePatterns); got != want {
			t.Errorf("matchVolatile(%s) = %v, want %v", p, got, want)
		}
	}
	a := State{Files: map[string]string{"/same": "1", "/changed": "1", "/only-a": "1", "/etc/hostname": "1"}}
	b := State{Files: map[string]string{"/same": "1", "/changed": "2", "/only-b": "1", "/etc/hostname": "2"}}
	if v := Volatile(a, b); !slices.Equal(v, []string{"/changed", "/only-a", "/only-b"}) {
		t.Errorf("Volatile = %v", v)
	}
}

func TestSessionDigestIgnoresVolatile(t *testing.T) {
	a := "declare -- A=\"1\"\ndeclare -i RANDOM=\"5\"\ndeclare -x HOSTNAME=\"h1\"\ndeclare -- __molt_n=\"x1\"\ndeclare -- _=\"ls\"\n/testbed"
	b := "declare -- A=\"1\"\ndeclare -i RANDOM=\"9\"\ndeclare -x HOSTNAME=\"h2\"\ndeclare -- __molt_n=\"x2\"\ndeclare -- _=\"cat\"\n/testbed"
	if SessionDigest(a) != SessionDigest(b) {
		t.Errorf("volatile variables change the digest: %v", SessionLinesDiff(a, b))
	}
	c := strings.Replace(a, `A="1"`, `A="2"`, 1)
	if SessionDigest(a) == SessionDigest(c) {
		t.Error("a changed variable leaves the digest")
	}
	if d := SessionDigest(strings.Replace(a, "/testbed", "/tmp", 1)); d == SessionDigest(a) {
		t.Error("a changed cwd leaves the digest")
	}
}

func TestDuplicatesAndTally(t *testing.T) {
	dups, missing := Duplicates(map[string]int{"e1": 3, "e2": 1, "e4": 2}, []string{"e1", "e2", "e3", "e4"})
	if dups != 3 || missing != 1 {
		t.Errorf("Duplicates = %d, %d; want 3, 1", dups, missing)
	}
	atts := []RecoveryAttempt{
		{Strategy: StrategyMolt, Agent: AgentMini, Correct: true, RecoverMS: 100, BytesReplayed: 10},
		{Strategy: StrategyMolt, Agent: AgentOpenHands, Correct: true, RecoverMS: 300, BytesReplayed: 30},
		{Strategy: StrategyChat, Agent: AgentMini, Dups: 2, RecoverMS: 50, BytesReplayed: 5},
		{Strategy: StrategyChat, Agent: AgentMini, Error: "boom", Missing: 1},
	}
	ts := TallyRecovery(atts, []string{StrategyChat, StrategyMolt})
	find := func(s, a string) RecoveryTally {
		for _, t := range ts {
			if t.Strategy == s && t.Agent == a {
				return t
			}
		}
		t.Fatalf("no tally %s %s in %+v", s, a, ts)
		return RecoveryTally{}
	}
	if m := find(StrategyMolt, "all"); m.Attempts != 2 || m.Correct != 2 || m.Recover.N != 2 || m.Recover.Max != 300 || m.Bytes != 40 {
		t.Errorf("molt all: %+v", m)
	}
	if c := find(StrategyChat, AgentMini); c.Attempts != 2 || c.Correct != 0 || c.Dups != 2 || c.Missing != 1 || c.Errors != 1 || c.Recover.N != 1 {
		t.Errorf("chat mini: %+v", c)
	}
	for _, x := range ts {
		if x.Agent == AgentSWE {
			t.Errorf("a tally for an agent without attempts: %+v", x)
		}
	}
}

func TestBackAtCrash(t *testing.T) {
	at := func(ms int) int64 { return time.Unix(100, 0).Add(time.Duration(ms) * time.Millisecond).UnixNano() }
	fresh := []AgentEvent{
		{Phase: EvLLM, Turn: 0, Bytes: 10, T: at(1)}, {Phase: EvExec, Turn: 0, Bytes: 100, Replayed: true, T: at(2)},
		{Phase: EvLLM, Turn: 1, Bytes: 10, T: at(3)}, {Phase: EvExec, Turn: 1, Bytes: 50, T: at(4)},
		{Phase: EvLLM, Turn: 2, Bytes: 10, T: at(5)}, {Phase: EvExec, Turn: 2, Bytes: 7, T: at(6)},
	}
	when, n, ok := BackAtCrash(fresh, 1, AgentFresh)
	if !ok || n != 170 || !when.Equal(time.Unix(0, at(4))) {
		t.Errorf("fresh: %v %d %v", when, n, ok)
	}
	// A crash turn without a command: back at the next reply.
	noCmd := []AgentEvent{{Phase: EvLLM, Turn: 0, Bytes: 10, T: at(1)}, {Phase: EvLLM, Turn: 1, Bytes: 20, T: at(2)}}
	if when, n, ok := BackAtCrash(noCmd, 0, AgentFresh); !ok || n != 10 || !when.Equal(time.Unix(0, at(2))) {
		t.Errorf("no command: %v %d %v", when, n, ok)
	}
	chat := []AgentEvent{{Phase: EvRerun, Turn: 0, Bytes: 5, T: at(1)}, {Phase: EvRerun, Turn: 1, Bytes: 6, T: at(2)},
		{Phase: EvResumed, Turn: 2, T: at(3)}, {Phase: EvLLM, Turn: 2, Bytes: 99, T: at(4)}}
	if when, n, ok := BackAtCrash(chat, 1, AgentChat); !ok || n != 11 || !when.Equal(time.Unix(0, at(3))) {
		t.Errorf("chat: %v %d %v", when, n, ok)
	}
	if _, _, ok := BackAtCrash(fresh[:3], 1, AgentFresh); ok {
		t.Error("back at the crash turn before its command ran")
	}
}
