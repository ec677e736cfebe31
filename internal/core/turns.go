package core

import (
	"context"
	"fmt"
	"net"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/turn"
)

// Turns (internal/turn): the decision, the observation of sessions and
// long-lived processes, and the turn log are turn's; the engine keeps the
// turn end as a verb, under the sandbox lock, because it takes the
// checkpoint. The calls into turn are at three points: the tree
// (turnReset, turnForget, turnForce here; Prepare and BaselineAsync in
// the rollbacks), each command (turnGate, recordCommand, recording), and
// the turn end (EndTurn).

// newTurns returns the Manager's turn tracker.
func (m *Manager) newTurns() *turn.Tracker {
	return turn.New(turn.Config{
		DB:  m.db,
		Log: m.log,
		Tree: func(id string, init sandbox.Init) ([]int, error) {
			tree, _, err := m.treePids(id, init)
			return tree, err
		},
		Cgroup: func(id string) (string, error) {
			cg, err := cgroup.Load(m.cgroupName(id))
			if err != nil {
				return "", err
			}
			return cg.UnifiedDir(), nil
		},
		Egress: m.egressCounts,
		Prev:   m.turnPrev,
		RecordLimit: func(id string) int64 {
			var rec sandboxRec
			if m.db.Get(meta.Sandboxes, id, &rec) == nil && rec.RecordLimit > 0 {
				return rec.RecordLimit
			}
			return m.cfg.RecordLimit
		},
	})
}

// SetInspector turns the inspector on or off for sandboxes whose turn
// state starts from now on (see turn.Tracker.SetInspector).
func (m *Manager) SetInspector(on bool) { m.turns.SetInspector(on) }

// turnReset starts a fresh turn baseline for a sandbox whose process
// tree was (re)placed by molt. Caller holds the sandbox lock; the tree
// runs.
func (m *Manager) turnReset(ctx context.Context, rec sandboxRec) {
	m.turns.Reset(ctx, rec.ID, rec.Init)
}

// turnForget drops a sandbox's turn state (removed, stopped, hibernated).
func (m *Manager) turnForget(id string) { m.turns.Forget(id) }

// turnForce makes the sandbox's next turn full, for reason.
func (m *Manager) turnForce(id, reason string) { m.turns.Force(id, reason) }

// turnGate waits while a turn end of the sandbox is capturing its
// checkpoint: a command sent meanwhile belongs to the next turn.
func (m *Manager) turnGate(ctx context.Context, id string) error { return m.turns.Gate(ctx, id) }

// recordCommand appends a command to the sandbox's current turn.
func (m *Manager) recordCommand(id string, c meta.TurnCommand) { m.turns.Record(id, c) }

// recording wraps an exec stream so that the command (cmd: its request)
// is logged when it is closed.
func (m *Manager) recording(id string, c net.Conn, cmd meta.TurnCommand) net.Conn {
	return m.turns.Recording(id, c, cmd)
}

// TurnOutcome is the result of an asynchronous turn end.
type TurnOutcome = turn.Outcome

// EndTurnAsync ends the sandbox's turn in the background. Commands sent
// after it returns wait until the turn's checkpoint is captured.
func (m *Manager) EndTurnAsync(ref string, req v1.TurnRequest) <-chan TurnOutcome {
	id := ""
	if rec, err := m.lookupSandbox(ref); err == nil {
		id = rec.ID
	}
	return m.turns.Async(id, func(ctx context.Context) (meta.TurnResult, error) {
		return m.EndTurn(ctx, ref, req)
	})
}

// EndTurn ends the sandbox's current turn: turn collects what the turn
// did and decides none, fs or full; this takes that checkpoint and turn
// starts the next turn. A full checkpoint is returned pending (stored in
// the background), as Checkpoint does.
func (m *Manager) EndTurn(ctx context.Context, ref string, req v1.TurnRequest) (meta.TurnResult, error) {
	began := time.Now()
	if req.Label != "" {
		if err := validName("checkpoint label", req.Label); err != nil {
			return meta.TurnResult{}, err
		}
	}
	if err := turn.ValidIgnore(req.Ignore); err != nil {
		return meta.TurnResult{}, err
	}
	if r, err := m.lookupSandbox(ref); err == nil {
		if err := m.persistRoom(ctx, r.ID); err != nil {
			return meta.TurnResult{}, err
		}
	}
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return meta.TurnResult{}, err
	}
	defer unlock()
	defer m.foreground(rec.ID)()
	if st := m.report(rec).State; st != v1.StateRunning {
		return meta.TurnResult{}, fmt.Errorf("turn: sandbox %s is %s; turns are those of a running sandbox: %w", rec.ID, st, errdefs.ErrFailedPrecondition)
	}
	end := m.turns.Begin(ctx, rec.ID, rec.Init, rec.Head, req, began)
	defer end.Close()
	res := end.Result()
	m.metrics.decisions.WithLabelValues(res.Decision).Inc()
	m.metrics.turnDecide.Observe(time.Since(began).Seconds())
	if req.DryRun {
		return end.Keep(), nil
	}
	return m.endTurnCheckpoint(ctx, rec, req.Label, end, began)
}

// endTurnCheckpoint takes the checkpoint end decided on and ends the
// turn. Caller holds the sandbox lock.
func (m *Manager) endTurnCheckpoint(ctx context.Context, rec sandboxRec, label string, end *turn.End, began time.Time) (meta.TurnResult, error) {
	res := end.Result()
	if res.Decision != v1.DecisionNone {
		slot, err := m.captureSlot(ctx)
		if err != nil {
			end.Keep()
			return meta.TurnResult{}, err
		}
		defer slot()
	}
	var ck meta.Checkpoint
	var err error
	switch res.Decision {
	case v1.DecisionFS:
		ck, err = m.checkpointLocked(ctx, rec, ckOpts{label: label, frozen: end.Frozen, turn: res.Turn})
	case v1.DecisionFull:
		ck, err = m.fullCheckpointLocked(ctx, rec, ckOpts{label: label, frozen: end.Frozen, turn: res.Turn})
	}
	if err != nil {
		end.Fail(err)
		m.metrics.checkpoint.WithLabelValues(res.Decision, "failed").Inc()
		return meta.TurnResult{}, fmt.Errorf("turn %d of %s: %s checkpoint: %w", res.Turn, rec.ID, res.Decision, err)
	}
	if res.Decision != v1.DecisionNone {
		m.metrics.checkpointed(ck, time.Since(began))
	}
	return end.Commit(ck), nil
}

// SetTurnIgnore sets the sandbox's own ignore list for turn decisions.
func (m *Manager) SetTurnIgnore(ref string, ignore []string) error {
	if err := turn.ValidIgnore(ignore); err != nil {
		return err
	}
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return err
	}
	return m.turns.SetIgnore(rec.ID, ignore)
}

// RecordLLM attaches an LLM call to the record of the turn it ended.
func (m *Manager) RecordLLM(id string, n int, c meta.LLMCall) error {
	return m.turns.RecordLLM(id, n, c)
}

// TurnUnrecorded notes that part of sandbox id's current turn could not
// be recorded: no recovery replays that turn.
func (m *Manager) TurnUnrecorded(id, why string) { m.turns.Unrecorded(id, why) }

// ReplayLLM answers an LLM call of sandbox id from its fast-forward, if
// one is under way and the call is its next exchange.
func (m *Manager) ReplayLLM(id, api, path, requestSHA256 string, size int) (meta.LLMCall, int, bool) {
	x, ok := m.turns.Replay(id, turn.Request{
		Kind: turn.ExchangeLLM, Ident: turn.LLMIdent(api, requestSHA256),
		What: fmt.Sprintf("LLM call %s %s (request sha256 %.12s, %d bytes)", api, path, requestSHA256, size),
	})
	if !ok {
		return meta.LLMCall{}, 0, false
	}
	return *x.LLM, x.Turn, true
}

// Turns lists a sandbox's turn log, oldest first.
func (m *Manager) Turns(ref string) ([]meta.TurnRecord, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return nil, err
	}
	return m.turns.Log(rec.ID)
}
