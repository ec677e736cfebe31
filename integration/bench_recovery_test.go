package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/bench"
)

// TestBenchRecoverySmoke runs `molt bench recovery` end to end on one
// small trajectory of a session agent (a cd, an export, appends to a
// file) with a payment every two turns, crashed three times (agent,
// sandbox, daemon), each recovered by every strategy, and checks what
// each strategy must show: molt recovers exactly, with no payment twice;
// chat-only pays again every payment made before the crash; chat + files
// loses the session's state (cwd and variable) and so its appends land
// elsewhere.
func TestBenchRecoverySmoke(t *testing.T) {
	requireCRIU(t)
	dir := t.TempDir()
	cmds := []string{
		"mkdir -p /workspace/app && cd /workspace/app",
		"export APP_MODE=test && echo one >> log.txt",
		"echo two-$APP_MODE >> log.txt",
		"cat log.txt",
	}
	data := writeTrajectory(t, dir, "smoke__smoke-1", cmds)
	// Script: c0 c1 pay(e1) c2 c3 pay(e2): six turns, crash points in
	// [1, 4]. A seed whose three crashes include one after e1 was paid.
	seed := uint64(0)
	for ; ; seed++ {
		cs := bench.PickCrashes(seed, 0, 6, 3)
		if slices.ContainsFunc(cs, func(c bench.CrashPoint) bool { return c.Turn >= 2 }) {
			break
		}
	}
	start := time.Now()
	cmd := exec.Command(env.bin, "--json", "bench", "recovery", "--data", data, "--trajectories", "1", "--crashes", "3",
		"--max-turns", "4", "--effect-every", "2", "--seed", strconv.FormatUint(seed, 10), "--dir", dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("molt bench recovery: %v\n%s", err, stderr.String())
	}
	t.Logf("molt bench recovery took %v", time.Since(start).Round(time.Second))
	var res bench.RecoveryResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("decode: %v\n%s", err, out)
	}
	if len(res.Refs) != 1 || res.Refs[0].Error != "" || len(res.Refs[0].Effects) != 2 {
		t.Fatalf("reference: %+v\n%s", res.Refs, stderr.String())
	}
	if n := len(res.Attempts); n != 9 {
		t.Fatalf("%d attempts, want 9 (3 crashes x 3 strategies)\n%s", n, stderr.String())
	}
	kinds := map[string]bool{}
	for _, a := range res.Attempts {
		kinds[a.Crash.Kind] = true
		paidBefore := 0 // payments at turns 2 and 5 made before the crash
		for _, p := range []int{2, 5} {
			if p <= a.Crash.Turn {
				paidBefore++
			}
		}
		where := a.Strategy + " after a " + a.Crash.Kind + " crash at turn " + strconv.Itoa(a.Crash.Turn)
		if a.Error != "" {
			t.Errorf("%s: %s", where, a.Error)
			continue
		}
		if a.Missing != 0 {
			t.Errorf("%s: %d payments missing", where, a.Missing)
		}
		switch a.Strategy {
		case bench.StrategyMolt:
			if !a.Correct || a.Dups != 0 {
				t.Errorf("%s: correct %v, %d duplicated payments: %v", where, a.Correct, a.Dups, a.Diffs)
			}
			if a.Recovery == nil || a.Recovery.State != "done" {
				t.Errorf("%s: fast-forward %+v", where, a.Recovery)
			}
		case bench.StrategyChat:
			if a.Dups != paidBefore || a.Correct != (paidBefore == 0) {
				t.Errorf("%s: %d duplicated payments (want %d), correct %v: %v", where, a.Dups, paidBefore, a.Correct, a.Diffs)
			}
		case bench.StrategyChatFiles:
			// From the crash turn's checkpoint on, the first command (the
			// cd) is not re-run: the fresh session is elsewhere.
			if a.From < 1 {
				t.Errorf("%s: restarted from turn %d, want the latest turn checkpoint's", where, a.From)
			} else if a.Correct || !slices.ContainsFunc(a.Diffs, func(d string) bool { return strings.HasPrefix(d, "session main") }) {
				t.Errorf("%s: correct %v with diffs %v; want the session's state lost", where, a.Correct, a.Diffs)
			}
			if a.Dups != 0 {
				t.Errorf("%s: %d duplicated payments (the rollback's ledger answers re-sent ones)", where, a.Dups)
			}
		}
		if a.RecoverMS <= 0 {
			t.Errorf("%s: time to recover %v", where, a.RecoverMS)
		}
	}
	if len(kinds) != 3 {
		t.Errorf("crash kinds %v, want agent, sandbox and daemon", kinds)
	}
}

// writeTrajectory writes a trajectories file of one OpenHands
// trajectory (a session agent) whose turns run cmds, and returns its
// path.
func writeTrajectory(t *testing.T, dir, task string, cmds []string) string {
	t.Helper()
	var turns []map[string]any
	for i, c := range cmds {
		turns = append(turns, map[string]any{"i": i, "kind": "shell", "command": c})
	}
	line, err := json.Marshal(map[string]any{"agent": bench.AgentOpenHands, "task_id": task, "turns": turns})
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "traj.jsonl")
	if err := os.WriteFile(data, append(line, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return data
}
