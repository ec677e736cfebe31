// Replaying one trajectory in one sandbox, turn by turn, in one mode.

package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
)

// turnOutcome is how a turn ended (auto and full modes).
type turnOutcome struct {
	kind, program string
	cmd           string // the command, shortened
	res           v1.TurnResult
	err           error
	d             time.Duration // the call, as the client saw it
}

// shorten puts a command on one line of at most n runes.
func shorten(cmd string, n int) string {
	cmd = strings.Join(strings.Fields(cmd), " ")
	if r := []rune(cmd); len(r) > n {
		cmd = string(r[:n-3]) + "..."
	}
	return cmd
}

// miniEnv is mini-swe-agent's recorded command environment.
var miniEnv = map[string]string{"PAGER": "cat", "MANPAGER": "cat", "LESS": "-R", "PIP_PROGRESS_BAR": "off", "TQDM_DISABLE": "1"}

// replayer replays trajectories against one daemon.
type replayer struct {
	c   *client.Client
	cfg TurnsConfig
	// beforeRemove, if set, runs once a replay is done, before its
	// sandbox goes (the fleet bench waits there for its uploads).
	beforeRemove func(ctx context.Context, run *TurnsRun)
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
	if err := r.playTurns(ctx, t, turns, mode, waits, &run); err != nil {
		return run, err
	}
	run.tallyDecisions()
	if mode != ModeNone {
		if err := r.sumCheckpoints(ctx, sb, &run); err != nil {
			return run, err
		}
	}
	if r.beforeRemove != nil {
		r.beforeRemove(ctx, &run)
	}
	return run, nil
}

// turnEnd is a turn's end as the goroutine that ended it saw it.
type turnEnd struct {
	res v1.TurnResult
	err error
	d   time.Duration
}

// playTurns plays the turns in the run's sandbox: each turn's LLM wait,
// during which the previous turn ends (in the background, as molt's LLM
// proxy does), then its command. It records times, failures and how each
// turn ended in run.
func (r *replayer) playTurns(ctx context.Context, t Trajectory, turns []TrajectoryTurn, mode string, waits []time.Duration, run *TurnsRun) error {
	sb := run.Sandbox
	var pending chan turnEnd
	var pendingTurn turnOutcome
	// collect records a turn's end; visible: the agent waited for it
	// (behind the next LLM wait).
	collect := func(e turnEnd, wait time.Duration, visible bool) {
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
			return err
		}
		if pending != nil {
			collect(<-pending, w, true)
			pending = nil
		}
		run.WaitSeconds += w.Seconds()
		cmd, prog, ok := turnProgram(t.Agent, tu, run)
		te := time.Now()
		if ok {
			if err := r.runCommand(ctx, sb, t.Agent, cmd, run); err != nil {
				return err
			}
		}
		prevExec = time.Since(te)
		run.ExecSeconds += prevExec.Seconds()
		run.Seconds += time.Since(t0).Seconds()
		if mode != ModeNone {
			pending = make(chan turnEnd, 1)
			pendingTurn = turnOutcome{kind: tu.Kind, program: prog, cmd: shorten(cmd, 70)}
			go func(ch chan turnEnd) {
				t0 := time.Now()
				res, err := r.endTurn(ctx, sb, mode)
				ch <- turnEnd{res, err, time.Since(t0)}
			}(pending)
		}
	}
	if pending != nil {
		// The last turn ends after the agent is done: not agent-visible.
		collect(<-pending, 0, false)
	}
	return nil
}

// turnProgram returns a turn's command, whether it has one to run, and
// the program it is counted under; it counts keystrokes and turns
// without a command in run.
func turnProgram(agent string, tu TrajectoryTurn, run *TurnsRun) (cmd, prog string, ok bool) {
	cmd, ok = TurnCommand(agent, tu)
	prog = tu.Kind
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
	return cmd, prog, ok
}

// runCommand runs a turn's command and counts in run how it went. The
// error is the context's only: a failing command is counted.
func (r *replayer) runCommand(ctx context.Context, sb, agent, cmd string, run *TurnsRun) error {
	run.Executed++
	exit, timedOut, err := r.exec(ctx, sb, agent, cmd)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
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
	return nil
}

// tallyDecisions counts the decisions of the run's ended turns and keeps
// the stalls of those that checkpointed.
func (run *TurnsRun) tallyDecisions() {
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
