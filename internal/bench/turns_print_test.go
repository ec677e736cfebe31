package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// fixedTurnsInput is a replay of two trajectories in the three modes
// with every kind of decision, effect and failure the summary counts.
func fixedTurnsInput() ([]TurnsRun, [][]time.Duration, TurnsConfig) {
	ts := []Trajectory{
		traj(AgentMini, "task-a",
			TrajectoryTurn{Kind: "shell", Command: strp("ls"), TS: f64p(1)},
			TrajectoryTurn{Kind: "shell", Command: strp("python3 x.py"), TS: f64p(4)},
			TrajectoryTurn{Kind: "shell", Command: strp("nohup server &")}),
		traj(AgentOpenHands, "task-b",
			TrajectoryTurn{Kind: "edit"},
			TrajectoryTurn{Kind: "shell", Command: strp("pip install x")}),
	}
	waits := [][]time.Duration{{0, 3 * time.Second, 2 * time.Second}, {time.Second, 1500 * time.Millisecond}}
	cfg := TurnsConfig{Trajectories: ts, Modes: []string{ModeNone, ModeAuto, ModeFull}}
	ck := strp("ck")
	auto := func(d string, stall float64, e v1.TurnEffects, reasons ...string) turnOutcome {
		o := turnOutcome{res: v1.TurnResult{Decision: d, StallMS: stall, Effects: e, Reasons: reasons}, d: time.Duration(stall*3) * time.Millisecond}
		if d != v1.DecisionNone {
			o.res.Checkpoint = ck
		}
		return o
	}
	files := v1.TurnEffects{Files: []v1.FileEffect{{Path: "a"}, {Path: "b"}}, IgnoredFiles: 1}
	server := v1.TurnEffects{LongLived: []v1.LongLivedChange{{Pid: 9, Comm: "server", Change: "started"}},
		Sockets:   []v1.SocketEffect{{Addr: "@molt-init"}, {Addr: "0.0.0.0:80"}},
		Processes: []v1.ProcessEffect{{Op: "exec", Pid: 9}}}
	session := v1.TurnEffects{Sessions: []v1.SessionChange{{Name: "main", Change: "changed"}}, Unknown: []string{"mount"}}
	withCmd := func(o turnOutcome, kind, program, cmd string) turnOutcome {
		o.kind, o.program, o.cmd = kind, program, cmd
		return o
	}
	failed := turnOutcome{kind: "shell", program: "git", err: os.ErrDeadlineExceeded}
	runs := []TurnsRun{
		{Mode: ModeNone, Agent: AgentMini, Task: "task-a", Turns: 3, Executed: 3, Nonzero: 1, TimedOut: 1,
			Seconds: 10, WaitSeconds: 5, ExecSeconds: 5},
		{Mode: ModeAuto, Agent: AgentMini, Task: "task-a", Turns: 3, Executed: 3, Nonzero: 1, Errors: 1,
			Seconds: 10.1, WaitSeconds: 5, ExecSeconds: 5, EndSeconds: 0.4, OverrunSeconds: 0.05,
			Checkpoints: 3, BytesWritten: 3 << 20, ImageBytes: 40 << 20, SetupBytes: 2 << 20, Lost: 1,
			turns: []turnOutcome{
				withCmd(auto(v1.DecisionNone, 0, v1.TurnEffects{}), "shell", "ls", "ls"),
				withCmd(auto(v1.DecisionFS, 2, files), "shell", "python3", "python3 x.py"),
				withCmd(auto(v1.DecisionFull, 30, server, "long-lived process started: server (pid 9)", "socket 0.0.0.0:80"), "shell", "nohup", "nohup server &"),
				failed,
			},
			stalls: []float64{2, 30}},
		{Mode: ModeFull, Agent: AgentMini, Task: "task-a", Turns: 3, Executed: 3,
			Seconds: 6, ExecSeconds: 5, EndSeconds: 1.2,
			Checkpoints: 4, BytesWritten: 60 << 20, ImageBytes: 160 << 20, SetupBytes: 20 << 20,
			turns: []turnOutcome{
				withCmd(auto(v1.DecisionFull, 40, v1.TurnEffects{}), "shell", "ls", "ls"),
				withCmd(auto(v1.DecisionFull, 42, v1.TurnEffects{}), "shell", "python3", "python3 x.py"),
			},
			stalls: []float64{40, 42}},
		{Mode: ModeNone, Agent: AgentOpenHands, Task: "task-b", Turns: 2, Executed: 1, NoCommand: 1,
			Seconds: 4, WaitSeconds: 2.5, ExecSeconds: 1.5},
		{Mode: ModeAuto, Agent: AgentOpenHands, Task: "task-b", Turns: 2, Executed: 1, NoCommand: 1, EndErrors: 1,
			Seconds: 4.2, WaitSeconds: 2.5, ExecSeconds: 1.5, EndSeconds: 0.3,
			Checkpoints: 2, BytesWritten: 1 << 20, ImageBytes: 30 << 20, SetupBytes: 512 << 10,
			turns: []turnOutcome{
				withCmd(auto(v1.DecisionFS, 3, files), "edit", "edit", ""),
				withCmd(auto(v1.DecisionFull, 25, session, "session main changed", "unknown effect: mount"), "shell", "pip", "pip install x"),
			},
			stalls: []float64{3, 25}},
		{Mode: ModeFull, Agent: AgentOpenHands, Task: "task-b", Turns: 2, Executed: 1, NoCommand: 1,
			Seconds: 2, ExecSeconds: 1.5, EndSeconds: 0.9,
			Checkpoints: 3, BytesWritten: 50 << 20, ImageBytes: 90 << 20, SetupBytes: 25 << 20,
			turns:  []turnOutcome{withCmd(auto(v1.DecisionFull, 33, v1.TurnEffects{}), "edit", "edit", "")},
			stalls: []float64{33}},
	}
	return runs, waits, cfg
}

// TestSummarizeAndPrintTurns checks the summary of a fixed replay and its
// printed tables against testdata/turns.golden (-update rewrites it).
func TestSummarizeAndPrintTurns(t *testing.T) {
	var out bytes.Buffer
	for _, fullWaits := range []bool{false, true} {
		runs, waits, cfg := fixedTurnsInput()
		cfg.FullWaits = fullWaits
		res := TurnsResult{Trajectories: 2, PerAgent: map[string]int{AgentMini: 1, AgentOpenHands: 1}, Modes: cfg.Modes,
			LLMScale: 0.05, LLMWaitMS: 2000, LLMMaxMS: 60000, CmdTimeoutMS: 10000, FullWaits: fullWaits, Runs: runs, Seconds: 42}
		summarize(&res, waits, cfg)
		if !fullWaits {
			res.Parallel = []TurnsParallel{
				{Mode: ModeAuto, Scheduler: true, Sandboxes: 8, Runs: 1, Turns: 80, Checkpoints: 20, Full: 5, Seconds: 30,
					Stall: msSample(1, 2, 3, 40).Stats(), FullStall: msSample(40).Stats(), TurnEnd: msSample(5, 6, 7).Stats(), Overrun: 0.5},
				{Mode: ModeAuto, Scheduler: false, Sandboxes: 8, Runs: 1, Turns: 80, Checkpoints: 20, Full: 5, Seconds: 31, Errors: 1,
					Stall: msSample(1, 2, 9, 90).Stats(), FullStall: msSample(90).Stats(), TurnEnd: msSample(5, 6, 20).Stats(), Overrun: 0.9},
			}
		}
		j, err := json.MarshalIndent(res, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		out.Write(j)
		out.WriteString("\n")
		PrintTurns(&out, res)
	}
	golden := filepath.Join("testdata", "turns.golden")
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("summary and tables differ from %s (go test -run TestSummarizeAndPrintTurns -update rewrites it):\n%s", golden, out.String())
	}
}
