package bench

// The recovery benchmark: scripted agents replay recorded trajectories
// (with a payment every few turns) through molt's LLM endpoint against a
// fake LLM, in sandboxes with egress to a test internet; crashes are
// injected at seeded turns (kill -9 of the agent, of every process in
// the sandbox, of the daemon); each strategy recovers, the agent runs to
// the end, and the final state is compared with a fault-free run's.
//
// Strategies:
//   - chat: a new sandbox; the restarted agent re-runs every command of
//     its chat history, then continues live with that history.
//   - chat+files: the sandbox's files go back to the latest turn
//     checkpoint molt took (files only: every process is killed, the
//     session starts afresh), the agent re-runs the commands of its
//     history after that turn, then continues live.
//   - molt: `recover`; the agent restarts from scratch against the same
//     LLM endpoint and exec API and is fast-forwarded by molt.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/egress/netlab"
)

// Recovery strategies.
const (
	StrategyChat      = "chat"
	StrategyChatFiles = "chat+files"
	StrategyMolt      = "molt"
)

// Strategies are the strategies, in output order.
var Strategies = []string{StrategyChat, StrategyChatFiles, StrategyMolt}

// RecoveryConfig configures RunRecovery.
type RecoveryConfig struct {
	// Bin is the molt binary: the daemon and the agents run from it.
	Bin          string
	Dir          string // where the daemon's temporary state root goes
	CacheDir     string // debootstrap cache
	CriuPath     string // for the host facts
	Trajectories []Trajectory
	Crashes      int // crash points per trajectory
	MaxTurns     int // trajectory turns per run (0: all)
	EffectEvery  int // an effect turn after every N trajectory turns
	Seed         uint64
	Strategies   []string
	CmdTimeout   time.Duration
	Progress     io.Writer
}

// RecoveryAttempt is one crash recovered by one strategy.
type RecoveryAttempt struct {
	Traj     int        `json:"trajectory"`
	Agent    string     `json:"agent"`
	Task     string     `json:"task"`
	Crash    CrashPoint `json:"crash"`
	Strategy string     `json:"strategy"`
	Turns    int        `json:"turns"`
	Correct  bool       `json:"correct"`
	Dups     int        `json:"duplicated_effects"`
	Missing  int        `json:"missing_effects"`
	// RecoverMS is the time from the crash to the agent back at the
	// crash turn (its command redone, or its chat reloaded and re-run).
	RecoverMS float64 `json:"recover_ms"`
	// BytesReplayed: command output re-run or replayed and LLM replies
	// re-requested until the agent was back at the crash turn.
	BytesReplayed int64 `json:"bytes_replayed"`
	// From is the turn the strategy restarted the sandbox's state from
	// (chat: 0; chat+files and molt: the checkpoint's turn).
	From       int                `json:"from_turn"`
	Checkpoint string             `json:"checkpoint,omitempty"`
	Recover    *v1.RecoverResult  `json:"recover,omitempty"`
	Recovery   *v1.RecoveryStatus `json:"recovery,omitempty"`
	Diffs      []string           `json:"diffs,omitempty"`
	Error      string             `json:"error,omitempty"`
	Effects    map[string]int     `json:"effects,omitempty"`
	Seconds    float64            `json:"seconds"`
}

// RecoveryTrajectory is a trajectory's fault-free reference.
type RecoveryTrajectory struct {
	Index   int      `json:"index"`
	Agent   string   `json:"agent"`
	Task    string   `json:"task"`
	Turns   int      `json:"turns"`
	Effects []string `json:"effects"`
	// Volatile lists the paths two fault-free runs disagreed on
	// (excluded from the comparison); SessionsVary and ProcessesVary
	// say the same of sessions and processes.
	Volatile      []string     `json:"volatile,omitempty"`
	SessionsVary  bool         `json:"sessions_vary,omitempty"`
	ProcessesVary bool         `json:"processes_vary,omitempty"`
	Crashes       []CrashPoint `json:"crashes"`
	Error         string       `json:"error,omitempty"`
}

// RecoveryTally sums one strategy's attempts for one agent ("all": every
// agent).
type RecoveryTally struct {
	Strategy string `json:"strategy"`
	Agent    string `json:"agent"`
	Attempts int    `json:"attempts"`
	Correct  int    `json:"correct"`
	Dups     int    `json:"duplicated_effects"`
	Missing  int    `json:"missing_effects"`
	Errors   int    `json:"errors"`
	// Recover is the time to recover of the attempts without error.
	Recover Stats `json:"recover"`
	// Bytes replayed: the sum, and the median per attempt.
	Bytes       int64 `json:"bytes_replayed"`
	BytesMedian int64 `json:"bytes_replayed_median"`
}

// RecoveryResult is what RunRecovery measured.
type RecoveryResult struct {
	Host        HostFacts            `json:"host"`
	Date        string               `json:"date"`
	Seed        uint64               `json:"seed"`
	Crashes     int                  `json:"crashes"`
	MaxTurns    int                  `json:"max_turns"`
	EffectEvery int                  `json:"effect_every"`
	Strategies  []string             `json:"strategies"`
	Volatile    []string             `json:"volatile_patterns"`
	Refs        []RecoveryTrajectory `json:"trajectories"`
	Attempts    []RecoveryAttempt    `json:"attempts"`
	Tallies     []RecoveryTally      `json:"tallies"`
	Seconds     float64              `json:"seconds"`
	LoadEnd     string               `json:"loadavg_end"`
}

// recHarness runs the benchmark's runs against one daemon.
type recHarness struct {
	cfg    RecoveryConfig
	d      *daemonProc
	lab    *netlab.Lab
	pays   *Payments
	llm    *FakeLLM
	llmURL string
	work   string
}

// RunRecovery runs the benchmark. Preconditions: root, CRIU.
func RunRecovery(ctx context.Context, cfg RecoveryConfig) (res RecoveryResult, err error) {
	if os.Geteuid() != 0 {
		return res, errors.New("molt bench recovery needs root (a daemon, network namespaces)")
	}
	if cfg.Bin == "" {
		return res, errors.New("recovery bench: no molt binary")
	}
	if cfg.Dir == "" {
		cfg.Dir = "/var/tmp"
	}
	if cfg.CmdTimeout <= 0 {
		cfg.CmdTimeout = 10 * time.Second
	}
	if len(cfg.Strategies) == 0 {
		cfg.Strategies = Strategies
	}
	progress := progressf(cfg.Progress)
	start := time.Now()
	res = RecoveryResult{Date: time.Now().UTC().Format(time.RFC3339), Seed: cfg.Seed, Crashes: cfg.Crashes, MaxTurns: cfg.MaxTurns,
		EffectEvery: cfg.EffectEvery, Strategies: cfg.Strategies, Volatile: VolatilePatterns}

	work, err := os.MkdirTemp(cfg.Dir, "molt-bench-recovery-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(work)
	lab, pays, err := startLab(work)
	if err != nil {
		return res, fmt.Errorf("test internet: %w", err)
	}
	defer lab.Close()
	fake := NewFakeLLM()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	d := &daemonProc{bin: cfg.Bin, root: filepath.Join(work, "root"), sock: filepath.Join(work, "molt.sock"),
		log: filepath.Join(work, "daemon.log"), cacheDir: cfg.CacheDir, lab: lab}
	progress("recovery bench: starting the daemon (%s)", cfg.Bin)
	if err := d.start(ctx); err != nil {
		return res, err
	}
	defer func() {
		if terr := d.teardown(); terr != nil && err == nil {
			err = terr
		}
	}()
	progress("recovery bench: building the default image")
	if _, err := d.c.BuildImage(ctx, v1.ImageBuildRequest{Name: "default"}, nil); err != nil {
		return res, err
	}
	res.Host = GatherHost(ctx, d.c, cfg.CriuPath)
	h := &recHarness{cfg: cfg, d: d, lab: lab, pays: pays, llm: fake, llmURL: "http://" + ln.Addr().String() + "/v1", work: work}

	for ti, t := range cfg.Trajectories {
		ref, atts := h.trajectory(ctx, ti, t)
		res.Refs = append(res.Refs, ref)
		res.Attempts = append(res.Attempts, atts...)
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
	}
	res.Tallies = TallyRecovery(res.Attempts, cfg.Strategies)
	res.Seconds = time.Since(start).Seconds()
	res.LoadEnd = loadAvg()
	return res, nil
}

// runOut is what one run of a script left.
type runOut struct {
	state State
	att   RecoveryAttempt
	err   error
}

// trajectory runs a trajectory fault-free twice (the reference, and what
// varies by itself), then once per crash point and strategy.
func (h *recHarness) trajectory(ctx context.Context, ti int, t Trajectory) (RecoveryTrajectory, []RecoveryAttempt) {
	progress := progressf(h.cfg.Progress)
	script := BuildScript(t, "x", h.cfg.MaxTurns, h.cfg.EffectEvery)
	ref := RecoveryTrajectory{Index: ti, Agent: t.Agent, Task: t.TaskID, Turns: len(script), Effects: Effects(script),
		Crashes: PickCrashes(h.cfg.Seed, ti, len(script), h.cfg.Crashes)}
	progress("recovery bench: trajectory %d (%s %s): %d turns, %d effects, crashes %v", ti, t.Agent, t.TaskID, len(script), len(ref.Effects), ref.Crashes)
	a := h.run(ctx, t, fmt.Sprintf("t%02d-ref-a", ti), nil, "")
	b := h.run(ctx, t, fmt.Sprintf("t%02d-ref-b", ti), nil, "")
	for _, r := range []runOut{a, b} {
		if r.err == nil {
			if dups, missing := Duplicates(r.state.Effects, ref.Effects); dups+missing > 0 {
				r.err = fmt.Errorf("fault-free run: %d duplicated, %d missing effects (%v)", dups, missing, r.state.Effects)
			}
		}
		if r.err != nil && ref.Error == "" {
			ref.Error = r.err.Error()
		}
	}
	if ref.Error != "" {
		progress("recovery bench: trajectory %d: reference failed: %s", ti, ref.Error)
		return ref, nil
	}
	ref.Volatile = Volatile(a.state, b.state)
	want := a.state
	ref.SessionsVary = !maps.Equal(a.state.Sessions, b.state.Sessions)
	if ref.SessionsVary {
		for name := range a.state.SessionText {
			progress("recovery bench: trajectory %d: session %s differs between fault-free runs: %s", ti, name,
				shorten(strings.Join(SessionLinesDiff(a.state.SessionText[name], b.state.SessionText[name]), " | "), 400))
		}
	}
	ref.ProcessesVary = !slices.Equal(a.state.Processes, b.state.Processes)
	var atts []RecoveryAttempt
	for ci, cp := range ref.Crashes {
		for _, s := range h.cfg.Strategies {
			tag := fmt.Sprintf("t%02d-c%d-%s", ti, ci, strings.ReplaceAll(s, "+", ""))
			r := h.run(ctx, t, tag, &cp, s)
			att := r.att
			att.Traj, att.Agent, att.Task, att.Crash, att.Strategy, att.Turns = ti, t.Agent, t.TaskID, cp, s, len(script)
			att.Dups, att.Missing = Duplicates(r.state.Effects, ref.Effects)
			att.Effects = r.state.Effects
			if r.err != nil {
				att.Error = r.err.Error()
			} else {
				got := r.state
				w := want
				if ref.SessionsVary {
					w.Sessions, got.Sessions = nil, nil
				}
				if ref.ProcessesVary {
					w.Processes, got.Processes = nil, nil
				}
				att.Diffs = Diff(w, got, ref.Volatile)
				att.Correct = len(att.Diffs) == 0
				if len(att.Diffs) > 8 {
					att.Diffs = append(att.Diffs[:8], fmt.Sprintf("... %d more", len(att.Diffs)-8))
				}
			}
			verdict := "correct"
			if !att.Correct {
				verdict = "INCORRECT"
				if att.Error != "" {
					verdict += ": " + shorten(att.Error, 200)
				} else if len(att.Diffs) > 0 {
					verdict += ": " + shorten(strings.Join(att.Diffs, "; "), 200)
				}
			}
			progress("recovery bench: t%02d crash %d (%s after turn %d) %-10s %s; %d dup, recovered in %.0f ms, %s replayed",
				ti, ci, cp.Kind, cp.Turn, s, verdict, att.Dups, att.RecoverMS, human(att.BytesReplayed))
			atts = append(atts, att)
		}
	}
	return ref, atts
}

// sandboxSetup is a run's sandbox: created with egress, the layout the
// commands expect, the session in its start directory, and molt's LLM
// endpoint towards the fake LLM.
type sandboxSetup struct {
	id, url string
	since   float64 // unix seconds before creation: files written since are hashed
}

func startDir(agent string) string {
	if agent == AgentOpenHands {
		return "/workspace"
	}
	return "/testbed"
}

func (h *recHarness) newSandbox(ctx context.Context, t Trajectory) (sandboxSetup, error) {
	c := h.d.c
	since := float64(time.Now().Add(-time.Second).UnixNano()) / 1e9
	sb, err := c.Create(ctx, v1.SandboxCreateRequest{Image: "default", Network: v1.NetworkEgress})
	if err != nil {
		return sandboxSetup{}, fmt.Errorf("create: %w", err)
	}
	dirs := []string{"/testbed"}
	if t.Agent == AgentOpenHands {
		dirs = append([]string{"/workspace"}, WorkspaceDirs(t)...)
	}
	script := "mkdir -p " + strings.Join(dirs, " ") +
		" && { command -v python >/dev/null || ln -s \"$(command -v python3)\" /usr/local/bin/python; }"
	var stderr strings.Builder
	st, err := c.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"bash", "-c", script}, Aside: true}, client.ExecIO{Stderr: &stderr})
	if err == nil && st.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", st.ExitCode, stderr.String())
	}
	if err != nil {
		_ = c.Remove(context.Background(), sb.ID)
		return sandboxSetup{}, fmt.Errorf("setup: %w", err)
	}
	if err := h.startSession(ctx, sb.ID, t.Agent); err != nil {
		_ = c.Remove(context.Background(), sb.ID)
		return sandboxSetup{}, err
	}
	ep, err := c.SetLLM(ctx, sb.ID, v1.LLMEndpointRequest{Upstream: h.llmURL})
	if err != nil {
		_ = c.Remove(context.Background(), sb.ID)
		return sandboxSetup{}, fmt.Errorf("llm endpoint: %w", err)
	}
	return sandboxSetup{id: sb.ID, url: ep.URL, since: since}, nil
}

// startSession puts the session agents' session in their start
// directory.
func (h *recHarness) startSession(ctx context.Context, sb, agent string) error {
	if agent == AgentMini {
		return nil
	}
	var err error
	for try := 0; try < 3; try++ {
		// A session killed a moment ago may not be known dead yet: its
		// call fails, the next starts a new session.
		var res v1.SessionRunResult
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		res, err = h.d.c.SessionRun(cctx, sb, "main", v1.SessionRunRequest{Command: "cd " + startDir(agent), Aside: true})
		cancel()
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		if err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("session setup: %w", err)
	}
	return nil
}

// run runs trajectory t's script tagged tag (the payments' run) in a new
// sandbox: to the end, or with crash to the crash, recovered by
// strategy, then to the end; and reads the final state.
func (h *recHarness) run(ctx context.Context, t Trajectory, tag string, crash *CrashPoint, strategy string) (out runOut) {
	t0 := time.Now()
	defer func() { out.att.Seconds = time.Since(t0).Seconds() }()
	script := BuildScript(t, tag, h.cfg.MaxTurns, h.cfg.EffectEvery)
	h.llm.Set(tag, script)
	dir := filepath.Join(h.work, tag)
	if out.err = os.MkdirAll(dir, 0o700); out.err != nil {
		return out
	}
	c := h.d.c
	sb, err := h.newSandbox(ctx, t)
	if err != nil {
		out.err = err
		return out
	}
	live := []string{sb.id}
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for _, id := range live {
			_ = h.d.c.Remove(rctx, id)
		}
	}()
	spec := AgentSpec{Socket: h.d.sock, Sandbox: sb.id, BaseURL: sb.url, Model: tag, Agent: t.Agent, Mode: AgentFresh,
		PauseAfter: -1, Transcript: filepath.Join(dir, "transcript.jsonl"), Events: filepath.Join(dir, "events-1.jsonl"),
		CmdTimeout: h.cfg.CmdTimeout.Milliseconds()}
	limit := 5*time.Minute + time.Duration(len(script))*(h.cfg.CmdTimeout+30*time.Second)
	// Nothing of a run may hang the benchmark.
	ctx, cancel := context.WithTimeout(ctx, 3*limit)
	defer cancel()
	if crash != nil {
		spec.PauseAfter = crash.Turn
	}
	a, err := h.agent(spec, dir, "spec-1.json")
	if err != nil {
		out.err = err
		return out
	}
	if crash == nil {
		out.err = waitAgent(ctx, a, limit)
	} else {
		select {
		case <-a.paused:
		case err := <-a.done:
			out.err = fmt.Errorf("agent ended before the crash: %v: %s", err, shorten(a.stderr.String(), 300))
			return out
		case <-time.After(limit):
			a.kill()
			out.err = errors.New("agent did not reach the crash turn")
			return out
		case <-ctx.Done():
			a.kill()
			out.err = ctx.Err()
			return out
		}
		crashed := time.Now()
		if out.err = h.crash(ctx, *crash, sb.id, a); out.err != nil {
			return out
		}
		var spec2 AgentSpec
		spec2, sb, out.err = h.recover(ctx, t, *crash, strategy, spec, sb, &out.att)
		if sb.id != live[0] {
			live = append(live, sb.id)
		}
		if out.err != nil {
			return out
		}
		spec2.Events = filepath.Join(dir, "events-2.jsonl")
		a2, err := h.agent(spec2, dir, "spec-2.json")
		if err != nil {
			out.err = err
			return out
		}
		out.err = waitAgent(ctx, a2, limit)
		evs, rerr := readEvents(spec2.Events)
		if rerr != nil && out.err == nil {
			out.err = rerr
		}
		back, bytes, ok := BackAtCrash(evs, crash.Turn, spec2.Mode)
		if ok {
			out.att.RecoverMS = float64(back.Sub(crashed).Microseconds()) / 1000
		} else if out.err == nil {
			out.err = errors.New("the restarted agent never got back to the crash turn")
		}
		out.att.BytesReplayed = bytes
		if strategy == StrategyMolt {
			if st, err := c.Recovery(ctx, sb.id); err == nil {
				out.att.Recovery = &st
			}
		}
		if out.err != nil {
			return out
		}
	}
	if out.err != nil {
		return out
	}
	out.state, out.err = SnapshotState(ctx, c, sb.id, sb.since)
	out.state.Effects = h.pays.Counts(tag)
	return out
}

func (h *recHarness) agent(spec AgentSpec, dir, name string) (*agentProc, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return nil, err
	}
	return startAgent(h.cfg.Bin, p)
}

func waitAgent(ctx context.Context, a *agentProc, limit time.Duration) error {
	select {
	case err := <-a.done:
		if err != nil {
			return fmt.Errorf("agent: %v: %s", err, shorten(a.stderr.String(), 400))
		}
		return nil
	case <-time.After(limit):
		a.kill()
		return fmt.Errorf("agent did not finish in %v", limit)
	case <-ctx.Done():
		a.kill()
		return ctx.Err()
	}
}

// crash injects the crash; the agent (paused after the crash turn's
// command) is killed whatever the kind, and a killed daemon restarted
// on its state root.
func (h *recHarness) crash(ctx context.Context, cp CrashPoint, sb string, a *agentProc) error {
	switch cp.Kind {
	case CrashAgent:
		a.kill()
	case CrashSandbox:
		info, err := h.d.c.Sandbox(ctx, sb)
		if err != nil {
			a.kill()
			return err
		}
		if info.Pid <= 0 {
			a.kill()
			return fmt.Errorf("sandbox %s has no init (state %s)", sb, info.State)
		}
		// The sandbox's init is its PID namespace's: killing it kills
		// every process in the sandbox.
		if err := unix.Kill(info.Pid, unix.SIGKILL); err != nil {
			a.kill()
			return fmt.Errorf("kill the sandbox's processes: %w", err)
		}
		// The agent's next command fails (as the agent would see it)
		// before the agent is killed.
		deadline := time.Now().Add(30 * time.Second)
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := h.d.c.Exec(cctx, sb, v1.ExecRequest{Args: []string{"true"}, Aside: true}, client.ExecIO{})
			cancel()
			if err != nil {
				break
			}
			if time.Now().After(deadline) {
				a.kill()
				return errors.New("the sandbox still runs commands 30 s after its init was killed")
			}
			time.Sleep(50 * time.Millisecond)
		}
		a.kill()
	case CrashDaemon:
		h.d.kill()
		a.kill()
		if err := h.d.start(ctx); err != nil {
			return fmt.Errorf("restart the daemon: %w", err)
		}
	default:
		return fmt.Errorf("unknown crash kind %q", cp.Kind)
	}
	return nil
}

// recover brings the run back by strategy and returns the restarted
// agent's spec and the sandbox it works in.
func (h *recHarness) recover(ctx context.Context, t Trajectory, cp CrashPoint, strategy string, spec AgentSpec, sb sandboxSetup, att *RecoveryAttempt) (AgentSpec, sandboxSetup, error) {
	c := h.d.c
	spec.PauseAfter = -1
	// The LLM endpoint lives in the daemon's memory: a new daemon needs
	// a new one (the restarted agent gets its URL).
	relink := func() error {
		ep, err := c.SetLLM(ctx, sb.id, v1.LLMEndpointRequest{Upstream: h.llmURL})
		if err != nil {
			return fmt.Errorf("llm endpoint: %w", err)
		}
		sb.url, spec.BaseURL = ep.URL, ep.URL
		return nil
	}
	switch strategy {
	case StrategyChat:
		nsb, err := h.newSandbox(ctx, t)
		if err != nil {
			return spec, sb, err
		}
		_ = c.Remove(ctx, sb.id)
		spec.Sandbox, spec.BaseURL, spec.Mode, spec.ReplayFrom = nsb.id, nsb.url, AgentChat, 0
		return spec, nsb, nil
	case StrategyChatFiles:
		if cp.Kind == CrashDaemon {
			if err := relink(); err != nil {
				return spec, sb, err
			}
		}
		ck, from, err := latestTurnCheckpoint(ctx, h, sb.id)
		if err != nil {
			return spec, sb, err
		}
		att.Checkpoint, att.From = ck, from
		rb, err := c.Rollback(ctx, sb.id, ck)
		if err != nil {
			return spec, sb, fmt.Errorf("rollback to %s: %w", ck, err)
		}
		// Files only: the processes the rollback brought back go (none
		// when it restarted them). The sessions are closed through molt
		// first: a restored session killed from inside is not always
		// noticed (the next call on it can hang).
		if info, err := c.Sandbox(ctx, sb.id); err == nil && !rb.ProcessesRestarted {
			for _, ss := range info.Sessions {
				cctx, cancel := context.WithTimeout(ctx, time.Minute)
				_ = c.SessionClose(cctx, sb.id, ss.Name)
				cancel()
			}
		}
		if !rb.ProcessesRestarted {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			_, _ = c.Exec(cctx, sb.id, v1.ExecRequest{Args: []string{"bash", "-c", "kill -9 -1; true"}, Aside: true}, client.ExecIO{})
			cancel()
		}
		if err := h.startSession(ctx, sb.id, t.Agent); err != nil {
			return spec, sb, err
		}
		spec.Mode, spec.ReplayFrom = AgentChat, from
		return spec, sb, nil
	case StrategyMolt:
		var linkErr error
		if cp.Kind == CrashDaemon {
			linkErr = relink()
		}
		rr, err := c.Recover(ctx, sb.id, v1.RecoverRequest{})
		if err != nil {
			return spec, sb, fmt.Errorf("recover: %w", err)
		}
		att.Recover, att.Checkpoint, att.From = &rr, rr.Checkpoint, rr.Turn
		if linkErr != nil {
			if err := relink(); err != nil {
				return spec, sb, err
			}
		}
		spec.Mode = AgentFresh
		spec.Transcript = strings.TrimSuffix(spec.Transcript, ".jsonl") + "-2.jsonl"
		return spec, sb, nil
	}
	return spec, sb, fmt.Errorf("unknown strategy %q", strategy)
}

// latestTurnCheckpoint returns the checkpoint holding the state the
// sandbox's latest ended turn left (the turn's own, or its head when it
// changed nothing), committed (pending ones waited for), and how many of the agent's turns it
// covers (its turn-ending LLM request's assistant messages).
func latestTurnCheckpoint(ctx context.Context, h *recHarness, sb string) (string, int, error) {
	c := h.d.c
	// A full checkpoint still being stored is waited for, as recover
	// does (one lost with a killed daemon never commits: 30 s at most).
	var cks []v1.Checkpoint
	for deadline := time.Now().Add(30 * time.Second); ; {
		var err error
		if cks, err = c.Checkpoints(ctx, sb); err != nil {
			return "", 0, err
		}
		if !slices.ContainsFunc(cks, func(ck v1.Checkpoint) bool { return ck.Pending }) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	turns, err := c.Turns(ctx, sb)
	if err != nil {
		return "", 0, fmt.Errorf("turn log: %w", err)
	}
	committed := map[string]bool{}
	for _, ck := range cks {
		if !ck.Pending {
			committed[ck.ID] = true
		}
	}
	for i := len(turns) - 1; i >= 0; i-- {
		tr := turns[i]
		if len(tr.LLM) == 0 {
			continue
		}
		ck := tr.Head
		if tr.Checkpoint != nil {
			ck = *tr.Checkpoint
		}
		if ck == "" || !committed[ck] {
			continue
		}
		return ck, strings.Count(tr.LLM[0].Request, `"role":"assistant"`), nil
	}
	return "", 0, errors.New("no committed turn checkpoint")
}
