package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/daemon"
)

// The turns benchmark replays recorded coding-agent trajectories (one
// command per turn) in sandboxes, turn by turn, and compares three ways
// of ending a turn on the same trajectories, each in fresh sandboxes:
//
//   - none: no checkpoint at all (the time baseline);
//   - auto: EndTurn, which checkpoints what the turn needs (none, fs or
//     full) as the eBPF inspector sees it;
//   - full: a full (process) checkpoint after every turn (the traffic
//     baseline).
//
// A turn is: the LLM call that produced it (a simulated wait, during
// which the previous turn's end runs, as molt's LLM proxy does), then
// its command. Agent-visible time per turn is max(wait, turn end) plus
// the command's time.

// Agents of the trajectory data.
const (
	AgentMini      = "mini-swe-agent"
	AgentOpenHands = "openhands-codeact"
	AgentSWE       = "swe-agent"
)

// Replay modes.
const (
	ModeNone = "none"
	ModeAuto = "auto"
	ModeFull = "full"
)

// Trajectory is one recorded agent run (see the data's README).
type Trajectory struct {
	Agent  string           `json:"agent"`
	TaskID string           `json:"task_id"`
	Turns  []TrajectoryTurn `json:"turns"`
}

// TrajectoryTurn is one recorded agent action.
type TrajectoryTurn struct {
	I               int      `json:"i"`
	Kind            string   `json:"kind"`
	Command         *string  `json:"command"`
	TS              *float64 `json:"ts"`
	TimedOut        bool     `json:"timed_out"`
	ExecTimeS       *float64 `json:"exec_time_s"`
	ShellEquivalent *string  `json:"shell_equivalent"`
	IsInput         bool     `json:"is_input"`
}

// LoadTrajectories reads a JSONL file of trajectories.
func LoadTrajectories(path string) ([]Trajectory, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Trajectory
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var t Trajectory
		if err := json.Unmarshal(sc.Bytes(), &t); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, t)
	}
	return out, sc.Err()
}

// SelectTrajectories returns a deterministic sample of n trajectories,
// stratified by agent: the first ones of each agent in file order, as
// evenly as the agents' counts allow (an agent with fewer trajectories
// than its share gives the rest to the others). The result is
// interleaved by agent. all (or n >= len(ts)) selects everything.
func SelectTrajectories(ts []Trajectory, n int, all bool) []Trajectory {
	var agents []string
	by := map[string][]Trajectory{}
	for _, t := range ts {
		if _, ok := by[t.Agent]; !ok {
			agents = append(agents, t.Agent)
		}
		by[t.Agent] = append(by[t.Agent], t)
	}
	take := map[string]int{}
	if all || n >= len(ts) {
		for _, a := range agents {
			take[a] = len(by[a])
		}
	} else {
		// Water-filling: one more for each agent that still has some,
		// round by round.
		for left := n; left > 0; {
			progress := false
			for _, a := range agents {
				if left > 0 && take[a] < len(by[a]) {
					take[a]++
					left--
					progress = true
				}
			}
			if !progress {
				break
			}
		}
	}
	var out []Trajectory
	for i := 0; ; i++ {
		more := false
		for _, a := range agents {
			if i < take[a] {
				out = append(out, by[a][i])
				more = true
			}
		}
		if !more {
			return out
		}
	}
}

var workspaceDirRE = regexp.MustCompile(`/workspace/([A-Za-z0-9_.-]+__[A-Za-z0-9_.-]+__[0-9][A-Za-z0-9_.-]*)`)

// WorkspaceDirs returns the repository directories
// (/workspace/<org>__<repo>__<version>) the trajectory's commands name,
// sorted.
func WorkspaceDirs(t Trajectory) []string {
	seen := map[string]bool{}
	for _, tu := range t.Turns {
		for _, cmd := range []*string{tu.Command, tu.ShellEquivalent} {
			if cmd == nil {
				continue
			}
			for _, m := range workspaceDirRE.FindAllStringSubmatch(*cmd, -1) {
				seen["/workspace/"+strings.TrimRight(m[1], ".")] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// TurnCommand returns the shell text to replay for a turn and whether
// anything runs: nothing for a turn without a command, and nothing for
// an OpenHands keystroke turn (is_input: input to a running process, not
// a new command). SWE-agent turns run their plain-shell rendering when
// they have one.
func TurnCommand(agent string, tu TrajectoryTurn) (string, bool) {
	if tu.IsInput {
		return "", false
	}
	if agent == AgentSWE && tu.ShellEquivalent != nil {
		return *tu.ShellEquivalent, true
	}
	if tu.Command == nil {
		return "", false
	}
	return *tu.Command, true
}

// WaitConfig says how LLM waits are simulated.
type WaitConfig struct {
	// Scale multiplies every wait (recorded or default).
	Scale float64
	// Default is the wait (before scaling) of turns without a recording.
	Default time.Duration
	// Max caps a recorded wait (before scaling); 0: no cap.
	Max time.Duration
}

// miniTimeout is mini-swe-agent's recorded command timeout: a turn
// recorded as timed out took this long.
const miniTimeout = 60 * time.Second

// RecordedGap returns the recorded time between the LLM responses that
// produced turns i-1 and i (mini-swe-agent's ts), and whether there is
// one.
func RecordedGap(t Trajectory, i int) (time.Duration, bool) {
	if i <= 0 || i >= len(t.Turns) || t.Turns[i].TS == nil || t.Turns[i-1].TS == nil {
		return 0, false
	}
	return time.Duration((*t.Turns[i].TS - *t.Turns[i-1].TS) * float64(time.Second)), true
}

// LLMWait returns the simulated LLM wait before turn i: the recorded gap
// less the previous command's execution time (the recorded timeout when
// it timed out, else prevExec as measured in the replay), at least 0, at
// most cfg.Max, scaled; or the scaled default when nothing is recorded.
// recorded reports which.
func LLMWait(t Trajectory, i int, prevExec time.Duration, cfg WaitConfig) (wait time.Duration, recorded bool) {
	gap, ok := RecordedGap(t, i)
	if !ok {
		return time.Duration(float64(cfg.Default) * cfg.Scale), false
	}
	if t.Turns[i-1].TimedOut {
		prevExec = miniTimeout
	}
	w := max(0, gap-prevExec)
	if cfg.Max > 0 {
		w = min(w, cfg.Max)
	}
	return time.Duration(float64(w) * cfg.Scale), true
}

var (
	digitsRE    = regexp.MustCompile(`[0-9]+`)
	longLivedRE = regexp.MustCompile(`^long-lived process (.*) \([0-9]+\) (\w+)$`)
	sessionRE   = regexp.MustCompile(`^session (\S+) (\w+)$`)
	fileRE      = regexp.MustCompile(`^(\S+) of (\S+) on (\S+)$`)
	stepRE      = regexp.MustCompile(`&&|\|\||;|\n|\|`)
	assignRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
)

// NormalizeReason maps a turn decision's reason to a class, so reasons
// can be counted: PIDs, numbers and deep path elements go.
func NormalizeReason(r string) string {
	if m := longLivedRE.FindStringSubmatch(r); m != nil {
		return "long-lived process " + m[1] + " " + m[2]
	}
	if m := sessionRE.FindStringSubmatch(r); m != nil {
		return "session " + m[2]
	}
	if m := fileRE.FindStringSubmatch(r); m != nil {
		p := strings.Split(strings.Trim(m[2], "/"), "/")
		short := "/" + strings.Join(p[:min(2, len(p))], "/")
		if len(p) > 2 {
			short += "/..."
		}
		return m[1] + " of " + digitsRE.ReplaceAllString(short, "N") + " on " + m[3]
	}
	r = digitsRE.ReplaceAllString(r, "N")
	if i := strings.Index(r, ": "); i >= 0 && strings.HasPrefix(r, "unknown effect: ") {
		// Keep the effect's kind, drop its details.
		if j := strings.Index(r[i+2:], ": "); j >= 0 {
			r = r[:i+2+j]
		}
	}
	if len(r) > 80 {
		r = r[:77] + "..."
	}
	return r
}

// CommandProgram names what a shell command runs, for counting: the
// first word of its first step that is not a cd, an export, a source or
// a variable assignment (or "cd" etc. when that is all there is).
func CommandProgram(cmd string) string {
	steps := stepRE.Split(cmd, -1)
	first := ""
	for _, s := range steps {
		f := strings.Fields(strings.TrimLeft(strings.TrimSpace(s), "({"))
		for len(f) > 0 && assignRE.MatchString(f[0]) {
			f = f[1:]
		}
		if len(f) == 0 {
			continue
		}
		w := strings.TrimRight(f[0], ")}")
		if i := strings.LastIndex(w, "/"); i >= 0 && i < len(w)-1 {
			w = w[i+1:]
		}
		if first == "" {
			first = w
		}
		switch w {
		case "cd", "export", "source", ".", "set", "pushd", "popd", "true":
			continue
		}
		return w
	}
	if first == "" {
		return "(empty)"
	}
	return first
}

// TurnsConfig configures the turns benchmark.
type TurnsConfig struct {
	Image        string
	Trajectories []Trajectory // the selection, in replay order
	Modes        []string     // of none, auto, full
	CriuPath     string       // for the host facts
	MaxTurns     int          // per trajectory; 0: all
	Waits        WaitConfig
	CmdTimeout   time.Duration
	Ignore       []string // for EndTurn
	// FullWaits simulates the LLM waits in mode full too; without, full
	// replays back to back (only its bytes count), which saves time.
	FullWaits bool
	// Parallel sandboxes replaying at once in auto mode, with and without
	// the host scheduler (0: skip that part); ParallelMaxTurns bounds the
	// turns of each.
	Parallel         int
	ParallelMaxTurns int
	// ParallelRuns is how many trajectories each of them replays in turn.
	ParallelRuns int
	// StartDaemon starts a daemon with the image built, with or without
	// the scheduler, for the parallel part.
	StartDaemon func(ctx context.Context, noScheduler bool) (*daemon.Ephemeral, error)
	Progress    io.Writer
}

// TurnsRun is one trajectory replayed in one mode.
type TurnsRun struct {
	Mode        string `json:"mode"`
	Agent       string `json:"agent"`
	Task        string `json:"task"`
	Sandbox     string `json:"sandbox"`
	Turns       int    `json:"turns"`
	Executed    int    `json:"executed"`
	Inputs      int    `json:"skipped_inputs"`
	NoCommand   int    `json:"no_command"`
	TimedOut    int    `json:"timed_out"`
	Nonzero     int    `json:"nonzero_exit"`
	Errors      int    `json:"errors"`
	FirstError  string `json:"first_error,omitempty"`
	EndErrors   int    `json:"end_errors"`
	FirstEndErr string `json:"first_end_error,omitempty"`
	// Seconds is the agent-visible time of the turns: waits (overlapped
	// with turn ends) and commands. WaitSeconds is the simulated LLM
	// wait in it, ExecSeconds the commands' time, EndSeconds the turn
	// ends' (hidden behind the waits where they fit), OverrunSeconds what
	// turn ends took beyond their waits.
	Seconds        float64 `json:"seconds"`
	WaitSeconds    float64 `json:"wait_seconds"`
	ExecSeconds    float64 `json:"exec_seconds"`
	EndSeconds     float64 `json:"end_seconds"`
	OverrunSeconds float64 `json:"overrun_seconds"`
	RecordedWaits  int     `json:"recorded_waits"`
	// Decisions of the trajectory's turns (auto; full: all "full").
	Decisions map[string]int `json:"decisions,omitempty"`
	// Checkpoints of the sandbox (setup's included), all committed.
	Checkpoints  int   `json:"checkpoints"`
	BytesWritten int64 `json:"bytes_written"`
	ImageBytes   int64 `json:"image_bytes"`
	// Turns whose checkpoint never committed.
	Lost int `json:"lost_checkpoints,omitempty"`

	// SetupBytes is what the setup turn's checkpoint wrote (in
	// BytesWritten).
	SetupBytes int64 `json:"setup_bytes"`

	setup  string // the setup turn's checkpoint
	waits  []time.Duration
	turns  []turnOutcome
	stalls []float64 // of turns that checkpointed
}

// turnOutcome is how a turn ended (auto and full modes).
type turnOutcome struct {
	kind, program string
	cmd           string // the command, shortened
	res           v1.TurnResult
	err           error
	d             time.Duration // the call, as the client saw it
}

// TurnsModeTotals sums one mode's runs.
type TurnsModeTotals struct {
	Mode         string             `json:"mode"`
	Trajectories int                `json:"trajectories"`
	Turns        int                `json:"turns"`
	Executed     int                `json:"executed"`
	Inputs       int                `json:"skipped_inputs"`
	NoCommand    int                `json:"no_command"`
	TimedOut     int                `json:"timed_out"`
	Nonzero      int                `json:"nonzero_exit"`
	Errors       int                `json:"errors"`
	EndErrors    int                `json:"end_errors"`
	Seconds      float64            `json:"seconds"`
	WaitSeconds  float64            `json:"wait_seconds"`
	ExecSeconds  float64            `json:"exec_seconds"`
	EndSeconds   float64            `json:"end_seconds"`
	Overrun      float64            `json:"overrun_seconds"`
	AgentSeconds map[string]float64 `json:"agent_seconds"`
	Checkpoints  int                `json:"checkpoints"`
	BytesWritten int64              `json:"bytes_written"`
	SetupBytes   int64              `json:"setup_bytes"`
	ImageBytes   int64              `json:"image_bytes"`
	Lost         int                `json:"lost_checkpoints"`
	Stall        Stats              `json:"stall"`
	TurnEnd      Stats              `json:"turn_end"`
}

// TurnsWaits describes the simulated LLM waits of one agent's turns.
type TurnsWaits struct {
	Agent    string  `json:"agent"`
	Turns    int     `json:"turns"`
	Recorded int     `json:"recorded"`
	MeanMS   float64 `json:"mean_ms"`
	P50MS    float64 `json:"p50_ms"`
	P90MS    float64 `json:"p90_ms"`
	MaxMS    float64 `json:"max_ms"`
	TotalS   float64 `json:"total_s"`
}

// TurnsCount is a counted class.
type TurnsCount struct {
	What  string `json:"what"`
	Turns int    `json:"turns"`
	// Example is a command of such a turn.
	Example string `json:"example,omitempty"`
}

// shorten puts a command on one line of at most n runes.
func shorten(cmd string, n int) string {
	cmd = strings.Join(strings.Fields(cmd), " ")
	if r := []rune(cmd); len(r) > n {
		cmd = string(r[:n-3]) + "..."
	}
	return cmd
}

// TurnsEffects counts what the inspector saw in auto mode.
type TurnsEffects struct {
	Turns          int `json:"turns"`
	WithFiles      int `json:"turns_with_files"`
	FileEffects    int `json:"file_effects"`
	IgnoredFiles   int `json:"ignored_file_effects"`
	WithLongLived  int `json:"turns_with_long_lived"`
	WithSessions   int `json:"turns_with_session_changes"`
	WithUnknown    int `json:"turns_with_unknown"`
	WithSockets    int `json:"turns_with_sockets"`
	WithProcesses  int `json:"turns_with_processes"`
	FullNoCommand  int `json:"full_without_command"`
	FullNoExecuted int `json:"full_turns_no_command_ran"`
}

// TurnsParallel is the parallel part for one scheduler setting.
type TurnsParallel struct {
	Mode        string  `json:"mode"`
	Scheduler   bool    `json:"scheduler"`
	Sandboxes   int     `json:"sandboxes"`
	Runs        int     `json:"trajectories_each"`
	Turns       int     `json:"turns"`
	Checkpoints int     `json:"checkpoints"`
	Full        int     `json:"full"`
	Seconds     float64 `json:"seconds"`
	// Stall of turns that checkpointed; FullStall of the full ones.
	Stall     Stats   `json:"stall"`
	FullStall Stats   `json:"full_stall"`
	TurnEnd   Stats   `json:"turn_end"`
	Overrun   float64 `json:"overrun_seconds"`
	Errors    int     `json:"errors"`
	EndErrors int     `json:"end_errors"`
}

// TurnsResult is the outcome of RunTurns.
type TurnsResult struct {
	Trajectories int               `json:"trajectories"`
	PerAgent     map[string]int    `json:"per_agent"`
	Host         HostFacts         `json:"host"`
	Modes        []string          `json:"modes"`
	Waits        []TurnsWaits      `json:"waits"`
	LLMScale     float64           `json:"llm_scale"`
	LLMWaitMS    float64           `json:"llm_wait_ms"`
	LLMMaxMS     float64           `json:"llm_max_ms"`
	CmdTimeoutMS float64           `json:"cmd_timeout_ms"`
	MaxTurns     int               `json:"max_turns"`
	Totals       []TurnsModeTotals `json:"totals"`
	// Decisions per agent ("all": overall) under auto.
	Decisions map[string]map[string]int `json:"decisions"`
	Effects   TurnsEffects              `json:"effects"`
	// FullReasons: normalized reasons of full turns; FullCommands: what
	// the full turns ran.
	FullReasons  []TurnsCount `json:"full_reasons"`
	FullCommands []TurnsCount `json:"full_commands"`
	FSCommands   []TurnsCount `json:"fs_commands"`
	// TrafficReduction = 1 - auto/full bytes written; PlainReduction =
	// 1 - auto bytes / full's image bytes (plain CRIU dumps).
	TrafficReduction float64 `json:"traffic_reduction"`
	PlainReduction   float64 `json:"plain_dump_reduction"`
	// TurnsReduction leaves out the setup turns' checkpoints (the first
	// full one of a session agent's sandbox writes all its memory).
	TurnsReduction float64 `json:"turns_traffic_reduction"`
	// Overhead = (T_auto - T_none) / T_none; FullOverhead likewise.
	Overhead      float64            `json:"overhead"`
	FullOverhead  float64            `json:"full_overhead"`
	FullWaits     bool               `json:"full_waits"`
	AgentOverhead map[string]float64 `json:"agent_overhead"`
	Parallel      []TurnsParallel    `json:"parallel,omitempty"`
	Runs          []TurnsRun         `json:"runs"`
	Seconds       float64            `json:"seconds"`
}

// miniEnv is mini-swe-agent's recorded command environment.
var miniEnv = map[string]string{"PAGER": "cat", "MANPAGER": "cat", "LESS": "-R", "PIP_PROGRESS_BAR": "off", "TQDM_DISABLE": "1"}

// replayer replays trajectories against one daemon.
type replayer struct {
	c   *client.Client
	cfg TurnsConfig
}

// setup creates the sandbox of a trajectory with the layout its commands
// expect (empty directories: no repository), and for the session agents
// a session in the start directory.
func (r *replayer) setup(ctx context.Context, t Trajectory) (string, error) {
	sb, err := r.c.Create(ctx, v1.SandboxCreateRequest{Image: r.cfg.Image})
	if err != nil {
		return "", err
	}
	dirs := []string{"/testbed"}
	start := "/testbed"
	if t.Agent == AgentOpenHands {
		dirs = append([]string{"/workspace"}, WorkspaceDirs(t)...)
		start = "/workspace"
	}
	// The SWE-bench images have a python on PATH; the default image has
	// python3 only.
	script := "mkdir -p " + strings.Join(dirs, " ") +
		" && { command -v python >/dev/null || ln -s \"$(command -v python3)\" /usr/local/bin/python; }"
	if err := run(ctx, r.c, sb.ID, "bash", "-c", script); err != nil {
		_ = r.c.Remove(context.Background(), sb.ID)
		return "", fmt.Errorf("setup: %w", err)
	}
	if t.Agent != AgentMini {
		res, err := r.c.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: "cd " + start})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("cd %s: exit %d: %s", start, res.ExitCode, res.Stderr)
		}
		if err != nil {
			_ = r.c.Remove(context.Background(), sb.ID)
			return "", fmt.Errorf("setup: %w", err)
		}
	}
	return sb.ID, nil
}

// exec runs one turn's command: a one-shot bash for mini-swe-agent, the
// trajectory's session otherwise.
func (r *replayer) exec(ctx context.Context, sb, agent, cmd string) (exit int, timedOut bool, err error) {
	tmo := r.cfg.CmdTimeout.Milliseconds()
	if agent == AgentMini {
		st, err := r.c.Exec(ctx, sb, v1.ExecRequest{Args: []string{"bash", "-c", cmd}, Env: miniEnv, Cwd: "/testbed", TimeoutMS: tmo}, client.ExecIO{})
		return st.ExitCode, st.TimedOut, err
	}
	res, err := r.c.SessionRun(ctx, sb, "main", v1.SessionRunRequest{Command: cmd, TimeoutMS: tmo})
	return res.ExitCode, res.TimedOut, err
}

// endTurn ends a turn the mode's way.
func (r *replayer) endTurn(ctx context.Context, sb, mode string) (v1.TurnResult, error) {
	if mode == ModeFull {
		ck, err := r.c.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull})
		id := ck.ID
		return v1.TurnResult{Decision: v1.DecisionFull, Checkpoint: &id, StallMS: ck.StallMS, Pending: ck.Pending}, err
	}
	return r.c.EndTurn(ctx, sb, v1.TurnRequest{Ignore: r.cfg.Ignore})
}

// replay replays a trajectory in a fresh sandbox in one mode. waits are
// the LLM waits of the first turns (reused from an earlier replay, so
// every mode waits alike); the others' are computed from the recording
// and this replay's command times. The run keeps the waits it used.
func (r *replayer) replay(ctx context.Context, t Trajectory, mode string, maxTurns int, waits []time.Duration) (TurnsRun, error) {
	turns := t.Turns
	if maxTurns > 0 && len(turns) > maxTurns {
		turns = turns[:maxTurns]
	}
	run := TurnsRun{Mode: mode, Agent: t.Agent, Task: t.TaskID, Turns: len(turns)}
	sb, err := r.setup(ctx, t)
	if err != nil {
		return run, err
	}
	run.Sandbox = sb
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_ = r.c.Remove(rctx, sb)
	}()
	if mode != ModeNone {
		// Setup is a turn of its own: its effects are not the
		// trajectory's.
		res, err := r.endTurn(ctx, sb, mode)
		if err != nil {
			return run, fmt.Errorf("setup turn end: %w", err)
		}
		if res.Checkpoint != nil {
			run.setup = *res.Checkpoint
		}
	}
	type ended struct {
		res v1.TurnResult
		err error
		d   time.Duration
	}
	var pending chan ended
	var pendingTurn turnOutcome
	// collect records a turn's end; visible: the agent waited for it
	// (behind the next LLM wait).
	collect := func(e ended, wait time.Duration, visible bool) {
		o := pendingTurn
		o.res, o.err, o.d = e.res, e.err, e.d
		run.turns = append(run.turns, o)
		run.EndSeconds += e.d.Seconds()
		if visible {
			run.OverrunSeconds += max(0, e.d-wait).Seconds()
		}
		if e.err != nil {
			run.EndErrors++
			if run.FirstEndErr == "" {
				run.FirstEndErr = e.err.Error()
			}
		}
	}
	var prevExec time.Duration
	for i, tu := range turns {
		w, rec := LLMWait(t, i, prevExec, r.cfg.Waits)
		if i < len(waits) {
			w = waits[i]
		}
		if rec {
			run.RecordedWaits++
		}
		run.waits = append(run.waits, w)
		if mode == ModeFull && !r.cfg.FullWaits {
			w = 0
		}
		t0 := time.Now()
		// The LLM call that produced this turn; the previous turn ends
		// meanwhile.
		if err := sleepCtx(ctx, w); err != nil {
			return run, err
		}
		if pending != nil {
			collect(<-pending, w, true)
			pending = nil
		}
		run.WaitSeconds += w.Seconds()
		cmd, ok := TurnCommand(t.Agent, tu)
		prog := tu.Kind
		switch {
		case tu.IsInput:
			run.Inputs++
			prog = "(keystrokes, not run)"
		case !ok:
			run.NoCommand++
			prog = "(no command)"
		case tu.Kind == "shell":
			prog = CommandProgram(cmd)
		}
		te := time.Now()
		if ok {
			run.Executed++
			exit, timedOut, err := r.exec(ctx, sb, t.Agent, cmd)
			switch {
			case ctx.Err() != nil:
				return run, ctx.Err()
			case err != nil:
				run.Errors++
				if run.FirstError == "" {
					run.FirstError = err.Error()
				}
			case timedOut:
				run.TimedOut++
			case exit != 0:
				run.Nonzero++
			}
		}
		prevExec = time.Since(te)
		run.ExecSeconds += prevExec.Seconds()
		run.Seconds += time.Since(t0).Seconds()
		if mode != ModeNone {
			pending = make(chan ended, 1)
			pendingTurn = turnOutcome{kind: tu.Kind, program: prog, cmd: shorten(cmd, 70)}
			go func(ch chan ended) {
				t0 := time.Now()
				res, err := r.endTurn(ctx, sb, mode)
				ch <- ended{res, err, time.Since(t0)}
			}(pending)
		}
	}
	if pending != nil {
		// The last turn ends after the agent is done: not agent-visible.
		collect(<-pending, 0, false)
	}
	run.Decisions = map[string]int{}
	for _, o := range run.turns {
		if o.err != nil {
			continue
		}
		run.Decisions[o.res.Decision]++
		if o.res.Checkpoint != nil {
			run.stalls = append(run.stalls, o.res.StallMS)
		}
	}
	if mode != ModeNone {
		if err := r.sumCheckpoints(ctx, sb, &run); err != nil {
			return run, err
		}
	}
	return run, nil
}

// sumCheckpoints waits until the sandbox's checkpoints are committed and
// sums what they wrote.
func (r *replayer) sumCheckpoints(ctx context.Context, sb string, run *TurnsRun) error {
	taken := 1 // setup's
	for _, o := range run.turns {
		if o.err == nil && o.res.Checkpoint != nil {
			taken++
		}
	}
	deadline := time.Now().Add(10 * time.Minute)
	for {
		cks, err := r.c.Checkpoints(ctx, sb)
		if err != nil {
			return err
		}
		pending := 0
		run.Checkpoints, run.BytesWritten, run.ImageBytes, run.SetupBytes = 0, 0, 0, 0
		for _, ck := range cks {
			if ck.Pending {
				pending++
				continue
			}
			run.Checkpoints++
			run.BytesWritten += ck.BytesWritten
			if ck.ID == run.setup {
				run.SetupBytes += ck.BytesWritten
			}
			run.ImageBytes += ck.ImageBytes
		}
		if pending == 0 {
			run.Lost = max(0, taken-run.Checkpoints)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d checkpoints still pending after 10 minutes", sb, pending)
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fullWorkers replay trajectories at once in mode full without waits.
const fullWorkers = 4

// RunTurns replays the selected trajectories in each mode (per
// trajectory one mode after the other, each in a fresh sandbox), then
// the parallel part, and sums up.
func RunTurns(ctx context.Context, e *daemon.Ephemeral, cfg TurnsConfig) (TurnsResult, error) {
	began := time.Now()
	progress := progressf(cfg.Progress)
	res := TurnsResult{Trajectories: len(cfg.Trajectories), PerAgent: map[string]int{}, Modes: cfg.Modes,
		LLMScale: cfg.Waits.Scale, LLMWaitMS: ms(cfg.Waits.Default), LLMMaxMS: ms(cfg.Waits.Max),
		CmdTimeoutMS: ms(cfg.CmdTimeout), MaxTurns: cfg.MaxTurns, FullWaits: cfg.FullWaits,
		Host: GatherHost(ctx, e.Client, cfg.CriuPath)}
	for _, t := range cfg.Trajectories {
		res.PerAgent[t.Agent]++
	}
	r := &replayer{c: e.Client, cfg: cfg}
	waits := make([][]time.Duration, len(cfg.Trajectories))
	report := func(i int, run TurnsRun) {
		t := cfg.Trajectories[i]
		progress("turns: [%d/%d] %-17s %-40s %-4s %3d turns (%d run, %d timed out, %d errors) %6.1f s (exec %.1f s, wait %.1f s, over %.2f s)%s",
			i+1, len(cfg.Trajectories), t.Agent, t.TaskID, run.Mode, run.Turns, run.Executed, run.TimedOut, run.Errors+run.EndErrors,
			run.Seconds, run.ExecSeconds, run.WaitSeconds, run.OverrunSeconds, runSummary(run))
	}
	fail := func(i int, mode string, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		t := cfg.Trajectories[i]
		return fmt.Errorf("%s %s (%s): %w", t.Agent, t.TaskID, mode, err)
	}
	// The timed modes, one trajectory after the other, its modes in turn
	// (so drift in the host's speed hits every mode alike).
	// Each trajectory starts with another mode (the order rotates), so a
	// mode is not always the one that runs first, on a cold cache.
	// Mode none runs without the inspector: its sandbox is not watched,
	// and with nothing else watched the inspector's programs are
	// detached from the host's system calls, so none is a sandbox
	// without any of molt's cost.
	backToBack := false
	var timed []string
	for _, mode := range cfg.Modes {
		if mode == ModeFull && !cfg.FullWaits {
			backToBack = true
			continue
		}
		timed = append(timed, mode)
	}
	for i, t := range cfg.Trajectories {
		for _, mode := range RotateModes(timed, i) {
			e.Manager.SetInspector(mode != ModeNone)
			run, err := r.replay(ctx, t, mode, cfg.MaxTurns, waits[i])
			e.Manager.SetInspector(true)
			if err != nil {
				return res, fail(i, mode, err)
			}
			if waits[i] == nil {
				waits[i] = run.waits
			}
			res.Runs = append(res.Runs, run)
			report(i, run)
		}
	}
	// Full every turn without LLM waits: only its bytes count, so
	// several replay at once.
	if backToBack {
		runs := make([]TurnsRun, len(cfg.Trajectories))
		errs := make([]error, len(cfg.Trajectories))
		next := make(chan int)
		var wg sync.WaitGroup
		for range fullWorkers {
			wg.Go(func() {
				for i := range next {
					runs[i], errs[i] = r.replay(ctx, cfg.Trajectories[i], ModeFull, cfg.MaxTurns, waits[i])
					if errs[i] == nil {
						report(i, runs[i])
					}
				}
			})
		}
		for i := range cfg.Trajectories {
			next <- i
		}
		close(next)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				return res, fail(i, ModeFull, err)
			}
			if waits[i] == nil {
				waits[i] = runs[i].waits
			}
		}
		res.Runs = append(res.Runs, runs...)
	}
	summarize(&res, waits, cfg)
	if cfg.Parallel > 0 && cfg.StartDaemon != nil {
		// auto: the trajectories as they are; full: a full checkpoint
		// after every turn, back to back, which keeps the background
		// (storing, standbys) busy: what the scheduler is for.
		for _, mode := range []string{ModeAuto, ModeFull} {
			for _, noSched := range []bool{false, true} {
				p, err := runParallel(ctx, cfg, waits, mode, noSched, progress)
				if err != nil {
					return res, fmt.Errorf("parallel %s (scheduler %v): %w", mode, !noSched, err)
				}
				res.Parallel = append(res.Parallel, p)
			}
		}
	}
	res.Seconds = time.Since(began).Seconds()
	return res, nil
}

// RotateModes is modes started at the i-th (mod len), wrapping around:
// trajectory i replays its modes in this order.
func RotateModes(modes []string, i int) []string {
	if len(modes) == 0 {
		return nil
	}
	k := i % len(modes)
	return append(append([]string(nil), modes[k:]...), modes[:k]...)
}

func runSummary(run TurnsRun) string {
	switch run.Mode {
	case ModeAuto:
		return fmt.Sprintf(", none %d fs %d full %d, %s", run.Decisions[v1.DecisionNone], run.Decisions[v1.DecisionFS], run.Decisions[v1.DecisionFull], human(run.BytesWritten))
	case ModeFull:
		return fmt.Sprintf(", %d full, %s (images %s)", run.Decisions[v1.DecisionFull], human(run.BytesWritten), human(run.ImageBytes))
	}
	return ""
}

// runParallel replays cfg.Parallel trajectories (the selection's first,
// at most ParallelMaxTurns turns each) at once in auto mode on a daemon
// of its own.
func runParallel(ctx context.Context, cfg TurnsConfig, waits [][]time.Duration, mode string, noScheduler bool, progress func(string, ...any)) (TurnsParallel, error) {
	p := TurnsParallel{Mode: mode, Scheduler: !noScheduler, Sandboxes: cfg.Parallel, Runs: max(1, cfg.ParallelRuns)}
	progress("turns: parallel: %d sandboxes in %s mode, scheduler %v: starting a daemon", cfg.Parallel, mode, !noScheduler)
	e, err := cfg.StartDaemon(ctx, noScheduler)
	if err != nil {
		return p, err
	}
	defer func() {
		if err := e.Close(); err != nil {
			progress("turns: parallel: cleanup: %v", err)
		}
	}()
	r := &replayer{c: e.Client, cfg: cfg}
	per := max(1, cfg.ParallelRuns)
	runs := make([]TurnsRun, cfg.Parallel*per)
	errs := make([]error, cfg.Parallel*per)
	var wg sync.WaitGroup
	t0 := time.Now()
	for k := range cfg.Parallel {
		// Sandbox slot k replays trajectories k, k+P, k+2P, ... one
		// after the other, each in a fresh sandbox.
		wg.Go(func() {
			for m := range per {
				i := k + m*cfg.Parallel
				j := i % len(cfg.Trajectories)
				maxTurns := cfg.ParallelMaxTurns
				if mode == ModeFull && maxTurns > 0 {
					maxTurns = max(1, maxTurns/2)
				}
				runs[i], errs[i] = r.replay(ctx, cfg.Trajectories[j], mode, maxTurns, waits[j])
				if errs[i] != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	p.Seconds = time.Since(t0).Seconds()
	if err := errors.Join(errs...); err != nil {
		return p, err
	}
	var stall, full, end Sample
	for _, run := range runs {
		p.Turns += run.Turns
		p.Errors += run.Errors
		p.EndErrors += run.EndErrors
		p.Overrun += run.OverrunSeconds
		for _, o := range run.turns {
			if o.err != nil {
				continue
			}
			end = append(end, o.d)
			if o.res.Checkpoint == nil {
				continue
			}
			p.Checkpoints++
			stall = append(stall, msDur(o.res.StallMS))
			if o.res.Decision == v1.DecisionFull {
				p.Full++
				full = append(full, msDur(o.res.StallMS))
			}
		}
	}
	p.Stall, p.FullStall, p.TurnEnd = stall.Stats(), full.Stats(), end.Stats()
	progress("turns: parallel %s: scheduler %v: %d turns, %d checkpoints, stall p50 %.1f ms %s, %.1f s",
		mode, !noScheduler, p.Turns, p.Checkpoints, p.Stall.P50, p.Stall.TailString(), p.Seconds)
	return p, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// summarize fills the totals, decisions, effects and ratios.
func summarize(res *TurnsResult, waits [][]time.Duration, cfg TurnsConfig) {
	// Waits per agent.
	wby := map[string]Sample{}
	recBy := map[string]int{}
	var agents []string
	for i, t := range cfg.Trajectories {
		if _, ok := wby[t.Agent]; !ok {
			agents = append(agents, t.Agent)
		}
		wby[t.Agent] = append(wby[t.Agent], waits[i]...)
		for j := range waits[i] {
			if _, ok := RecordedGap(t, j); ok {
				recBy[t.Agent]++
			}
		}
	}
	sort.Strings(agents)
	for _, a := range agents {
		s := wby[a]
		var tot time.Duration
		for _, w := range s {
			tot += w
		}
		st := s.Stats()
		mean := 0.0
		if len(s) > 0 {
			mean = ms(tot) / float64(len(s))
		}
		res.Waits = append(res.Waits, TurnsWaits{Agent: a, Turns: len(s), Recorded: recBy[a], MeanMS: mean,
			P50MS: st.P50, P90MS: ms(s.Quantile(0.9)), MaxMS: ms(s.Quantile(1)), TotalS: tot.Seconds()})
	}

	totals := map[string]*TurnsModeTotals{}
	stalls := map[string]Sample{}
	ends := map[string]Sample{}
	res.Decisions = map[string]map[string]int{"all": {}}
	reasons, fullCmds, fsCmds := map[string]int{}, map[string]int{}, map[string]int{}
	examples := map[string]string{}
	example := func(k, cmd string) {
		if _, ok := examples[k]; !ok && cmd != "" {
			examples[k] = cmd
		}
	}
	for _, run := range res.Runs {
		t := totals[run.Mode]
		if t == nil {
			t = &TurnsModeTotals{Mode: run.Mode, AgentSeconds: map[string]float64{}}
			totals[run.Mode] = t
		}
		t.Trajectories++
		t.Turns += run.Turns
		t.Executed += run.Executed
		t.Inputs += run.Inputs
		t.NoCommand += run.NoCommand
		t.TimedOut += run.TimedOut
		t.Nonzero += run.Nonzero
		t.Errors += run.Errors
		t.EndErrors += run.EndErrors
		t.Seconds += run.Seconds
		t.WaitSeconds += run.WaitSeconds
		t.ExecSeconds += run.ExecSeconds
		t.EndSeconds += run.EndSeconds
		t.Overrun += run.OverrunSeconds
		t.AgentSeconds[run.Agent] += run.Seconds
		t.Checkpoints += run.Checkpoints
		t.BytesWritten += run.BytesWritten
		t.SetupBytes += run.SetupBytes
		t.ImageBytes += run.ImageBytes
		t.Lost += run.Lost
		for _, s := range run.stalls {
			stalls[run.Mode] = append(stalls[run.Mode], msDur(s))
		}
		for _, o := range run.turns {
			if o.err == nil {
				ends[run.Mode] = append(ends[run.Mode], o.d)
			}
		}
		if run.Mode != ModeAuto {
			continue
		}
		if res.Decisions[run.Agent] == nil {
			res.Decisions[run.Agent] = map[string]int{}
		}
		for _, o := range run.turns {
			if o.err != nil {
				continue
			}
			d := o.res.Decision
			res.Decisions[run.Agent][d]++
			res.Decisions["all"][d]++
			e := o.res.Effects
			ef := &res.Effects
			ef.Turns++
			ef.FileEffects += len(e.Files)
			ef.IgnoredFiles += e.IgnoredFiles
			if len(e.Files) > 0 {
				ef.WithFiles++
			}
			if len(e.LongLived) > 0 {
				ef.WithLongLived++
			}
			if len(e.Sessions) > 0 {
				ef.WithSessions++
			}
			if len(e.Unknown) > 0 {
				ef.WithUnknown++
			}
			for _, so := range e.Sockets {
				// init accepting molt's own calls is not the agent's.
				if so.Addr != "@molt-init" {
					ef.WithSockets++
					break
				}
			}
			if len(e.Processes) > 0 {
				ef.WithProcesses++
			}
			label := o.kind
			if o.kind == "shell" || strings.HasPrefix(o.program, "(") {
				label = o.program
			}
			switch d {
			case v1.DecisionFull:
				seen := map[string]bool{}
				for _, r := range o.res.Reasons {
					seen[NormalizeReason(r)] = true
				}
				for r := range seen {
					reasons[r]++
					example("reason:"+r, o.cmd)
				}
				fullCmds[label]++
				example("full:"+label, o.cmd)
			case v1.DecisionFS:
				fsCmds[label]++
				example("fs:"+label, o.cmd)
			}
		}
	}
	for _, m := range cfg.Modes {
		if t := totals[m]; t != nil {
			t.Stall, t.TurnEnd = stalls[m].Stats(), ends[m].Stats()
			res.Totals = append(res.Totals, *t)
		}
	}
	res.FullReasons, res.FullCommands, res.FSCommands = topCounts(reasons, 12), topCounts(fullCmds, 12), topCounts(fsCmds, 8)
	for _, l := range []struct {
		prefix string
		counts []TurnsCount
	}{{"reason:", res.FullReasons}, {"full:", res.FullCommands}, {"fs:", res.FSCommands}} {
		for i := range l.counts {
			l.counts[i].Example = examples[l.prefix+l.counts[i].What]
		}
	}
	none, auto, full := totals[ModeNone], totals[ModeAuto], totals[ModeFull]
	if auto != nil && full != nil && full.BytesWritten > 0 {
		res.TrafficReduction = 1 - float64(auto.BytesWritten)/float64(full.BytesWritten)
		if full.ImageBytes > 0 {
			res.PlainReduction = 1 - float64(auto.BytesWritten)/float64(full.ImageBytes)
		}
		if f := full.BytesWritten - full.SetupBytes; f > 0 {
			res.TurnsReduction = 1 - float64(auto.BytesWritten-auto.SetupBytes)/float64(f)
		}
	}
	if none != nil && none.Seconds > 0 {
		if auto != nil {
			res.Overhead = (auto.Seconds - none.Seconds) / none.Seconds
			res.AgentOverhead = map[string]float64{}
			for a, s := range none.AgentSeconds {
				if s > 0 {
					res.AgentOverhead[a] = (auto.AgentSeconds[a] - s) / s
				}
			}
		}
		if full != nil {
			res.FullOverhead = (full.Seconds - none.Seconds) / none.Seconds
		}
	}
}

func topCounts(m map[string]int, n int) []TurnsCount {
	out := make([]TurnsCount, 0, len(m))
	for k, v := range m {
		out = append(out, TurnsCount{What: k, Turns: v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Turns != out[j].Turns {
			return out[i].Turns > out[j].Turns
		}
		return out[i].What < out[j].What
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// PrintTurns writes the result as tables with the targets checked.
func PrintTurns(w io.Writer, r TurnsResult) {
	fmt.Fprintf(w, "LLM waits (simulated, scale %.3g; %.0f ms default where none is recorded, recorded waits capped at %.0f ms before scaling):\n",
		r.LLMScale, r.LLMWaitMS*r.LLMScale, r.LLMMaxMS)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "agent\ttrajectories\tturns\trecorded\tmean\tp50\tp90\tmax\ttotal\t")
	for _, wt := range r.Waits {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f ms\t%.0f ms\t%.0f ms\t%.0f ms\t%.1f s\t\n", wt.Agent, r.PerAgent[wt.Agent], wt.Turns, wt.Recorded, wt.MeanMS, wt.P50MS, wt.P90MS, wt.MaxMS, wt.TotalS)
	}
	tw.Flush()

	fmt.Fprintf(w, "\nReplay per mode (each trajectory in a fresh sandbox per mode; command timeout %.0f ms", r.CmdTimeoutMS)
	if !r.FullWaits {
		fmt.Fprint(w, "; full without LLM waits")
	}
	fmt.Fprintln(w, "):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tturns\trun\tkeystrokes\tno cmd\ttimed out\texit!=0\terrors\ttime\tcommands\tturn end p50 / tail\tover waits\tstall p50 / tail\tcheckpoints\tbytes written\tCRIU image bytes\t")
	for _, t := range r.Totals {
		end, stall, over := "-", "-", "-"
		if t.Mode != ModeNone {
			end = p50Tail(t.TurnEnd)
			stall = p50Tail(t.Stall)
			if t.Mode != ModeFull || r.FullWaits {
				over = fmt.Sprintf("%.2f s", t.Overrun)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f s\t%.1f s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", t.Mode, t.Turns, t.Executed, t.Inputs, t.NoCommand,
			t.TimedOut, t.Nonzero, t.Errors+t.EndErrors, t.Seconds, t.ExecSeconds, end, over, stall, t.Checkpoints, human(t.BytesWritten), human(t.ImageBytes))
	}
	tw.Flush()

	if all := r.Decisions["all"]; len(all) > 0 {
		fmt.Fprintln(w, "\nDecisions under auto (turns, setup excluded):")
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "agent\tturns\tnone\tfs\tfull\t")
		var agents []string
		for a := range r.Decisions {
			if a != "all" {
				agents = append(agents, a)
			}
		}
		sort.Strings(agents)
		for _, a := range append(agents, "all") {
			d := r.Decisions[a]
			n := d[v1.DecisionNone] + d[v1.DecisionFS] + d[v1.DecisionFull]
			fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t%.1f%%\t\n", a, n, pct(d[v1.DecisionNone], n), pct(d[v1.DecisionFS], n), pct(d[v1.DecisionFull], n))
		}
		tw.Flush()
		e := r.Effects
		fmt.Fprintf(w, "\nWhat the inspector saw (auto, %d turns): files changed in %d turns (%d file effects, %d ignored), long-lived process changes in %d, session state changes in %d, unknown effects in %d, sockets (other than init's) in %d, processes spawned in %d.\n",
			e.Turns, e.WithFiles, e.FileEffects, e.IgnoredFiles, e.WithLongLived, e.WithSessions, e.WithUnknown, e.WithSockets, e.WithProcesses)
		nfull := all[v1.DecisionFull]
		if len(r.FullReasons) > 0 {
			fmt.Fprintf(w, "\nWhy turns were full (%d full turns; a turn may have several reasons; an example command):\n", nfull)
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, c := range r.FullReasons {
				fmt.Fprintf(tw, "  %6d\t%5.1f%%\t%s\t%s\n", c.Turns, pct(c.Turns, nfull), c.What, c.Example)
			}
			tw.Flush()
			fmt.Fprintln(w, "\nWhat full turns ran (shell: program; otherwise the turn kind):")
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, c := range r.FullCommands {
				fmt.Fprintf(tw, "  %6d\t%5.1f%%\t%s\t%s\n", c.Turns, pct(c.Turns, nfull), c.What, c.Example)
			}
			tw.Flush()
		}
		if len(r.FSCommands) > 0 {
			nfs := all[v1.DecisionFS]
			fmt.Fprintf(w, "\nWhat fs turns ran (%d fs turns):\n", nfs)
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, c := range r.FSCommands {
				fmt.Fprintf(tw, "  %6d\t%5.1f%%\t%s\t%s\n", c.Turns, pct(c.Turns, nfs), c.What, c.Example)
			}
			tw.Flush()
		}
	}

	var none, auto, full *TurnsModeTotals
	for i := range r.Totals {
		switch r.Totals[i].Mode {
		case ModeNone:
			none = &r.Totals[i]
		case ModeAuto:
			auto = &r.Totals[i]
		case ModeFull:
			full = &r.Totals[i]
		}
	}
	fmt.Fprintln(w)
	if auto != nil && full != nil && full.BytesWritten > 0 {
		fmt.Fprintf(w, "Checkpoint traffic: auto %s, full every turn %s (plain CRIU dumps: %s of images): reduction %.1f%% (target >= 87%%: %s); vs plain dumps %.1f%%\n",
			human(auto.BytesWritten), human(full.BytesWritten), human(full.ImageBytes), 100*r.TrafficReduction, verdict(r.TrafficReduction >= 0.87), 100*r.PlainReduction)
		fmt.Fprintf(w, "  of which the setup turns' checkpoints: auto %s, full %s; the trajectories' turns alone: auto %s, full %s: reduction %.1f%%\n",
			human(auto.SetupBytes), human(full.SetupBytes), human(auto.BytesWritten-auto.SetupBytes), human(full.BytesWritten-full.SetupBytes), 100*r.TurnsReduction)
	}
	if none != nil && auto != nil && none.Seconds > 0 {
		fmt.Fprintf(w, "Time: none %.1f s, auto %.1f s: overhead %+.2f%% (target <= 2%%: %s)", none.Seconds, auto.Seconds, 100*r.Overhead, verdict(r.Overhead <= 0.02))
		switch {
		case full != nil && r.FullWaits:
			fmt.Fprintf(w, "; full every turn %.1f s: %+.2f%%", full.Seconds, 100*r.FullOverhead)
		case full != nil:
			fmt.Fprint(w, "; full every turn replayed without LLM waits (its time is not comparable; --full-waits)")
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "  conditions: none runs without the inspector (its programs detached), the modes' order rotates per trajectory; LLM waits simulated at %.3g of the recorded ones; %d of %d commands exited non-zero or timed out in mode none (no repository in the sandboxes)\n",
			r.LLMScale, none.Nonzero+none.TimedOut, none.Executed)
		var agents []string
		for a := range r.AgentOverhead {
			agents = append(agents, a)
		}
		sort.Strings(agents)
		for _, a := range agents {
			fmt.Fprintf(w, "  %s: none %.1f s, auto %.1f s: %+.2f%%\n", a, none.AgentSeconds[a], auto.AgentSeconds[a], 100*r.AgentOverhead[a])
		}
	}
	if len(r.Parallel) > 0 {
		fmt.Fprintf(w, "\n%d sandboxes replaying at once (%d trajectories each in turn; auto: as recorded, full: a full checkpoint after every turn, no LLM waits), checkpoint stall of the turns that checkpointed:\n", r.Parallel[0].Sandboxes, r.Parallel[0].Runs)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "mode\tscheduler\tturns\tcheckpoints\tfull\tstall p50\tstall tail\tfull stall p50\tfull stall tail\tturn end p50 / tail\tover waits\terrors\twall\t")
		for _, p := range r.Parallel {
			s := "on"
			if !p.Scheduler {
				s = "off"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1f ms\t%s\t%.1f ms\t%s\t%s\t%.2f s\t%d\t%.1f s\t\n", p.Mode, s, p.Turns, p.Checkpoints, p.Full,
				p.Stall.P50, p.Stall.TailString(), p.FullStall.P50, p.FullStall.TailString(), p50Tail(p.TurnEnd), p.Overrun, p.Errors+p.EndErrors, p.Seconds)
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nwhole run: %.1f s\n", r.Seconds)
}

// p50Tail formats a p50 and the tail Stats.Tail allows: "2.1 / max 30.0 ms".
func p50Tail(s Stats) string {
	l, v := s.Tail()
	return fmt.Sprintf("%.1f / %s %.1f ms", s.P50, l, v)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}
