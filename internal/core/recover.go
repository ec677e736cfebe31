package core

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/turn"
)

// Recovery: the sandbox goes back to a committed checkpoint taken at a
// turn's end, and its restarted agent is fast-forwarded from the turn
// log (internal/turn, replay.go) up to that turn. The rollback itself is
// the ordinary one (its effect plan, its refusal, its tiers); what
// recovery adds is the choice of the point and the fast-forward.

// Recover rolls sandbox ref back to req.To (or the latest committed turn
// checkpoint whose turns are all recorded) and arms the fast-forward of
// the turns that led there.
func (m *Manager) Recover(ctx context.Context, ref string, req v1.RecoverRequest) (meta.RecoverResult, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return meta.RecoverResult{}, err
	}
	// A full checkpoint still being stored commits (or fails) first: the
	// latest committed one is then known.
	if err := m.pipe.wait(ctx, "", rec.ID); err != nil {
		return meta.RecoverResult{}, err
	}
	if rec, err = m.lookupSandbox(rec.ID); err != nil {
		return meta.RecoverResult{}, err
	}
	ck, chain, err := m.recoveryPoint(rec, req.To)
	if err != nil {
		return meta.RecoverResult{}, err
	}
	ff, err := turn.NewFastForward(ck.ID, chain)
	if err != nil {
		return meta.RecoverResult{}, fmt.Errorf("recover %s to %s: %v: %w", rec.ID, ck.ID, err, errdefs.ErrFailedPrecondition)
	}
	res := meta.RecoverResult{Sandbox: rec.ID, Checkpoint: ck.ID, Turn: ff.Turn, Turns: []int{}, Bytes: ff.Bytes(), DryRun: req.DryRun}
	for _, tr := range chain {
		res.Turns = append(res.Turns, tr.Turn)
	}
	res.LLMCalls, res.Commands = ff.Count()
	rb, err := m.RollbackWith(ctx, rec.ID, v1.RollbackRequest{Checkpoint: ck.ID, Force: req.Force, DryRun: req.DryRun})
	if err != nil {
		return meta.RecoverResult{}, fmt.Errorf("recover %s: %w", rec.ID, err)
	}
	res.Rollback = &rb
	if req.DryRun {
		return res, nil
	}
	m.turns.Continue(rec.ID, ff.Turn)
	m.turns.Arm(rec.ID, ff)
	m.log.Info("recovery armed", "sandbox", rec.ID, "checkpoint", ck.ID, "turn", ff.Turn,
		"llm_calls", res.LLMCalls, "commands", res.Commands, "tier", rb.Tier)
	return res, nil
}

// recoveryPoint finds the checkpoint to recover to and the chain of
// turns that ends in its state, oldest first. With to empty it walks
// back from the sandbox's head to the first committed checkpoint that
// ends a turn whose chain is wholly recorded.
func (m *Manager) recoveryPoint(rec sandboxRec, to string) (checkpointRec, []meta.TurnRecord, error) {
	log, err := m.turns.ExactLog(rec.ID)
	if err != nil {
		return checkpointRec{}, nil, err
	}
	byN := make(map[int]meta.TurnRecord, len(log))
	for _, tr := range log {
		byN[tr.Turn] = tr
	}
	if to != "" {
		ck, err := m.lookupCheckpoint(to, rec.ID)
		if err != nil {
			return checkpointRec{}, nil, err
		}
		if ck.Sandbox != rec.ID {
			return checkpointRec{}, nil, fmt.Errorf("recover %s: checkpoint %s belongs to sandbox %s: %w", rec.ID, ck.ID, ck.Sandbox, errdefs.ErrInvalidArgument)
		}
		if ck.Pending || ck.Failed {
			return checkpointRec{}, nil, fmt.Errorf("recover %s: checkpoint %s is not committed: %w", rec.ID, ck.ID, errdefs.ErrFailedPrecondition)
		}
		chain, why := turnChain(byN, log, ck.ID)
		if chain == nil {
			return checkpointRec{}, nil, fmt.Errorf("recover %s to %s: %s: %w", rec.ID, ck.ID, why, errdefs.ErrFailedPrecondition)
		}
		return ck, chain, nil
	}
	var whys []string
	for id, n := rec.Head, 0; id != "" && n < 10000; n++ {
		var ck checkpointRec
		if err := m.db.Get(meta.Checkpoints, id, &ck); err != nil {
			break
		}
		if ck.Sandbox != rec.ID {
			break // a fork's origin: its turns are another sandbox's
		}
		if !ck.Pending && !ck.Failed {
			chain, why := turnChain(byN, log, ck.ID)
			if chain != nil {
				return ck, chain, nil
			}
			whys = append(whys, ck.ID+": "+why)
		}
		id = ck.Parent
	}
	why := "no checkpoint of it was taken at a turn's end"
	if len(whys) > 0 {
		why = whys[0]
	}
	return checkpointRec{}, nil, fmt.Errorf("recover %s: no committed turn checkpoint to recover to (%s): %w", rec.ID, why, errdefs.ErrFailedPrecondition)
}

// turnChain is the chain of turns that ends in checkpoint ck's state:
// it ends at the latest turn whose head is ck (a turn that decided none
// leaves the state as it was) and follows each turn's Prev to the first.
// nil, and why, when no turn ends in ck or a turn of the chain is
// missing or cannot be replayed.
func turnChain(byN map[int]meta.TurnRecord, log []meta.TurnRecord, ck string) ([]meta.TurnRecord, string) {
	why := "no turn ended in it"
	for i := len(log) - 1; i >= 0; i-- {
		if log[i].Head != ck {
			continue
		}
		var chain []meta.TurnRecord
		ok := true
		for n, steps := log[i].Turn, 0; n != 0; steps++ {
			tr, found := byN[n]
			switch {
			case !found:
				why, ok = fmt.Sprintf("turn %d of its chain is not in the log", n), false
			case tr.Incomplete != "":
				why, ok = fmt.Sprintf("turn %d: %s", n, tr.Incomplete), false
			case tr.Prev >= n || steps > len(log):
				why, ok = fmt.Sprintf("turn %d's chain loops", n), false
			}
			if !ok {
				break
			}
			chain = append(chain, tr)
			n = tr.Prev
		}
		if ok {
			for l, r := 0, len(chain)-1; l < r; l, r = l+1, r-1 {
				chain[l], chain[r] = chain[r], chain[l]
			}
			return chain, ""
		}
	}
	return nil, why
}

// turnPrev is the turn a sandbox's state continues when its turn state
// is made afresh (the daemon started, the sandbox started): its last
// turn if that ended in the sandbox's head, else the turn that took the
// head (or the nearest such ancestor).
func (m *Manager) turnPrev(id string, last meta.TurnRecord) int {
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, id, &rec); err != nil || rec.Head == "" {
		return last.Turn
	}
	if last.Turn != 0 && last.Head == rec.Head {
		return last.Turn
	}
	return m.turnOf(id, rec.Head)
}

// turnOf is the turn whose end took checkpoint ck of sandbox id, or of
// its nearest ancestor that a turn took (0: none).
func (m *Manager) turnOf(id, ck string) int {
	for n := 0; ck != "" && n < 10000; n++ {
		var c checkpointRec
		if err := m.db.Get(meta.Checkpoints, ck, &c); err != nil || c.Sandbox != id {
			return 0
		}
		if c.Turn != 0 {
			return c.Turn
		}
		ck = c.Parent
	}
	return 0
}

// pruneTurns deletes the sandbox's turn records that no recovery can use
// any more: those that are not on the chain of a turn ending in one of
// its checkpoints, nor on the chain its current turn continues. The
// recording goes with the checkpoint lineage it belongs to. Caller holds
// the sandbox lock.
func (m *Manager) pruneTurns(id string) {
	log, err := m.turns.Stored(id)
	if err != nil || len(log) == 0 {
		return
	}
	cks, err := m.checkpointsOf(id)
	if err != nil {
		return
	}
	live := make(map[string]bool, len(cks))
	for _, c := range cks {
		live[c.ID] = true
	}
	prev := make(map[int]int, len(log))
	for _, tr := range log {
		prev[tr.Turn] = tr.Prev
	}
	keep := map[int]bool{}
	mark := func(n int) {
		for n != 0 && !keep[n] {
			keep[n] = true
			p, ok := prev[n]
			if !ok || p >= n {
				return
			}
			n = p
		}
	}
	for _, tr := range log {
		if live[tr.Head] {
			mark(tr.Turn)
		}
	}
	mark(m.turns.PrevOf(id))
	var drop []int
	for _, tr := range log {
		if !keep[tr.Turn] {
			drop = append(drop, tr.Turn)
		}
	}
	if len(drop) == 0 {
		return
	}
	if err := m.turns.DeleteTurns(id, drop); err != nil {
		m.log.Warn("turn log: cannot drop the turns of deleted checkpoints", "sandbox", id, "err", err)
		return
	}
	m.log.Info("turn log: dropped the turns no checkpoint needs", "sandbox", id, "turns", len(drop))
}

// Recovery reports where sandbox ref's fast-forward stands.
func (m *Manager) Recovery(ref string) (meta.RecoveryStatus, error) {
	rec, err := m.lookupSandbox(ref)
	if err != nil {
		return meta.RecoveryStatus{}, err
	}
	ff := m.turns.FastForwardOf(rec.ID)
	if ff == nil {
		return meta.RecoveryStatus{Sandbox: rec.ID, State: v1.RecoveryNone}, nil
	}
	st := ff.Status()
	out := meta.RecoveryStatus{
		Sandbox: rec.ID, State: st.State, Checkpoint: st.Checkpoint, Turn: st.Turn,
		Replayed: st.Replayed, Total: st.Total, Bytes: st.Bytes,
	}
	if d := st.Divergence; d != nil {
		out.Divergence = &meta.Divergence{Turn: d.Turn, Index: d.Index, Expected: d.Expected, Got: d.Got, At: d.At}
	}
	return out, nil
}

// replayExec is the exec stream of a recorded command: its PID, output
// and exit status, as the command's own stream gave them (stdout first,
// then stderr: the record keeps the streams apart).
func replayExec(c meta.TurnCommand) net.Conn {
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		fw := v1.NewFrameWriter(server)
		if c.Pid != 0 {
			if fw.WriteFrame(v1.FrameStarted, []byte(strconv.Itoa(c.Pid))) != nil {
				return
			}
		}
		for _, out := range []struct {
			typ byte
			b   string
		}{{v1.FrameStdout, c.Stdout}, {v1.FrameStderr, c.Stderr}} {
			for b := out.b; len(b) > 0; {
				n := min(len(b), 1<<20)
				if fw.WriteFrame(out.typ, []byte(b[:n])) != nil {
					return
				}
				b = b[n:]
			}
		}
		st, _ := json.Marshal(v1.ExitStatus{ExitCode: c.ExitCode, Signal: c.Signal, TimedOut: c.TimedOut, DurationMS: c.DurationMS, Replayed: true})
		_ = fw.WriteFrame(v1.FrameExit, st)
	}()
	return client
}
