package turn

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/inspect"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

// End is a turn end under way, from Begin to Close. It holds the
// sandbox's turn state: a second turn end, a baseline or an LLM record
// of the sandbox waits, and (unless it is a dry run) so do its commands.
type End struct {
	t     *Tracker
	ts    *state
	ctx   context.Context
	id    string
	init  sandbox.Init
	began time.Time
	dry   bool

	obs observation
	res meta.TurnResult

	// Filled by Frozen, inside the checkpoint's frozen window.
	frozenEffects inspect.Effects
	frozenProcs   map[int]procInfo
}

// Begin collects what the sandbox's current turn did and decides which
// checkpoint it needs (Result). began is when the engine's turn end
// began: the result's times count from it.
//
// Preconditions: the caller holds the sandbox lock, the sandbox runs
// with init as its PID 1 and head as its head, and req's ignore patterns
// are valid (ValidIgnore). The caller calls Close.
//
// +checklocksignore: lock hand-off (see prepare)
func (t *Tracker) Begin(ctx context.Context, id string, init sandbox.Init, head string, req v1.TurnRequest, began time.Time) *End {
	ts := t.of(id)
	if ts == nil {
		// No baseline (the daemon restarted since the sandbox started):
		// this turn cannot be judged; it is full and sets one.
		ts = t.prepare(id, init)
		ts.force = append(ts.force, "no baseline for this sandbox's turn (the daemon started after it)")
		ts.mu.Unlock()
	}
	ts.mu.Lock()
	e := &End{t: t, ts: ts, ctx: ctx, id: id, init: init, began: began, dry: req.DryRun}
	if !e.dry {
		t.beginEnd(ts)
	}
	e.obs = t.observe(ctx, id, init, ts)
	e.res = meta.TurnResult{Sandbox: id, Turn: ts.n, Head: head}
	e.res.Decision, e.res.Reasons, e.res.Effects = decide(e.obs, append(append([]string(nil), ts.ignore...), req.Ignore...))
	if t.cfg.Egress != nil {
		e.res.Effects.Egress = t.cfg.Egress(id, ts.n)
	}
	e.res.DecideMS = ms(time.Since(began))
	return e
}

// Result is the decision: the turn's number, effects, decision and
// reasons.
func (e *End) Result() meta.TurnResult { return e.res }

// Close releases the sandbox's turn state.
//
// +checklocksignore: lock hand-off (see prepare)
func (e *End) Close() {
	if !e.dry {
		e.t.finishEnd(e.ts)
	}
	e.ts.mu.Unlock()
}

// Keep ends nothing: what was collected counts for the current turn
// still (a dry run, or a checkpoint that could not start).
func (e *End) Keep() meta.TurnResult {
	e.ts.carry = e.obs.effects
	e.ts.force = e.obs.force
	res := e.res
	res.DurationMS = ms(time.Since(e.began))
	return res
}

// Frozen is called by the checkpoint inside its frozen window: what
// happened between the collection and the freeze is in the checkpoint.
func (e *End) Frozen() {
	if e.ts.watch != nil {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ev, err := e.ts.watch.Cut(cctx)
		cancel()
		if err != nil {
			ev.Unknown = append(ev.Unknown, "inspector: "+err.Error())
		}
		e.frozenEffects = ev
	}
	// After a CRIU dump the tasks CRIU let go re-enter the freezer
	// on their own: wait (briefly; only a loaded host takes long)
	// until none is runnable, so their positions are the frozen ones.
	e.frozenProcs, _ = e.t.settle(e.ctx, e.id, e.init, e.obs.sessionPids, 100*time.Millisecond)
}

// Fail records that the turn's checkpoint failed: the turn does not
// end, and what it did stays for the next try, which needs at least what
// this one needed. (Full is more than a failed fs turn needs, but always
// right.)
func (e *End) Fail(err error) {
	e.ts.carry = mergeEffects(e.obs.effects, e.frozenEffects)
	e.ts.force = append(e.obs.force, fmt.Sprintf("the %s checkpoint of turn %d failed: %v", e.res.Decision, e.ts.n, err))
}

// Commit ends the turn with ck, its checkpoint (zero for a decision of
// none): it takes the next turn's baseline, records the turn in the log
// and returns the result.
func (e *End) Commit(ck meta.Checkpoint) meta.TurnResult {
	res, ts := e.res, e.ts
	if res.Decision != v1.DecisionNone {
		id := ck.ID
		res.Checkpoint, res.Head, res.StallMS, res.Pending = &id, ck.ID, ck.StallMS, ck.Pending
	}
	e.next()
	res.DurationMS = ms(time.Since(e.began))
	e.t.mu.Lock()
	cmds, prev, unrec := ts.commands, ts.prev, ts.unrecorded
	ts.commands, ts.prev, ts.unrecorded = nil, res.Turn, ""
	e.t.mu.Unlock()
	tr := meta.TurnRecord{TurnResult: res, Prev: prev, Incomplete: unrec, Started: ts.started, Ended: time.Now().UTC(), Commands: cmds}
	for i, c := range cmds {
		if c.Cut && tr.Incomplete == "" {
			tr.Incomplete = fmt.Sprintf("command %d's output was cut: the sandbox's recording limit of %d bytes was reached", i, e.t.limit(e.id))
			break
		}
	}
	e.t.record(tr)
	ts.n++
	ts.started = time.Now()
	return res
}

// next makes this turn's end state the next turn's baseline.
func (e *End) next() {
	ts, obs := e.ts, e.obs
	ts.force = nil
	ts.carry = inspect.Effects{}
	switch e.res.Decision {
	case v1.DecisionNone:
		ts.procs = obs.procs
	case v1.DecisionFS:
		// Files between the collection and the freeze are in the
		// snapshot; anything else is not, and stays.
		e.frozenEffects.Files = nil
		ts.carry = e.frozenEffects
		// A long-lived process that ran between the collection and the
		// freeze changed after the decision: the fs checkpoint does not
		// hold that. The freeze itself wakes each blocked task, which
		// blocks again once in the freezer (one voluntary switch; being
		// preempted on the way, under load, is not a change) and is
		// rewound to its system call. Anything more is the task at work.
		for pid, f := range e.frozenProcs {
			if c, ok := obs.procs[pid]; f.role == roleOther && (!ok || c.start != f.start || f.vol > c.vol+uint64(strings.Count(f.pos, ":")) || !samePos(f.pos, c.pos)) {
				ts.force = append(ts.force, fmt.Sprintf("long-lived process %s (%d) ran between turn %d's end and its fs checkpoint", f.comm, pid, ts.n))
			}
		}
		ts.procs = e.t.settled(e.ctx, e.id, e.init, obs.sessionPids, e.frozenProcs, ts)
	case v1.DecisionFull:
		ts.procs = e.t.settled(e.ctx, e.id, e.init, obs.sessionPids, e.frozenProcs, ts)
	}
	ts.sessions = obs.sessions
	ts.tree = e.init
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
