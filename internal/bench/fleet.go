// The fleet benchmark: many sandboxes on one host replaying recorded
// trajectories at once, their checkpoints uploaded to an object store,
// against the same sandboxes replaying without checkpoints.

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/objstore"
)

// FleetConfig configures the fleet benchmark.
type FleetConfig struct {
	Image        string
	Trajectories []Trajectory // slot k replays trajectory k mod len
	// Sizes are the numbers of sandboxes replaying at once, one run per
	// size and mode.
	Sizes      []int
	MaxTurns   int // per sandbox; 0: all
	Waits      WaitConfig
	CmdTimeout time.Duration
	Ignore     []string // for EndTurn
	// DrainTimeout bounds the wait, after a sandbox's last turn, for its
	// checkpoints to be in the store.
	DrainTimeout time.Duration
	CriuPath     string
	// Store reports the traffic of the daemon's object store so far;
	// StoreName names it.
	Store     func() objstore.Stats
	StoreName string
	Project   ProjectConfig
	Progress  io.Writer
}

// FleetRun is one size in one mode: every sandbox replays its
// trajectory at once, each in a fresh sandbox.
type FleetRun struct {
	Mode      string `json:"mode"`
	Sandboxes int    `json:"sandboxes"`
	Turns     int    `json:"turns"`
	// Checkpoints taken at the trajectories' turns (not the setups'),
	// of which Full full ones.
	Checkpoints int `json:"checkpoints"`
	Full        int `json:"full"`
	// Seconds: from the first setup to the last sandbox's last turn.
	// AgentSeconds: the sum of the sandboxes' agent-visible time (LLM
	// waits, commands, turn ends beyond their waits).
	Seconds      float64 `json:"seconds"`
	AgentSeconds float64 `json:"agent_seconds"`
	ExecSeconds  float64 `json:"exec_seconds"`
	WaitSeconds  float64 `json:"wait_seconds"`
	Overrun      float64 `json:"overrun_seconds"`
	Stall        Stats   `json:"stall"`
	TurnEnd      Stats   `json:"turn_end"`
	// CPUSeconds is the host's busy CPU time (all CPUs, every process:
	// sandboxes, daemon, CRIU, the store's server if local) from the
	// first setup until the last sandbox is drained.
	CPUSeconds   float64 `json:"cpu_seconds"`
	BytesWritten int64   `json:"bytes_written"`
	SetupBytes   int64   `json:"setup_bytes"`
	// Uploaded and StoreRequests: the store's traffic over the run,
	// drains included.
	Uploaded      int64 `json:"uploaded_bytes"`
	Fetched       int64 `json:"fetched_bytes"`
	StoreRequests int64 `json:"store_requests"`
	// DrainSeconds: from the last sandbox's last turn until every
	// checkpoint was in the store. Drain: per sandbox, from its last
	// turn until its checkpoints were in the store.
	DrainSeconds float64 `json:"drain_seconds"`
	Drain        Stats   `json:"drain"`
	// NotInStore: checkpoints still not in the store at DrainTimeout.
	NotInStore int `json:"not_in_store"`
	Errors     int `json:"errors"`
	EndErrors  int `json:"end_errors"`
	Lost       int `json:"lost_checkpoints"`
}

// FleetSize compares one size's auto run with its none run.
type FleetSize struct {
	Sandboxes int `json:"sandboxes"`
	// Overhead = (agent seconds auto - none) / none.
	Overhead float64 `json:"overhead"`
	// Per turn of the auto run: molt's CPU (the host's busy time, auto
	// minus none), bytes written, uploaded and store requests.
	CPUPerTurnMS    float64 `json:"cpu_per_turn_ms"`
	WrittenPerTurn  float64 `json:"written_per_turn_bytes"`
	UploadedPerTurn float64 `json:"uploaded_per_turn_bytes"`
	RequestsPerTurn float64 `json:"requests_per_turn"`
	// Rates over the auto run, drain included.
	StoreRPS   float64 `json:"store_requests_per_second"`
	UploadMBps float64 `json:"upload_mb_per_second"`
	TurnsPerS  float64 `json:"turns_per_second"`
}

// FleetResult is the outcome of RunFleet.
type FleetResult struct {
	Host         HostFacts      `json:"host"`
	Store        string         `json:"store"`
	Trajectories int            `json:"trajectories"`
	PerAgent     map[string]int `json:"per_agent"`
	MaxTurns     int            `json:"max_turns"`
	LLMScale     float64        `json:"llm_scale"`
	// Warmup is one sandbox's first turn, which puts the image's files
	// in the store; it is not in Runs.
	Warmup     FleetRun    `json:"warmup"`
	Runs       []FleetRun  `json:"runs"`
	Sizes      []FleetSize `json:"sizes"`
	Projection Projection  `json:"projection"`
	Seconds    float64     `json:"seconds"`
}

// RunFleet replays, for each size, that many sandboxes at once in mode
// none and in mode auto (the order alternating between sizes), on the
// daemon e, whose checkpoints go to the store cfg.Store reports on.
func RunFleet(ctx context.Context, e *daemon.Ephemeral, cfg FleetConfig) (FleetResult, error) {
	began := time.Now()
	progress := progressf(cfg.Progress)
	res := FleetResult{Host: GatherHost(ctx, e.Client, cfg.CriuPath), Store: cfg.StoreName,
		Trajectories: len(cfg.Trajectories), PerAgent: map[string]int{}, MaxTurns: cfg.MaxTurns, LLMScale: cfg.Waits.Scale}
	if len(cfg.Trajectories) == 0 || len(cfg.Sizes) == 0 || cfg.Store == nil {
		return res, errors.New("fleet: no trajectories, sizes or store")
	}
	for _, t := range cfg.Trajectories {
		res.PerAgent[t.Agent]++
	}
	w := &sharedWaits{waits: make([][]time.Duration, len(cfg.Trajectories))}
	// A fleet's store holds its images' files already: one sandbox
	// uploads the image's tree before the runs that count.
	warm := cfg
	warm.MaxTurns = 1
	wr, err := runFleet(ctx, e, warm, 1, ModeAuto, &sharedWaits{waits: make([][]time.Duration, len(cfg.Trajectories))}, progress)
	if err != nil {
		return res, fmt.Errorf("fleet: warming the store: %w", err)
	}
	res.Warmup = wr
	for i, n := range cfg.Sizes {
		runs := map[string]FleetRun{}
		for _, mode := range RotateModes([]string{ModeNone, ModeAuto}, i) {
			run, err := runFleet(ctx, e, cfg, n, mode, w, progress)
			if err != nil {
				return res, fmt.Errorf("fleet: %d sandboxes, %s: %w", n, mode, err)
			}
			runs[mode] = run
			res.Runs = append(res.Runs, run)
		}
		res.Sizes = append(res.Sizes, compareFleet(runs[ModeNone], runs[ModeAuto]))
	}
	res.Projection = project(cfg.Project, res, w.all(), cfg.Waits.Scale)
	res.Seconds = time.Since(began).Seconds()
	return res, nil
}

// sharedWaits are the LLM waits of each trajectory, fixed by its first
// replay and reused by every later one, whatever its mode.
type sharedWaits struct {
	mu sync.Mutex
	// +checklocks:mu
	waits [][]time.Duration
}

func (w *sharedWaits) get(j int) []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waits[j]
}

func (w *sharedWaits) set(j int, d []time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waits[j] == nil {
		w.waits[j] = d
	}
}

func (w *sharedWaits) all() [][]time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([][]time.Duration(nil), w.waits...)
}

// runFleet replays n sandboxes at once in mode.
func runFleet(ctx context.Context, e *daemon.Ephemeral, cfg FleetConfig, n int, mode string, w *sharedWaits, progress func(string, ...any)) (FleetRun, error) {
	run := FleetRun{Mode: mode, Sandboxes: n}
	progress("fleet: %d sandboxes in mode %s", n, mode)
	// Mode none is a sandbox without any of molt's cost: not watched.
	e.Manager.SetInspector(mode != ModeNone)
	defer e.Manager.SetInspector(true)
	tcfg := TurnsConfig{Image: cfg.Image, Waits: cfg.Waits, CmdTimeout: cfg.CmdTimeout, Ignore: cfg.Ignore}
	runs := make([]TurnsRun, n)
	errs := make([]error, n)
	ended := make([]time.Time, n)   // the last turn
	drained := make([]time.Time, n) // every checkpoint in the store
	notIn := make([]int, n)
	st0, cpu0 := cfg.Store(), hostCPUSeconds()
	t0 := time.Now()
	var wg sync.WaitGroup
	for k := range n {
		wg.Go(func() {
			j := k % len(cfg.Trajectories)
			r := &replayer{c: e.Client, cfg: tcfg}
			r.beforeRemove = func(ctx context.Context, tr *TurnsRun) {
				ended[k] = time.Now()
				if mode != ModeNone {
					notIn[k], errs[k] = waitInStore(ctx, e.Client, tr.Sandbox, cfg.DrainTimeout)
				}
				drained[k] = time.Now()
			}
			var err error
			runs[k], err = r.replay(ctx, cfg.Trajectories[j], mode, cfg.MaxTurns, w.get(j))
			errs[k] = errors.Join(err, errs[k])
			if err == nil {
				w.set(j, runs[k].waits)
			}
		})
	}
	wg.Wait()
	st1, cpu1 := cfg.Store(), hostCPUSeconds()
	if err := errors.Join(errs...); err != nil {
		return run, err
	}
	var last, lastDrained time.Time
	var stall, end, drain Sample
	for k, tr := range runs {
		last, lastDrained = latest(last, ended[k]), latest(lastDrained, drained[k])
		drain = append(drain, drained[k].Sub(ended[k]))
		run.Turns += tr.Turns
		run.AgentSeconds += tr.Seconds
		run.ExecSeconds += tr.ExecSeconds
		run.WaitSeconds += tr.WaitSeconds
		run.Overrun += tr.OverrunSeconds
		run.BytesWritten += tr.BytesWritten
		run.SetupBytes += tr.SetupBytes
		run.Errors += tr.Errors
		run.EndErrors += tr.EndErrors
		run.Lost += tr.Lost
		run.NotInStore += notIn[k]
		for _, o := range tr.turns {
			if o.err != nil {
				continue
			}
			end = append(end, o.d)
			if o.res.Checkpoint == nil {
				continue
			}
			run.Checkpoints++
			stall = append(stall, msDur(o.res.StallMS))
			if o.res.Decision == v1.DecisionFull {
				run.Full++
			}
		}
	}
	run.Seconds = last.Sub(t0).Seconds()
	run.DrainSeconds = lastDrained.Sub(last).Seconds()
	run.Stall, run.TurnEnd = stall.Stats(), end.Stats()
	if mode != ModeNone {
		run.Drain = drain.Stats()
	}
	run.CPUSeconds = cpu1 - cpu0
	run.Uploaded, run.Fetched, run.StoreRequests = st1.Sent-st0.Sent, st1.Received-st0.Received, st1.Requests-st0.Requests
	progress("fleet: %d sandboxes, %s: %d turns in %.1f s, %d checkpoints, stall p50 %.1f ms %s, %.1f MiB uploaded in %d requests, drained %.1f s later",
		n, mode, run.Turns, run.Seconds, run.Checkpoints, run.Stall.P50, run.Stall.TailString(), float64(run.Uploaded)/(1<<20), run.StoreRequests, run.DrainSeconds)
	return run, nil
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// waitInStore waits until every committed checkpoint of sb is in the
// store, at most timeout; it returns how many were not.
func waitInStore(ctx context.Context, c *client.Client, sb string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		cks, err := c.Checkpoints(ctx, sb)
		if err != nil {
			return 0, err
		}
		out := 0
		for _, ck := range cks {
			if !ck.Pending && !ck.InStore {
				out++
			}
		}
		if out == 0 || time.Now().After(deadline) {
			return out, nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return out, err
		}
	}
}

// compareFleet sets a size's auto run against its none run.
func compareFleet(none, auto FleetRun) FleetSize {
	s := FleetSize{Sandboxes: auto.Sandboxes}
	if none.AgentSeconds > 0 {
		s.Overhead = (auto.AgentSeconds - none.AgentSeconds) / none.AgentSeconds
	}
	if auto.Turns > 0 {
		t := float64(auto.Turns)
		s.CPUPerTurnMS = max(0, auto.CPUSeconds-none.CPUSeconds) * 1000 / t
		s.WrittenPerTurn = float64(auto.BytesWritten) / t
		s.UploadedPerTurn = float64(auto.Uploaded) / t
		s.RequestsPerTurn = float64(auto.StoreRequests) / t
	}
	if d := auto.Seconds + auto.DrainSeconds; d > 0 {
		s.StoreRPS = float64(auto.StoreRequests) / d
		s.UploadMBps = float64(auto.Uploaded) / 1e6 / d
	}
	if auto.Seconds > 0 {
		s.TurnsPerS = float64(auto.Turns) / auto.Seconds
	}
	return s
}

// hostCPUSeconds is the busy time of every CPU of the host so far
// (/proc/stat: all but idle and iowait), or 0 if unreadable.
func hostCPUSeconds() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	return parseCPUBusy(string(b))
}

// parseCPUBusy reads the "cpu" line of /proc/stat, in USER_HZ (100 per
// second on Linux).
func parseCPUBusy(stat string) float64 {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy float64
	for i, s := range f[1:] {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0
		}
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is counted in user already.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += v
	}
	return busy / 100
}
