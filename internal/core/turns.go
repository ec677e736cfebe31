package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/inspect"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sbinit"
	"github.com/molt-sh/molt/internal/store"
	"golang.org/x/sys/unix"
)

// Turns. A turn is what an agent did between two of its LLM calls. At a
// turn's end molt decides from what the turn did to the OS which
// checkpoint it needs (none, fs or full) and takes it. The evidence:
//
//   - files: the eBPF inspector's record of every file the sandbox's
//     processes created, wrote, truncated, renamed, deleted or changed
//     the metadata of;
//   - long-lived processes (alive at the turn's start or end, other than
//     init and sessions): started, exited, or ran at all. A process that
//     was not scheduled during the turn cannot have changed; one that was
//     may have (CPU time and timeslices from /proc, per thread, plus
//     "runnable now");
//   - sessions: init keeps a digest of each session's shell state after
//     every call (variables, functions, aliases, options, cwd, umask,
//     traps, directory stack); a changed digest, a new or a closed session
//     is a process change.
//
// The baseline a turn is compared with is the state its previous turn
// ended in: the previous checkpoint's consistent instant. Events between
// the collection and the checkpoint's freeze are in the checkpoint, so
// inside the frozen window the inspector is cut again and those events
// dropped (for an fs checkpoint only the file events: a process change
// there is not in an fs checkpoint, so it stays for the next turn).
// Whenever something cannot be known (the inspector is missing, events
// were lost, a ptrace write, a mount, io_uring), the decision is full:
// the inspector may over-checkpoint, it never says none when state
// changed.

type procRole int

const (
	roleOther procRole = iota
	roleInit
	roleSession
)

// procInfo is what the turn baseline keeps of a process.
type procInfo struct {
	start   uint64 // start time in clock ticks: tells a reused PID apart
	comm    string
	cpu     uint64 // nanoseconds on CPU, all threads
	slices  uint64 // timeslices run, all threads
	vol     uint64 // voluntary context switches (blocking), all threads
	running bool   // a thread is runnable
	role    procRole
	// pos is where each thread is in user space (stack and instruction
	// pointers from /proc/PID/task/TID/syscall): after a freeze and thaw
	// a task that only restarted its interrupted system call is back
	// where it was.
	pos string
}

type turnState struct {
	mu       sync.Mutex
	watch    *inspect.Watch // nil when the inspector is unavailable
	tree     sandbox.Init   // the process tree the baseline describes
	n        int            // the current turn's number
	started  time.Time
	procs    map[int]procInfo
	sessions map[string]string
	carry    inspect.Effects // effects held over for the next turn
	force    []string        // reasons the next turn is full regardless
	commands []v1.TurnCommand
	ignore   []string
	// ending counts turn ends in progress; endDone is closed when it
	// drops to zero. Commands wait for it (they belong to the next turn).
	// Both under turnTable.mu.
	ending  int
	endDone chan struct{}
}

type turnTable struct {
	mu sync.Mutex
	m  map[string]*turnState
}

var shared struct {
	once sync.Once
	in   *inspect.Inspector
	err  error
}

// inspector returns the process-wide eBPF inspector, opened on first
// use; every Manager of the process shares it.
func inspector() (*inspect.Inspector, error) {
	shared.once.Do(func() {
		shared.in, shared.err = inspect.Open(inspect.Options{})
	})
	return shared.in, shared.err
}

var errInspectorOff = errors.New("inspector turned off")

// SetInspector turns the inspector on or off for sandboxes whose turn
// state starts from now on (created, or first started, by this
// Manager); sandboxes watched already stay so. Off, their turns are
// always full, and while no sandbox is watched the inspector's programs
// are detached from the host's system calls: benchmarks use it to
// measure sandboxes without any of molt's cost.
func (m *Manager) SetInspector(on bool) { m.noInspect.Store(!on) }

// InspectorStatus reports whether the inspector works here, and why not.
func InspectorStatus() (bool, string) {
	if _, err := inspector(); err != nil {
		return false, err.Error()
	}
	return true, ""
}

func (m *Manager) turnOf(id string) *turnState {
	m.turns.mu.Lock()
	defer m.turns.mu.Unlock()
	return m.turns.m[id]
}

// turnReset starts a fresh turn baseline for a sandbox whose process tree
// was (re)placed by molt: created, started, rolled back, resumed. The
// state now is a known one (an image, a checkpoint), so what came before
// does not count. Caller holds the sandbox lock; the tree runs.
func (m *Manager) turnReset(ctx context.Context, rec sandboxRec) {
	m.turnBaseline(ctx, rec, m.turnPrepare(rec, rec.Init))
}

// turnPrepare points the sandbox's inspector watch at the tree of init
// (which may still be stopped) and drops what the old tree did. It
// returns the sandbox's turn state, locked; turnBaseline unlocks it.
func (m *Manager) turnPrepare(rec sandboxRec, init sandbox.Init) *turnState {
	m.turns.mu.Lock()
	if m.turns.m == nil {
		m.turns.m = map[string]*turnState{}
	}
	ts := m.turns.m[rec.ID]
	if ts == nil {
		ts = &turnState{n: m.lastTurn(rec.ID) + 1, started: time.Now()}
		m.turns.m[rec.ID] = ts
	}
	m.turns.mu.Unlock()
	ts.mu.Lock()
	ts.tree = init
	ts.force = nil
	ts.carry = inspect.Effects{}
	in, err := inspector()
	if err == nil && ts.watch == nil && m.noInspect.Load() {
		err = errInspectorOff
	}
	switch {
	case err != nil:
	case ts.watch == nil:
		cg, cerr := cgroup.Load(cgroupName(rec.ID))
		if cerr == nil {
			ts.watch, cerr = in.Watch(cg.UnifiedDir(), init.Pid)
		}
		if cerr != nil {
			m.log.Warn("inspector cannot watch sandbox; its turns are full", "sandbox", rec.ID, "err", cerr)
		}
	default:
		if err := ts.watch.SetTree(init.Pid); err != nil {
			m.log.Warn("inspector cannot follow the new tree", "sandbox", rec.ID, "err", err)
			ts.watch.Close()
			ts.watch = nil
		}
	}
	if ts.watch != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := ts.watch.Cut(cctx); err != nil {
			ts.force = append(ts.force, "inspector: "+err.Error())
		}
		cancel()
	}
	return ts
}

// settleLimit bounds how long a baseline waits for a tree that was just
// continued to go back to sleep.
const settleLimit = 250 * time.Millisecond

// turnBaseline records the tree's processes and sessions as the state the
// next turn is compared with, and unlocks ts.
func (m *Manager) turnBaseline(ctx context.Context, rec sandboxRec, ts *turnState) {
	defer ts.mu.Unlock()
	sess, spids, err := m.sessionStates(ctx, rec)
	if err != nil {
		ts.force = append(ts.force, "sessions unknown: "+err.Error())
	}
	// A tree that was just continued runs for a moment to restart its
	// interrupted system calls; a process still running after that is
	// recorded as running, which makes the next turn full.
	procs, err := settle(ctx, rec, spids, 20*time.Millisecond)
	if err != nil {
		ts.force = append(ts.force, "processes unknown: "+err.Error())
	}
	ts.procs, ts.sessions, ts.started = procs, sess, time.Now()
	m.turns.mu.Lock()
	ts.commands = nil
	m.turns.mu.Unlock()
}

// settle lists the live tree's processes once none of its long-lived
// ones runs, or when limit has passed.
func settle(ctx context.Context, rec sandboxRec, sessionPids map[int]bool, limit time.Duration) (map[int]procInfo, error) {
	deadline := time.Now().Add(limit)
	for {
		procs, err := liveProcs(rec, sessionPids)
		if err != nil {
			return procs, err
		}
		busy := false
		for _, p := range procs {
			busy = busy || (p.running && p.role == roleOther)
		}
		if !busy || time.Now().After(deadline) || ctx.Err() != nil {
			return procs, nil
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// settled returns the baseline of a tree just thawed after a checkpoint.
// A freeze interrupts every blocked system call; after the thaw each
// task runs to restart it, which moves its scheduling counters although
// nothing changed. So the baseline is taken once the tree is asleep
// again, and a process that is not back where the freeze found it (its
// threads' user stack and instruction pointers) or that still runs makes
// the next turn full. Caller holds ts.mu.
func (m *Manager) settled(ctx context.Context, rec sandboxRec, sessionPids map[int]bool, frozen map[int]procInfo, ts *turnState) map[int]procInfo {
	procs, err := settle(ctx, rec, sessionPids, settleLimit)
	if err != nil {
		ts.force = append(ts.force, "processes unknown after the checkpoint: "+err.Error())
		return procs
	}
	for pid, p := range procs {
		if p.role != roleOther {
			continue
		}
		f, ok := frozen[pid]
		switch {
		case frozen == nil:
			ts.force = append(ts.force, "no frozen view of the checkpoint's processes")
			return procs
		case !ok || f.start != p.start:
			ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) started right after the checkpoint", p.comm, pid))
		case p.running:
			ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) still runs after the checkpoint", p.comm, pid))
		case !samePos(f.pos, p.pos):
			ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) ran right after the checkpoint", p.comm, pid))
		}
	}
	return procs
}

// samePos reports whether every thread of a process is where it was: same
// stack pointer, and the same instruction pointer or 2 bytes on (a
// system call restarted after a freeze re-executes its 2-byte syscall
// instruction, which the freeze had rewound the pointer to).
func samePos(frozen, now string) bool {
	a, b := strings.Fields(frozen), strings.Fields(now)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] == b[i] {
			continue
		}
		ta, pa, ok1 := strings.Cut(a[i], ",")
		tb, pb, ok2 := strings.Cut(b[i], ",")
		if !ok1 || !ok2 || ta != tb { // tid:sp differ
			return false
		}
		x, err1 := strconv.ParseUint(strings.TrimPrefix(pa, "0x"), 16, 64)
		y, err2 := strconv.ParseUint(strings.TrimPrefix(pb, "0x"), 16, 64)
		if err1 != nil || err2 != nil || y-x != 2 {
			return false
		}
	}
	return true
}

// turnBaselineAsync takes the baseline in the background, off the
// rollback's critical path: the sandbox's next command and turn end wait
// for it (turnGate, ts.mu). Caller holds ts.mu, which this releases.
func (m *Manager) turnBaselineAsync(rec sandboxRec, ts *turnState) {
	m.beginEnd(ts)
	go func() {
		defer m.finishEnd(ts)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.turnBaseline(ctx, rec, ts)
	}()
}

// turnForget drops a sandbox's turn state (removed, stopped, hibernated).
func (m *Manager) turnForget(id string) {
	m.turns.mu.Lock()
	ts := m.turns.m[id]
	delete(m.turns.m, id)
	m.turns.mu.Unlock()
	if ts != nil {
		ts.mu.Lock()
		if ts.watch != nil {
			ts.watch.Close()
			ts.watch = nil
		}
		ts.mu.Unlock()
	}
}

// turnForce makes the sandbox's next turn full, for reason.
func (m *Manager) turnForce(id, reason string) {
	if ts := m.turnOf(id); ts != nil {
		ts.mu.Lock()
		ts.force = append(ts.force, reason)
		ts.mu.Unlock()
	}
}

// turnGate waits while a turn end of the sandbox is capturing its
// checkpoint: a command sent meanwhile belongs to the next turn.
func (m *Manager) turnGate(ctx context.Context, id string) error {
	ts := m.turnOf(id)
	if ts == nil {
		return nil
	}
	for {
		m.turns.mu.Lock()
		n, done := ts.ending, ts.endDone
		m.turns.mu.Unlock()
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

// beginEnd and finishEnd bracket a turn end for turnGate.
func (m *Manager) beginEnd(ts *turnState) {
	m.turns.mu.Lock()
	defer m.turns.mu.Unlock()
	if ts.ending == 0 {
		ts.endDone = make(chan struct{})
	}
	ts.ending++
}

func (m *Manager) finishEnd(ts *turnState) {
	m.turns.mu.Lock()
	defer m.turns.mu.Unlock()
	ts.ending--
	if ts.ending == 0 {
		close(ts.endDone)
	}
}

// TurnOutcome is the result of an asynchronous turn end.
type TurnOutcome struct {
	Result v1.TurnResult
	Err    error
}

// EndTurnAsync ends the sandbox's turn in the background. Commands sent
// after it returns wait until the turn's checkpoint is captured.
func (m *Manager) EndTurnAsync(ref string, req v1.TurnRequest) <-chan TurnOutcome {
	out := make(chan TurnOutcome, 1)
	var ts *turnState
	if rec, err := m.lookupSandbox(ref); err == nil {
		if ts = m.turnOf(rec.ID); ts != nil {
			m.beginEnd(ts)
		}
	}
	go func() {
		res, err := m.EndTurn(context.Background(), ref, req)
		if ts != nil {
			m.finishEnd(ts)
		}
		out <- TurnOutcome{res, err}
	}()
	return out
}

// recordCommand appends a command to the sandbox's current turn.
func (m *Manager) recordCommand(id string, c v1.TurnCommand) {
	ts := m.turnOf(id)
	if ts == nil {
		return
	}
	const keep = 64 << 10
	if len(c.Stdout) > keep {
		c.Stdout, c.Truncated = c.Stdout[:keep], true
	}
	if len(c.Stderr) > keep {
		c.Stderr, c.Truncated = c.Stderr[:keep], true
	}
	m.turns.mu.Lock()
	ts.commands = append(ts.commands, c)
	m.turns.mu.Unlock()
}

// EndTurn ends the sandbox's current turn: it collects what the turn
// did, decides none, fs or full, takes that checkpoint and starts the
// next turn. A full checkpoint is returned pending (stored in the
// background), as Checkpoint does.
func (m *Manager) EndTurn(ctx context.Context, ref string, req v1.TurnRequest) (v1.TurnResult, error) {
	began := time.Now()
	if req.Label != "" {
		if err := validName("checkpoint label", req.Label); err != nil {
			return v1.TurnResult{}, err
		}
	}
	for _, p := range req.Ignore {
		if err := validIgnore(p); err != nil {
			return v1.TurnResult{}, err
		}
	}
	if r, err := m.lookupSandbox(ref); err == nil {
		if err := m.persistRoom(ctx, r.ID); err != nil {
			return v1.TurnResult{}, err
		}
	}
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return v1.TurnResult{}, err
	}
	defer unlock()
	defer m.foreground(rec.ID)()
	if st := m.report(rec).State; st != v1.StateRunning {
		return v1.TurnResult{}, fmt.Errorf("turn: sandbox %s is %s; turns are those of a running sandbox: %w", rec.ID, st, errdefs.ErrFailedPrecondition)
	}
	ts := m.turnOf(rec.ID)
	if ts == nil {
		// No baseline (the daemon restarted since the sandbox started):
		// this turn cannot be judged; it is full and sets one.
		ts = m.turnPrepare(rec, rec.Init)
		ts.force = append(ts.force, "no baseline for this sandbox's turn (the daemon started after it)")
		ts.mu.Unlock()
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if !req.DryRun {
		m.beginEnd(ts)
		defer m.finishEnd(ts)
	}

	obs := m.observe(ctx, rec, ts)
	res := v1.TurnResult{Sandbox: rec.ID, Turn: ts.n, Head: rec.Head}
	res.Decision, res.Reasons, res.Effects = decide(obs, append(append([]string(nil), ts.ignore...), req.Ignore...))
	res.DecideMS = ms(time.Since(began))
	m.metrics.decisions.WithLabelValues(res.Decision).Inc()
	m.metrics.turnDecide.Observe(time.Since(began).Seconds())
	if req.DryRun {
		// Nothing ends: what was collected counts for this turn still.
		ts.carry = obs.effects
		ts.force = obs.force
		res.DurationMS = ms(time.Since(began))
		return res, nil
	}

	var frozenEffects inspect.Effects
	var frozenProcs map[int]procInfo
	frozen := func() {
		if ts.watch != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			e, err := ts.watch.Cut(cctx)
			cancel()
			if err != nil {
				e.Unknown = append(e.Unknown, "inspector: "+err.Error())
			}
			frozenEffects = e
		}
		// After a CRIU dump the tasks CRIU let go re-enter the freezer
		// on their own: wait (briefly; only a loaded host takes long)
		// until none is runnable, so their positions are the frozen ones.
		frozenProcs, _ = settle(ctx, rec, obs.sessionPids, 100*time.Millisecond)
	}
	var ck v1.Checkpoint
	if res.Decision != v1.DecisionNone {
		slot, serr := m.captureSlot(ctx)
		if serr != nil {
			ts.carry, ts.force = obs.effects, obs.force
			return v1.TurnResult{}, serr
		}
		defer slot()
	}
	switch res.Decision {
	case v1.DecisionFS:
		ck, err = m.checkpointLocked(ctx, rec, ckOpts{label: req.Label, frozen: frozen})
	case v1.DecisionFull:
		ck, err = m.fullCheckpointLocked(ctx, rec, ckOpts{label: req.Label, frozen: frozen})
	}
	if err != nil {
		// The turn does not end: what it did stays for the next try,
		// which needs at least what this one needed.
		// (Full is more than a failed fs turn needs, but always right.)
		ts.carry = mergeEffects(obs.effects, frozenEffects)
		ts.force = append(obs.force, fmt.Sprintf("the %s checkpoint of turn %d failed: %v", res.Decision, ts.n, err))
		m.metrics.checkpoint.WithLabelValues(res.Decision, "failed").Inc()
		return v1.TurnResult{}, fmt.Errorf("turn %d of %s: %s checkpoint: %w", ts.n, rec.ID, res.Decision, err)
	}
	if res.Decision != v1.DecisionNone {
		m.metrics.checkpointed(ck, time.Since(began))
		id := ck.ID
		res.Checkpoint, res.Head, res.StallMS, res.Pending = &id, ck.ID, ck.StallMS, ck.Pending
	}
	// The next turn starts from this one's end state.
	ts.force = nil
	ts.carry = inspect.Effects{}
	switch res.Decision {
	case v1.DecisionNone:
		ts.procs = obs.procs
	case v1.DecisionFS:
		// Files between the collection and the freeze are in the
		// snapshot; anything else is not, and stays.
		frozenEffects.Files = nil
		ts.carry = frozenEffects
		// A long-lived process that ran between the collection and the
		// freeze changed after the decision: the fs checkpoint does not
		// hold that. The freeze itself wakes each blocked task, which
		// blocks again once in the freezer (one voluntary switch; being
		// preempted on the way, under load, is not a change) and is
		// rewound to its system call. Anything more is the task at work.
		for pid, f := range frozenProcs {
			if c, ok := obs.procs[pid]; f.role == roleOther && (!ok || c.start != f.start || f.vol > c.vol+uint64(strings.Count(f.pos, ":")) || !samePos(f.pos, c.pos)) {
				ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) ran between turn %d's end and its fs checkpoint", f.comm, pid, ts.n))
			}
		}
		ts.procs = m.settled(ctx, rec, obs.sessionPids, frozenProcs, ts)
	case v1.DecisionFull:
		ts.procs = m.settled(ctx, rec, obs.sessionPids, frozenProcs, ts)
	}
	ts.sessions = obs.sessions
	ts.tree = rec.Init

	res.DurationMS = ms(time.Since(began))
	m.turns.mu.Lock()
	cmds := ts.commands
	ts.commands = nil
	m.turns.mu.Unlock()
	tr := v1.TurnRecord{TurnResult: res, Started: ts.started, Ended: time.Now().UTC(), Commands: cmds}
	if err := m.db.Put(store.Turns, turnKey(rec.ID, ts.n), tr); err != nil {
		m.log.Warn("turn not recorded", "sandbox", rec.ID, "turn", ts.n, "err", err)
	}
	ts.n++
	ts.started = time.Now()
	return res, nil
}

// SetTurnIgnore sets the sandbox's own ignore list for turn decisions.
func (m *Manager) SetTurnIgnore(ref string, ignore []string) error {
	for _, p := range ignore {
		if err := validIgnore(p); err != nil {
			return err
		}
	}
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return err
	}
	ts := m.turnOf(rec.ID)
	if ts == nil {
		return fmt.Errorf("sandbox %s has no turns (it is not running): %w", rec.ID, errdefs.ErrFailedPrecondition)
	}
	ts.mu.Lock()
	ts.ignore = append([]string(nil), ignore...)
	ts.mu.Unlock()
	return nil
}

// RecordLLM attaches an LLM call to the record of the turn it ended.
func (m *Manager) RecordLLM(id string, turn int, c v1.LLMCall) error {
	if ts := m.turnOf(id); ts != nil {
		// Waits for a turn end in progress to have written its record.
		ts.mu.Lock()
		defer ts.mu.Unlock()
	}
	return m.db.Update(func(tx *store.Tx) error {
		var tr v1.TurnRecord
		if err := tx.Get(store.Turns, turnKey(id, turn), &tr); err != nil {
			return err
		}
		tr.LLM = append(tr.LLM, c)
		return tx.Put(store.Turns, turnKey(id, turn), tr)
	})
}

// Turns lists a sandbox's turn log, oldest first.
func (m *Manager) Turns(ref string) ([]v1.TurnRecord, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return nil, err
	}
	var out []v1.TurnRecord
	err = m.db.ForEachPrefix(store.Turns, rec.ID+"/", func(_ string, b []byte) error {
		var tr v1.TurnRecord
		if err := store.Unmarshal(b, &tr); err != nil {
			return err
		}
		out = append(out, tr)
		return nil
	})
	return out, err
}

func turnKey(id string, n int) string { return fmt.Sprintf("%s/%09d", id, n) }

func (m *Manager) lastTurn(id string) int {
	last := 0
	_ = m.db.ForEachPrefix(store.Turns, id+"/", func(k string, _ []byte) error {
		if n, err := strconv.Atoi(strings.TrimPrefix(k, id+"/")); err == nil && n > last {
			last = n
		}
		return nil
	})
	return last
}

// observation is what a turn did, before the decision.
type observation struct {
	effects     inspect.Effects
	force       []string
	procs       map[int]procInfo
	sessions    map[string]string
	sessionPids map[int]bool
	longLived   []v1.LongLivedChange
	sessChanges []v1.SessionChange
}

// observe collects what the current turn did. Caller holds ts.mu.
func (m *Manager) observe(ctx context.Context, rec sandboxRec, ts *turnState) observation {
	obs := observation{force: append([]string(nil), ts.force...)}
	obs.effects = ts.carry
	if ts.watch == nil {
		_, why := InspectorStatus()
		if why == "" {
			why = "no watch on this sandbox"
		}
		obs.force = append(obs.force, "inspector unavailable ("+why+"): files and processes may have changed")
	} else {
		e, err := ts.watch.Cut(ctx)
		if err != nil {
			obs.force = append(obs.force, "inspector: "+err.Error())
		}
		obs.effects = mergeEffects(obs.effects, e)
	}
	if ts.tree.Pid != rec.Init.Pid || ts.tree.Start != rec.Init.Start {
		obs.force = append(obs.force, "the process tree was replaced since the turn began")
	}
	sess, spids, err := m.sessionStates(ctx, rec)
	if err != nil {
		obs.force = append(obs.force, "sessions unknown: "+err.Error())
	}
	obs.sessions, obs.sessionPids = sess, spids
	for name, d := range sess {
		prev, ok := ts.sessions[name]
		switch {
		case !ok:
			obs.sessChanges = append(obs.sessChanges, v1.SessionChange{Name: name, Change: "created"})
		case prev != d:
			obs.sessChanges = append(obs.sessChanges, v1.SessionChange{Name: name, Change: "changed"})
		}
	}
	for name := range ts.sessions {
		if _, ok := sess[name]; !ok {
			obs.sessChanges = append(obs.sessChanges, v1.SessionChange{Name: name, Change: "closed"})
		}
	}
	sort.Slice(obs.sessChanges, func(i, j int) bool { return obs.sessChanges[i].Name < obs.sessChanges[j].Name })

	procs, err := liveProcs(rec, spids)
	if err != nil {
		obs.force = append(obs.force, "processes unknown: "+err.Error())
	}
	obs.procs = procs
	for pid, p := range procs {
		if p.role != roleOther {
			continue
		}
		prev, ok := ts.procs[pid]
		switch {
		case !ok || prev.start != p.start:
			obs.longLived = append(obs.longLived, v1.LongLivedChange{Pid: pid, Comm: p.comm, Change: "started"})
		case prev.role != roleOther:
			// A session's shell no longer a session (closed): counted
			// as a session change.
		case p.cpu != prev.cpu || p.slices != prev.slices || p.running:
			obs.longLived = append(obs.longLived, v1.LongLivedChange{Pid: pid, Comm: p.comm, Change: "ran"})
		}
	}
	for pid, prev := range ts.procs {
		if prev.role != roleOther {
			continue
		}
		if p, ok := procs[pid]; !ok || p.start != prev.start {
			obs.longLived = append(obs.longLived, v1.LongLivedChange{Pid: pid, Comm: prev.comm, Change: "exited"})
		}
	}
	sort.Slice(obs.longLived, func(i, j int) bool { return obs.longLived[i].Pid < obs.longLived[j].Pid })
	return obs
}

// decide classifies an observation.
func decide(obs observation, ignore []string) (string, []string, v1.TurnEffects) {
	var eff v1.TurnEffects
	reasons := append([]string(nil), obs.force...)
	full := len(reasons) > 0
	files := 0
	for _, f := range obs.effects.Files {
		if !strings.HasPrefix(f.Path, "?") && ignored(f.Path, ignore) {
			eff.IgnoredFiles++
			continue
		}
		eff.Files = append(eff.Files, v1.FileEffect{Path: f.Path, Ops: f.Ops, FS: f.FS})
		switch f.FS {
		case "", "btrfs":
			files++
		default:
			// Not on the root filesystem: kernel or process state
			// (procfs, a tmpfs the sandbox mounted) that only a full
			// checkpoint holds.
			full = true
			reasons = append(reasons, fmt.Sprintf("%s of %s on %s", strings.Join(f.Ops, ","), f.Path, f.FS))
		}
	}
	for _, p := range obs.effects.Processes {
		eff.Processes = append(eff.Processes, v1.ProcessEffect{Op: p.Op, Pid: p.Pid, PPid: p.PPid, Comm: p.Comm, Path: p.Path})
	}
	for _, s := range obs.effects.Sockets {
		eff.Sockets = append(eff.Sockets, v1.SocketEffect{Op: s.Op, Pid: s.Pid, Family: s.Family, Addr: s.Addr})
	}
	eff.Unknown = append(eff.Unknown, obs.effects.Unknown...)
	if obs.effects.Lost > 0 {
		eff.Unknown = append(eff.Unknown, fmt.Sprintf("%d inspector events lost", obs.effects.Lost))
	}
	for _, u := range eff.Unknown {
		full = true
		reasons = append(reasons, "unknown effect: "+u)
	}
	eff.LongLived, eff.Sessions = obs.longLived, obs.sessChanges
	for _, c := range obs.longLived {
		full = true
		reasons = append(reasons, fmt.Sprintf("long-lived process %s (%d) %s", c.Comm, c.Pid, c.Change))
	}
	for _, c := range obs.sessChanges {
		full = true
		reasons = append(reasons, fmt.Sprintf("session %s %s", c.Name, c.Change))
	}
	switch {
	case full:
		return v1.DecisionFull, reasons, eff
	case files > 0:
		what := "files"
		if files == 1 {
			what = "file"
		}
		return v1.DecisionFS, []string{fmt.Sprintf("%d %s changed", files, what)}, eff
	}
	return v1.DecisionNone, []string{}, eff
}

// validIgnore checks an ignore pattern: an absolute path pattern (path.Match
// syntax per element), where a final or leading "**" element matches any
// number of elements.
func validIgnore(p string) error {
	if !strings.HasPrefix(p, "/") && !strings.HasPrefix(p, "**/") {
		return fmt.Errorf("ignore pattern %q: want an absolute path pattern (as /tmp/** or **/__pycache__/**): %w", p, errdefs.ErrInvalidArgument)
	}
	if _, err := path.Match(strings.ReplaceAll(p, "**", "x"), ""); err != nil {
		return fmt.Errorf("ignore pattern %q: %v: %w", p, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// ignored reports whether p matches a pattern of ignore.
func ignored(p string, ignore []string) bool {
	for _, pat := range ignore {
		if matchPath(strings.Split(strings.Trim(pat, "/"), "/"), strings.Split(strings.Trim(p, "/"), "/")) {
			return true
		}
	}
	return false
}

func matchPath(pat, p []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			rest := pat[1:]
			for i := 0; i <= len(p); i++ {
				if matchPath(rest, p[i:]) {
					return true
				}
			}
			return false
		}
		if len(p) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], p[0]); !ok {
			return false
		}
		pat, p = pat[1:], p[1:]
	}
	return len(p) == 0
}

// sessionStates asks init for its sessions and their state digests.
func (m *Manager) sessionStates(ctx context.Context, rec sandboxRec) (map[string]string, map[int]bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := rec.Init.Call(cctx, sbinit.Request{Op: "status"})
	if err != nil {
		return nil, nil, err
	}
	sess, pids := map[string]string{}, map[int]bool{}
	for _, s := range resp.Sessions {
		sess[s.Name] = s.Digest
		// init reports PIDs in the sandbox's namespace; the baseline
		// keys processes by host PID.
		pids[s.Pid] = true
	}
	return sess, pids, nil
}

// liveProcs lists the processes of the sandbox's live tree (its cgroup,
// in init's PID namespace or one below it; standbys and CRIU's helpers
// are elsewhere) with their scheduling counters. sessionPids holds the
// sessions' shells by PID inside the sandbox.
func liveProcs(rec sandboxRec, sessionPids map[int]bool) (map[int]procInfo, error) {
	tree, _, err := treePids(rec.ID, rec.Init)
	if err != nil {
		return nil, err
	}
	type proc struct {
		info         procInfo
		nspid, level int
	}
	read := map[int]proc{}
	for _, pid := range tree {
		p, nspid, level, err := readProc(pid)
		if err == nil { // else exited meanwhile
			read[pid] = proc{p, nspid, level}
		}
	}
	init, ok := read[rec.Init.Pid]
	if !ok {
		return nil, fmt.Errorf("init %d is gone", rec.Init.Pid)
	}
	out := map[int]procInfo{}
	for pid, p := range read {
		switch {
		case pid == rec.Init.Pid:
			p.info.role = roleInit
		case p.level == init.level && sessionPids[p.nspid]:
			p.info.role = roleSession
		}
		out[pid] = p.info
	}
	return out, nil
}

// pidNSDepth returns how many levels below the PID namespace with inode
// ino pid lives (0: in it), or -1 if not in it or below.
func pidNSDepth(pid int, ino uint64) (int, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for depth := 0; depth < 8; depth++ {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Ino == ino {
			unix.Close(fd)
			return depth, nil
		}
		parent, err := unix.IoctlRetInt(fd, unix.NS_GET_PARENT)
		unix.Close(fd)
		if err != nil {
			return -1, nil // EPERM: the top is reached
		}
		fd = parent
	}
	unix.Close(fd)
	return -1, nil
}

// mergeEffects returns a's effects followed by b's, files merged by path.
func mergeEffects(a, b inspect.Effects) inspect.Effects {
	out := inspect.Effects{Lost: a.Lost + b.Lost}
	idx := map[string]int{}
	for _, f := range append(append([]inspect.FileEffect(nil), a.Files...), b.Files...) {
		i, ok := idx[f.Path]
		if !ok {
			idx[f.Path] = len(out.Files)
			out.Files = append(out.Files, inspect.FileEffect{Path: f.Path, FS: f.FS, Ops: append([]string(nil), f.Ops...)})
			continue
		}
		for _, op := range f.Ops {
			if !slices.Contains(out.Files[i].Ops, op) {
				out.Files[i].Ops = append(out.Files[i].Ops, op)
			}
		}
		if out.Files[i].FS == "" {
			out.Files[i].FS = f.FS
		}
	}
	out.Processes = append(append(out.Processes, a.Processes...), b.Processes...)
	out.Sockets = append(append(out.Sockets, a.Sockets...), b.Sockets...)
	for _, u := range append(append([]string(nil), a.Unknown...), b.Unknown...) {
		if !slices.Contains(out.Unknown, u) {
			out.Unknown = append(out.Unknown, u)
		}
	}
	return out
}

// readProc reads a process's identity and scheduling counters (summed
// over its threads), its PID in its own PID namespace and that
// namespace's level (0: the host's).
func readProc(pid int) (procInfo, int, int, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return procInfo{}, 0, 0, err
	}
	var p procInfo
	i, j := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
	if i < 0 || j < i {
		return procInfo{}, 0, 0, errors.New("bad stat")
	}
	p.comm = string(b[i+1 : j])
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 20 {
		return procInfo{}, 0, 0, errors.New("bad stat")
	}
	p.start, _ = strconv.ParseUint(f[19], 10, 64)
	nspid, level := pid, 0
	if st, err := os.ReadFile(dir + "/status"); err == nil {
		for _, line := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if ff := strings.Fields(v); len(ff) > 0 {
					nspid, _ = strconv.Atoi(ff[len(ff)-1])
					level = len(ff) - 1
				}
			}
		}
	}
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil {
		return procInfo{}, 0, 0, err
	}
	for _, t := range tasks {
		td := dir + "/task/" + t.Name()
		if s, err := os.ReadFile(td + "/schedstat"); err == nil {
			if ff := strings.Fields(string(s)); len(ff) >= 3 {
				c, _ := strconv.ParseUint(ff[0], 10, 64)
				n, _ := strconv.ParseUint(ff[2], 10, 64)
				p.cpu += c
				p.slices += n
			}
		}
		if s, err := os.ReadFile(td + "/stat"); err == nil {
			if k := strings.LastIndexByte(string(s), ')'); k >= 0 && k+2 < len(s) && s[k+2] == 'R' {
				p.running = true
			}
		}
		if s, err := os.ReadFile(td + "/status"); err == nil {
			if _, v, ok := strings.Cut(string(s), "\nvoluntary_ctxt_switches:"); ok {
				v, _, _ = strings.Cut(v, "\n")
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				p.vol += n
			}
		}
		if s, err := os.ReadFile(td + "/syscall"); err == nil {
			// "nr args... sp pc", "-1 sp pc" or "running".
			f := strings.Fields(string(s))
			if len(f) >= 2 {
				f = f[len(f)-2:]
			}
			p.pos += t.Name() + ":" + strings.Join(f, ",") + " "
		}
	}
	return p, nspid, level, nil
}

// recording wraps an exec stream from init so that, when it is closed,
// the command, its output (the first 64 KiB of each stream) and its exit
// status are appended to the sandbox's turn log.
func (m *Manager) recording(id string, c net.Conn, args []string) net.Conn {
	return &recConn{Conn: c, m: m, id: id, cmd: v1.TurnCommand{Time: time.Now().UTC(), Args: args, ExitCode: -1}}
}

type recConn struct {
	net.Conn
	m    *Manager
	id   string
	mu   sync.Mutex
	buf  []byte // an incomplete frame
	cmd  v1.TurnCommand
	once sync.Once
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.buf = append(c.buf, p[:n]...)
		c.parse()
		c.mu.Unlock()
	}
	return n, err
}

// parse consumes the complete frames in buf.
func (c *recConn) parse() {
	const keep = 64 << 10
	for len(c.buf) >= 5 {
		size := int(c.buf[1])<<24 | int(c.buf[2])<<16 | int(c.buf[3])<<8 | int(c.buf[4])
		if size > v1.MaxFrame {
			c.buf = nil // not a stream we understand: stop recording output
			return
		}
		if len(c.buf) < 5+size {
			return
		}
		typ, payload := c.buf[0], c.buf[5:5+size]
		switch typ {
		case v1.FrameStdout:
			if room := keep - len(c.cmd.Stdout); room > 0 {
				c.cmd.Stdout += string(payload[:min(room, len(payload))])
			}
			c.cmd.Truncated = c.cmd.Truncated || len(c.cmd.Stdout) >= keep
		case v1.FrameStderr:
			if room := keep - len(c.cmd.Stderr); room > 0 {
				c.cmd.Stderr += string(payload[:min(room, len(payload))])
			}
			c.cmd.Truncated = c.cmd.Truncated || len(c.cmd.Stderr) >= keep
		case v1.FrameExit:
			var st v1.ExitStatus
			if json.Unmarshal(payload, &st) == nil {
				c.cmd.ExitCode = st.ExitCode
			}
		}
		c.buf = c.buf[5+size:]
	}
}

func (c *recConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		cmd := c.cmd
		c.mu.Unlock()
		c.m.recordCommand(c.id, cmd)
	})
	return c.Conn.Close()
}
