package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// Compensation, as the engine runs it (the ledger keeps the order and
// every step, internal/egress/ledger/compensate.go): a rollback that
// orphans committed effects the sandbox's policy compensates writes
// their compensations planned before it switches the sandbox's state,
// runs them after the switch, dependents first, still under the
// sandbox's lock, and reports how they went in its result and on the
// sandbox. After the switch, not before: a restore that fails leaves
// the sandbox as it was, which must then still match the world (its
// effects not undone); and a compensation that fails cannot be taken
// back, so the rollback it belongs to is not either: the sandbox is at
// the checkpoint, and the effects whose compensation failed are orphans
// the world still has, reported as failed. A daemon that dies in
// between resumes at start-up (resumeCompensations).

// Defaults of EgressConfig's compensation bounds.
const (
	DefaultCompensateAttempts = 3
	DefaultCompensateBackoff  = 500 * time.Millisecond
	DefaultCompensateTimeout  = 30 * time.Second
)

func (m *Manager) compOptions() (ledger.RunOptions, time.Duration) {
	c := m.cfg.Egress
	o := ledger.RunOptions{Attempts: c.CompensateAttempts, Backoff: c.CompensateBackoff}
	if o.Attempts <= 0 {
		o.Attempts = DefaultCompensateAttempts
	}
	if o.Backoff <= 0 {
		o.Backoff = DefaultCompensateBackoff
	}
	t := c.CompensateTimeout
	if t <= 0 {
		t = DefaultCompensateTimeout
	}
	return o, t
}

// IdempotencyKey is the key an HTTP compensator of effect id carries:
// the same on every attempt, so that a service that honours it undoes
// the effect once however often a crash makes molt send it.
func IdempotencyKey(id string) string { return "molt-compensate-" + id }

// planCompensation writes the plan's compensations planned, as one
// batch, before the rollback switches the sandbox; "" when there are
// none.
func (m *Manager) planCompensation(rec sandboxRec, ck checkpointRec, plan *meta.RollbackPlan) (string, error) {
	if plan == nil || len(plan.Compensate) == 0 {
		return "", nil
	}
	batch := newID()
	if err := m.ledger.Plan(rec.ID, ck.ID, batch, plan.Compensate); err != nil {
		_ = m.ledger.Cancel(rec.ID, plan.Compensate, "the plan could not be written")
		return "", fmt.Errorf("rollback %s to %s: plan the compensations: %w", rec.ID, ck.ID, err)
	}
	return batch, nil
}

// cancelCompensation marks a batch's planned compensations cancelled:
// the rollback failed, the effects are not orphaned.
func (m *Manager) cancelCompensation(rec sandboxRec, batch string, plan *meta.RollbackPlan, why error) {
	if batch == "" {
		return
	}
	if err := m.ledger.Cancel(rec.ID, plan.Compensate, "the rollback failed: "+why.Error()); err != nil {
		m.log.Warn("effect ledger: cannot cancel planned compensations", "sandbox", rec.ID, "err", err)
	}
}

// compensate runs batch (the sandbox's lock held) and reports how it
// went, on the sandbox's record too.
func (m *Manager) compensate(ctx context.Context, id, ck, batch string) *meta.CompensationReport {
	if batch == "" {
		return nil
	}
	m.setCompensationReport(id, &meta.CompensationReport{Checkpoint: ck, Batch: batch, State: v1.CompensationRunning, At: time.Now().UTC()})
	o, timeout := m.compOptions()
	out, err := m.ledger.Run(ctx, id, batch, o, func(ctx context.Context, r ledger.Record, attempt int) error {
		actx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		err := m.runCompensator(actx, id, r)
		if err != nil {
			m.log.Warn("compensation attempt failed", "sandbox", id, "effect", r.ID, "attempt", attempt, "err", err)
		}
		return err
	})
	rep := &meta.CompensationReport{Checkpoint: ck, Batch: batch, State: v1.CompensationDone, At: time.Now().UTC()}
	for _, oc := range out {
		switch oc.State {
		case ledger.CompDone:
			rep.Compensated = append(rep.Compensated, oc.ID)
		case ledger.CompFailed:
			rep.Failed = append(rep.Failed, meta.FailedCompensation{ID: oc.ID, Attempts: oc.Attempts, Error: m.vault.Redact(id, oc.Error)})
		}
	}
	if len(rep.Failed) > 0 {
		rep.State = v1.CompensationFailed
	}
	if err != nil {
		// Stopped (the daemon is closing) or the ledger failed: what is
		// left stays open in the ledger for the next start.
		rep.State = v1.CompensationRunning
		m.log.Warn("compensations interrupted; they resume at the next start", "sandbox", id, "err", err)
	}
	m.setCompensationReport(id, rep)
	return rep
}

// setCompensationReport puts rep on sandbox id's record.
func (m *Manager) setCompensationReport(id string, rep *meta.CompensationReport) {
	err := m.db.Update(func(tx *meta.Tx) error {
		var r sandboxRec
		if err := tx.Get(meta.Sandboxes, id, &r); err != nil {
			return err
		}
		r.Compensation = rep
		return tx.Put(meta.Sandboxes, id, r)
	})
	if err != nil {
		m.log.Warn("cannot record the compensations on the sandbox", "sandbox", id, "err", err)
	}
}

// runCompensator runs one attempt of r's compensator, for sandbox id.
func (m *Manager) runCompensator(ctx context.Context, id string, r ledger.Record) error {
	c := r.Compensator
	if c == nil {
		return errors.New("no compensator")
	}
	if c.Sandbox != "" {
		return m.runHelper(ctx, id, r.ID, c)
	}
	req, err := http.NewRequestWithContext(ctx, c.Method, c.URL, bytes.NewReader(c.Body))
	if err != nil {
		return err
	}
	for k, vs := range c.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Idempotency-Key", IdempotencyKey(r.ID))
	resp, err := m.worldClient(id).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", c.Method, c.URL, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// worldClient is the client of sandbox id's HTTP compensators: its own
// world (the egress uplink's) with egress, the host's network without.
func (m *Manager) worldClient(id string) *http.Client {
	_, timeout := m.compOptions()
	var rec sandboxRec
	if m.db.Get(meta.Sandboxes, id, &rec) == nil && rec.Network == v1.NetworkEgress && m.net != nil {
		return m.net.WorldClient(timeout)
	}
	return &http.Client{Timeout: timeout}
}

// runHelper runs c's command in its helper sandbox (running; not the
// sandbox being compensated, whose lock the caller holds): exit status 0
// means compensated. The command gets MOLT_EFFECT and
// MOLT_IDEMPOTENCY_KEY in its environment.
func (m *Manager) runHelper(ctx context.Context, id, effect string, c *ledger.Compensator) error {
	h, err := m.lookupSandbox(c.Sandbox)
	if err != nil {
		return fmt.Errorf("helper sandbox %s: %w", c.Sandbox, err)
	}
	if h.ID == id {
		return fmt.Errorf("helper sandbox %s is the sandbox rolled back: %w", c.Sandbox, errdefs.ErrInvalidArgument)
	}
	_, conn, err := m.Exec(ctx, h.ID, v1.ExecRequest{Args: c.Command,
		Env: map[string]string{"MOLT_EFFECT": effect, "MOLT_IDEMPOTENCY_KEY": IdempotencyKey(effect)}})
	if err != nil {
		return fmt.Errorf("helper sandbox %s: %w", c.Sandbox, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// Its stdin is /dev/null (no Stdin in the request); the stream is
	// read only.
	var stderr bytes.Buffer
	for {
		typ, p, err := v1.ReadFrame(conn)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("helper sandbox %s: the command's stream ended without an exit status", c.Sandbox)
			}
			return err
		}
		switch typ {
		case v1.FrameStderr:
			if stderr.Len() < 512 {
				stderr.Write(p)
			}
		case v1.FrameError:
			return fmt.Errorf("helper sandbox %s: %s", c.Sandbox, p)
		case v1.FrameExit:
			var st v1.ExitStatus
			if err := json.Unmarshal(p, &st); err != nil {
				return err
			}
			if st.ExitCode == 0 && st.Signal == "" && !st.TimedOut {
				return nil
			}
			what := fmt.Sprintf("exit status %d", st.ExitCode)
			if st.Signal != "" {
				what = "killed by " + st.Signal
			}
			msg := strings.TrimSpace(stderr.String())
			if len(msg) > 256 {
				msg = msg[:256]
			}
			return fmt.Errorf("%s in %s: %s: %s", strings.Join(c.Command, " "), c.Sandbox, what, msg)
		}
	}
}

// resumeCompensations, at start-up, finishes the compensations a daemon
// that died left open, in the background (the helper sandboxes and the
// egress are up by then): planned ones whose rollback did not happen
// (their effects are still on the sandbox's line) are cancelled, the
// others run, an interrupted attempt again with the same idempotency
// key.
func (m *Manager) resumeCompensations() {
	type job struct{ sb, ck, batch string }
	var jobs []job
	for _, sb := range m.ledger.Sandboxes() {
		open := m.ledger.OpenCompensations(sb)
		if len(open) == 0 {
			continue
		}
		orphan := map[string]bool{}
		for _, o := range m.ledger.Orphans(sb) {
			orphan[o.ID] = true
		}
		seen := map[string]bool{}
		var cancel []string
		for _, r := range open {
			if r.Origin != "" {
				// A fork's copy of its sandbox's record: the sandbox
				// that made the effect compensates it, once.
				continue
			}
			c := r.Compensation
			if c.State == ledger.CompPlanned && !orphan[r.ID] {
				cancel = append(cancel, r.ID)
				continue
			}
			if !seen[c.Batch] {
				seen[c.Batch] = true
				jobs = append(jobs, job{sb, c.Rollback, c.Batch})
			}
		}
		if len(cancel) > 0 {
			m.log.Warn("compensations planned by a rollback a crash stopped before it switched the sandbox: cancelled", "sandbox", sb, "effects", cancel)
			if err := m.ledger.Cancel(sb, cancel, "the rollback did not happen (the daemon stopped before it switched the sandbox)"); err != nil {
				m.log.Warn("effect ledger: cannot cancel planned compensations", "sandbox", sb, "err", err)
			}
		}
	}
	if len(jobs) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.compWG.Add(1)
	go func() {
		defer m.compWG.Done()
		defer cancel()
		go func() {
			select {
			case <-m.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		for _, j := range jobs {
			if ctx.Err() != nil {
				return
			}
			_, unlock, err := m.lockSandbox(j.sb)
			if err != nil {
				m.log.Warn("cannot resume compensations", "sandbox", j.sb, "err", err)
				continue
			}
			m.log.Info("resuming compensations a crash interrupted", "sandbox", j.sb, "checkpoint", j.ck)
			rep := m.compensate(ctx, j.sb, j.ck, j.batch)
			unlock()
			m.log.Info("compensations resumed", "sandbox", j.sb, "state", rep.State, "compensated", len(rep.Compensated), "failed", len(rep.Failed))
		}
	}()
}

// SetCompensator gives effect id a compensator after the fact.
func (m *Manager) SetCompensator(ctx context.Context, id string, c v1.Compensator) (ledger.Record, error) {
	sb, ok := m.ledger.Find(id)
	if !ok {
		return ledger.Record{}, fmt.Errorf("effect %s: %w", id, errdefs.ErrNotFound)
	}
	r, err := m.ledger.SetCompensator(sb, id, toLedgerCompensator(c))
	return m.effectView(r), err
}

func toLedgerCompensator(c v1.Compensator) ledger.Compensator {
	return ledger.Compensator{Method: strings.ToUpper(c.Method), URL: c.URL, Header: c.Header, Body: c.Body, Sandbox: c.Sandbox, Command: c.Command}
}
