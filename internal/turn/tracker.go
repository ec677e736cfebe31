package turn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/inspect"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/secret"
)

// Config is what a Tracker needs of the engine.
type Config struct {
	// DB holds the turn log (bucket meta.Turns).
	DB *meta.DB
	// Log gets what cannot be returned (a watch that cannot be set up,
	// a turn record that cannot be written).
	Log *slog.Logger
	// Tree lists the host PIDs of init's process tree: sandbox id's
	// cgroup members in init's PID namespace or one below it (not its
	// standbys, nor CRIU at work).
	Tree func(id string, init sandbox.Init) ([]int, error)
	// Cgroup returns the unified-hierarchy directory of sandbox id's
	// cgroup, which the inspector watches.
	Cgroup func(id string) (string, error)
	// Egress counts the effect ledger records of sandbox id's turn n
	// (nil: none are counted).
	Egress func(id string, n int) *meta.EgressCounts
	// RecordLimit bounds what sandbox id's turn log keeps of outputs and
	// LLM exchanges, in bytes (DefaultRecordLimit if nil or 0).
	RecordLimit func(id string) int64
	// Prev is the turn sandbox id's state continues when its turn state
	// is first made (the daemon started, the sandbox was created or
	// started), given its last logged turn (zero if none): nil, that
	// one.
	Prev func(id string, last meta.TurnRecord) int
}

// DefaultRecordLimit bounds a sandbox's recorded outputs and LLM
// exchanges unless its own limit says otherwise.
const DefaultRecordLimit int64 = 64 << 20

// Tracker keeps the turns of a Manager's sandboxes.
type Tracker struct {
	cfg       Config
	noInspect atomic.Bool                  // see SetInspector
	vault     atomic.Pointer[secret.Vault] // see SetVault

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // goroutines started by spawn

	mu sync.Mutex
	// +checklocks:mu
	m map[string]*state
	// +checklocks:mu
	closed bool
	// Fast-forwards under way, by sandbox.
	// +checklocks:mu
	ff map[string]*FastForward
	// Bytes each sandbox's turn log holds (counted on first use).
	// +checklocks:mu
	usage map[string]int64
}

// state is one sandbox's turn: the baseline its current turn is
// compared with, and what that turn did so far.
type state struct {
	mu       sync.Mutex
	watch    *inspect.Watch // nil when the inspector is unavailable
	tree     sandbox.Init   // the process tree the baseline describes
	n        int            // the current turn's number
	started  time.Time
	procs    map[int]procInfo
	sessions map[string]string
	carry    inspect.Effects // effects held over for the next turn
	force    []string        // reasons the next turn is full regardless
	ignore   []string        // +checklocks:mu

	// Under Tracker.mu: commands are recorded without waiting for a
	// turn end. ending counts turn ends in progress; endDone is closed
	// when it drops to zero. Commands wait for it (they belong to the
	// next turn). prev is the turn the current one continues.
	commands []meta.TurnCommand
	prev     int
	// unrecorded says why the current turn's record will be incomplete.
	unrecorded string
	ending     int
	endDone    chan struct{}
}

// New returns a Tracker with no sandbox.
func New(cfg Config) *Tracker {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Tracker{cfg: cfg, ctx: ctx, cancel: cancel, m: map[string]*state{}, ff: map[string]*FastForward{}, usage: map[string]int64{}}
}

// Close cancels the baselines and turn ends running in the background,
// waits for them, and closes every sandbox's inspector watch. The
// Tracker starts nothing afterwards.
func (t *Tracker) Close() {
	t.mu.Lock()
	t.closed = true
	ids := make([]string, 0, len(t.m))
	for id := range t.m {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	for _, id := range ids {
		t.Forget(id)
	}
}

var errClosed = fmt.Errorf("turns: closed: %w", errdefs.ErrUnavailable)

// spawn runs fn in a goroutine the Tracker owns, with its context; it
// reports false (and runs nothing) once the Tracker is closed.
func (t *Tracker) spawn(fn func(ctx context.Context)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		fn(t.ctx)
	}()
	return true
}

var shared struct {
	once sync.Once
	in   *inspect.Inspector
	err  error
}

// inspector returns the process-wide eBPF inspector, opened on first
// use; every Tracker of the process shares it.
func inspector() (*inspect.Inspector, error) {
	shared.once.Do(func() {
		shared.in, shared.err = inspect.Open(inspect.Options{})
	})
	return shared.in, shared.err
}

var errInspectorOff = errors.New("inspector turned off")

// SetInspector turns the inspector on or off for sandboxes whose turn
// state starts from now on (created, or first started); sandboxes
// watched already stay so. Off, their turns are always full, and while
// no sandbox is watched the inspector's programs are detached from the
// host's system calls: benchmarks use it to measure sandboxes without
// any of molt's cost.
func (t *Tracker) SetInspector(on bool) { t.noInspect.Store(!on) }

// InspectorStatus reports whether the inspector works here, and why not.
func InspectorStatus() (bool, string) {
	if _, err := inspector(); err != nil {
		return false, err.Error()
	}
	return true, ""
}

func (t *Tracker) of(id string) *state {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// Reset starts a fresh turn baseline for a sandbox whose process tree
// was (re)placed by molt: created, started, rolled back, resumed. The
// state now is a known one (an image, a checkpoint), so what came before
// does not count. Preconditions: the caller holds the sandbox lock; the
// tree runs.
func (t *Tracker) Reset(ctx context.Context, id string, init sandbox.Init) {
	t.Prepare(id, init).Baseline(ctx)
}

// Pending is a sandbox's turn state between Prepare and its baseline:
// held, so that turn ends, commands and LLM records of the sandbox wait.
// Exactly one of Baseline, BaselineAsync or Abandon ends it.
type Pending struct {
	t    *Tracker
	ts   *state
	id   string
	init sandbox.Init
}

// Prepare points the sandbox's inspector watch at the tree of init
// (which may still be stopped) and drops what the old tree did.
func (t *Tracker) Prepare(id string, init sandbox.Init) *Pending {
	return &Pending{t: t, ts: t.prepare(id, init), id: id, init: init}
}

// prepare is Prepare; it returns the state locked.
//
// The state's lock is handed between functions (prepare to Baseline or
// Abandon; Begin to Close), which the analyzer cannot follow.
//
// +checklocksignore
func (t *Tracker) prepare(id string, init sandbox.Init) *state {
	ts := t.of(id)
	if ts == nil {
		// The lookups read the database: not under t.mu.
		last := t.lastTurn(id)
		fresh := &state{n: last + 1, started: time.Now(), prev: last}
		if t.cfg.Prev != nil {
			var tr meta.TurnRecord
			if last != 0 {
				_ = t.cfg.DB.Get(meta.Turns, turnKey(id, last), &tr)
			}
			fresh.prev = t.cfg.Prev(id, tr)
		}
		t.mu.Lock()
		if ts = t.m[id]; ts == nil {
			ts = fresh
			t.m[id] = ts
		}
		t.mu.Unlock()
	}
	ts.mu.Lock()
	ts.tree = init
	ts.force = nil
	ts.carry = inspect.Effects{}
	t.watch(id, init, ts)
	if ts.watch != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := ts.watch.Cut(cctx); err != nil {
			ts.force = append(ts.force, "inspector: "+err.Error())
		}
		cancel()
	}
	return ts
}

// watch makes ts's inspector watch follow init's tree, or leaves it nil
// (the sandbox's turns are then full). Caller holds ts.mu.
func (t *Tracker) watch(id string, init sandbox.Init, ts *state) {
	in, err := inspector()
	if err == nil && ts.watch == nil && t.noInspect.Load() {
		err = errInspectorOff
	}
	switch {
	case err != nil:
	case ts.watch == nil:
		dir, cerr := t.cfg.Cgroup(id)
		if cerr == nil {
			ts.watch, cerr = in.Watch(dir, init.Pid)
		}
		if cerr != nil {
			t.cfg.Log.Warn("inspector cannot watch sandbox; its turns are full", "sandbox", id, "err", cerr)
		}
	default:
		if err := ts.watch.SetTree(init.Pid); err != nil {
			t.cfg.Log.Warn("inspector cannot follow the new tree", "sandbox", id, "err", err)
			ts.watch.Close()
			ts.watch = nil
		}
	}
}

// Baseline records the tree's processes and sessions as the state the
// next turn is compared with, and releases the state.
//
// +checklocksignore: lock hand-off (see prepare)
func (p *Pending) Baseline(ctx context.Context) {
	defer p.ts.mu.Unlock()
	p.t.baseline(ctx, p.id, p.init, p.ts)
}

// BaselineAsync takes the baseline in the background, off the
// rollback's critical path: the sandbox's next command and turn end wait
// for it (Gate, the state's lock).
//
// +checklocksignore: lock hand-off (see prepare)
func (p *Pending) BaselineAsync() {
	t := p.t
	t.beginEnd(p.ts)
	ok := t.spawn(func(ctx context.Context) {
		defer t.finishEnd(p.ts)
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p.Baseline(ctx)
	})
	if !ok {
		p.ts.force = append(p.ts.force, "no baseline: the daemon was closing")
		t.finishEnd(p.ts)
		p.ts.mu.Unlock()
	}
}

// Abandon releases the state without a baseline: the tree it was
// prepared for did not take over.
//
// +checklocksignore: lock hand-off (see prepare)
func (p *Pending) Abandon() { p.ts.mu.Unlock() }

// baseline is Baseline without the unlock. Caller holds ts.mu.
func (t *Tracker) baseline(ctx context.Context, id string, init sandbox.Init, ts *state) {
	sess, spids, err := sessionStates(ctx, init)
	if err != nil {
		ts.force = append(ts.force, "sessions unknown: "+err.Error())
	}
	// A tree that was just continued runs for a moment to restart its
	// interrupted system calls; a process still running after that is
	// recorded as running, which makes the next turn full.
	procs, err := t.settle(ctx, id, init, spids, 20*time.Millisecond)
	if err != nil {
		ts.force = append(ts.force, "processes unknown: "+err.Error())
	}
	ts.procs, ts.sessions, ts.started = procs, sess, time.Now()
	t.mu.Lock()
	ts.commands = nil
	t.mu.Unlock()
}

// Continue makes sandbox id's current turn continue turn prev: its
// state was replaced by the one prev ended in (a rollback, a recovery).
func (t *Tracker) Continue(id string, prev int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ts := t.m[id]; ts != nil {
		ts.prev = prev
	}
}

// Unrecorded notes that something of sandbox id's current turn could
// not be recorded (an LLM call whose turn end failed): its record will
// say so, and no recovery replays it.
func (t *Tracker) Unrecorded(id, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ts := t.m[id]; ts != nil && ts.unrecorded == "" {
		ts.unrecorded = why
	}
}

// Forget drops a sandbox's turn state (removed, stopped, hibernated)
// and its fast-forward.
func (t *Tracker) Forget(id string) {
	t.mu.Lock()
	ts := t.m[id]
	delete(t.m, id)
	delete(t.ff, id)
	delete(t.usage, id)
	t.mu.Unlock()
	if ts != nil {
		ts.mu.Lock()
		if ts.watch != nil {
			ts.watch.Close()
			ts.watch = nil
		}
		ts.mu.Unlock()
	}
}

// Force makes the sandbox's next turn full, for reason.
func (t *Tracker) Force(id, reason string) {
	if ts := t.of(id); ts != nil {
		ts.mu.Lock()
		ts.force = append(ts.force, reason)
		ts.mu.Unlock()
	}
}

// SetIgnore sets the sandbox's own ignore list for turn decisions.
func (t *Tracker) SetIgnore(id string, ignore []string) error {
	if err := ValidIgnore(ignore); err != nil {
		return err
	}
	ts := t.of(id)
	if ts == nil {
		return fmt.Errorf("sandbox %s has no turns (it is not running): %w", id, errdefs.ErrFailedPrecondition)
	}
	ts.mu.Lock()
	ts.ignore = append([]string(nil), ignore...)
	ts.mu.Unlock()
	return nil
}

// Gate waits while a turn end of the sandbox is capturing its
// checkpoint: a command sent meanwhile belongs to the next turn.
func (t *Tracker) Gate(ctx context.Context, id string) error {
	ts := t.of(id)
	if ts == nil {
		return nil
	}
	for {
		t.mu.Lock()
		n, done := ts.ending, ts.endDone
		t.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// beginEnd and finishEnd bracket a turn end for Gate.
func (t *Tracker) beginEnd(ts *state) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ts.ending == 0 {
		ts.endDone = make(chan struct{})
	}
	ts.ending++
}

func (t *Tracker) finishEnd(ts *state) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ts.ending--
	if ts.ending == 0 {
		close(ts.endDone)
	}
}

// Outcome is the result of an asynchronous turn end.
type Outcome struct {
	Result meta.TurnResult
	Err    error
}

// Async runs end, the engine's turn end of sandbox id, in the
// background with the Tracker's context. Commands of the sandbox sent
// after Async returns wait until end is done (id "": the sandbox is
// unknown, end reports that).
func (t *Tracker) Async(id string, end func(context.Context) (meta.TurnResult, error)) <-chan Outcome {
	out := make(chan Outcome, 1)
	ts := t.of(id)
	if ts != nil {
		t.beginEnd(ts)
	}
	ok := t.spawn(func(ctx context.Context) {
		res, err := end(ctx)
		if ts != nil {
			t.finishEnd(ts)
		}
		out <- Outcome{res, err}
	})
	if !ok {
		if ts != nil {
			t.finishEnd(ts)
		}
		out <- Outcome{Err: errClosed}
	}
	return out
}
