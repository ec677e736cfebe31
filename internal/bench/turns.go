package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
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

// Replay modes.
const (
	ModeNone = "none"
	ModeAuto = "auto"
	ModeFull = "full"
)

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
