package ledger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Compensation: a rollback that orphans committed effects with a
// compensator undoes them in the world, dependents first. Every step is
// a durable line of the effect's ledger (op comp): planned before the
// rollback switches the sandbox's state, then for each attempt an
// intent (compensating, attempt n) before the compensator runs, and its
// outcome (retrying with the error, compensated, failed with the
// reason). A daemon that dies anywhere in between finds the open
// compensations at start-up (Open) and runs them again (Run): an
// interrupted attempt is sent again with the same idempotency key, so a
// service that honours it sees the effect undone once.

// ValidCompensator checks c's shape: an HTTP request or a command in a
// helper sandbox, not both.
func ValidCompensator(c *Compensator) error {
	if c == nil {
		return nil
	}
	httpReq := c.Method != "" || c.URL != "" || len(c.Header) > 0 || len(c.Body) > 0
	cmd := c.Sandbox != "" || len(c.Command) > 0
	switch {
	case httpReq && cmd:
		return fmt.Errorf("a compensator is an HTTP request or a command in a sandbox, not both: %w", errdefs.ErrInvalidArgument)
	case httpReq && (c.Method == "" || c.URL == ""):
		return fmt.Errorf("an HTTP compensator needs a method and a URL: %w", errdefs.ErrInvalidArgument)
	case cmd && (c.Sandbox == "" || len(c.Command) == 0):
		return fmt.Errorf("a command compensator needs a sandbox and a command: %w", errdefs.ErrInvalidArgument)
	case !httpReq && !cmd:
		return fmt.Errorf("an empty compensator: %w", errdefs.ErrInvalidArgument)
	case len(c.Body) > 1<<20:
		return fmt.Errorf("a compensator's body is at most 1 MiB: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// CheckDeps checks that every ID in deps is a record of sb's ledger
// before its next one: an effect depends only on earlier effects.
func (l *Ledger) CheckDeps(sb string, deps []string) error {
	for _, d := range deps {
		r, ok := l.Get(sb, d)
		if !ok {
			return fmt.Errorf("depends on %s: no such effect of sandbox %s: %w", d, sb, errdefs.ErrInvalidArgument)
		}
		if r.Kind == Read {
			return fmt.Errorf("depends on %s: a read, not an effect: %w", d, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// SetCompensator gives record id of sb a compensator (an agent learns
// how to undo a payment only after making it). Durable. Refused for a
// read, and while the record's compensation is under way or done.
func (l *Ledger) SetCompensator(sb, id string, c Compensator) (Record, error) {
	if err := ValidCompensator(&c); err != nil {
		return Record{}, err
	}
	return l.step(sb, id, func(r *Record) (entry, error) {
		if r.Kind == Read {
			return entry{}, fmt.Errorf("record %s is a read: only effects are compensated: %w", id, errdefs.ErrInvalidArgument)
		}
		if r.Compensation.Open() || r.Compensated() {
			return entry{}, fmt.Errorf("record %s is %s: %w", id, r.Compensation.State, errdefs.ErrFailedPrecondition)
		}
		return entry{Op: opUndo, ID: id, Compensator: &c}, nil
	}, func(st *state, i int, e entry) { st.recs[i].Compensator = e.Compensator })
}

// setCompensation writes record id's compensation step c. Durable.
func (l *Ledger) setCompensation(sb, id string, c Compensation) (Record, error) {
	if !validCompState(c.State) {
		return Record{}, fmt.Errorf("ledger %s: compensation state %q: %w", sb, c.State, errdefs.ErrInvalidArgument)
	}
	if c.At.IsZero() {
		c.At = time.Now()
	}
	c.At = c.At.UTC()
	return l.step(sb, id, func(r *Record) (entry, error) {
		return entry{Op: opComp, ID: id, Compensation: &c}, nil
	}, func(st *state, i int, e entry) { st.compensate(i, *e.Compensation) })
}

// step appends the line check makes for record id and applies it.
func (l *Ledger) step(sb, id string, check func(*Record) (entry, error), apply func(*state, int, entry)) (Record, error) {
	if err := checkName(sb); err != nil {
		return Record{}, err
	}
	s, err := l.get(sb, false)
	if err != nil {
		return Record{}, err
	}
	if s == nil {
		return Record{}, fmt.Errorf("ledger %s: record %s: %w", sb, id, errdefs.ErrNotFound)
	}
	s.mu.Lock()
	r, gen, err := s.step(l.path(sb), id, check, apply)
	s.mu.Unlock()
	if err == nil {
		err = l.commit(s, gen, true)
	}
	if err != nil {
		return Record{}, fmt.Errorf("ledger %s: %w", sb, err)
	}
	return r, nil
}

// +checklocks:s.mu
func (s *sandbox) step(path, id string, check func(*Record) (entry, error), apply func(*state, int, entry)) (Record, uint64, error) {
	if err := s.usable(); err != nil {
		return Record{}, 0, err
	}
	i, ok := s.st.byID[id]
	if !ok {
		return Record{}, 0, fmt.Errorf("record %s: %w", id, errdefs.ErrNotFound)
	}
	e, err := check(s.st.recs[i])
	if err != nil {
		return Record{}, 0, err
	}
	gen, err := s.append(path, e)
	if err != nil {
		return Record{}, 0, err
	}
	apply(s.st, i, e)
	return *s.st.recs[i], gen, nil
}

// Plan marks the records ids of sb planned for compensation, as batch
// of the rollback to checkpoint ck. Durable: written before the
// rollback switches the sandbox, so that a crash past the switch still
// compensates.
func (l *Ledger) Plan(sb, ck, batch string, ids []string) error {
	for _, id := range ids {
		if _, err := l.setCompensation(sb, id, Compensation{State: CompPlanned, Rollback: ck, Batch: batch}); err != nil {
			return err
		}
	}
	return nil
}

// Cancel marks the planned records ids of sb cancelled: the rollback did
// not happen.
func (l *Ledger) Cancel(sb string, ids []string, why string) error {
	var errs []error
	for _, id := range ids {
		r, ok := l.Get(sb, id)
		if !ok || r.Compensation == nil || r.Compensation.State != CompPlanned {
			continue
		}
		c := *r.Compensation
		c.State, c.Error = CompCancelled, why
		if _, err := l.setCompensation(sb, id, c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// OpenCompensations returns sb's records whose compensation is under way
// (Compensation.Open), in Seq order.
func (l *Ledger) OpenCompensations(sb string) []Record {
	rs, err := l.List(sb, "")
	if err != nil {
		return nil
	}
	var out []Record
	for _, r := range rs {
		if r.Compensation.Open() {
			out = append(out, r)
		}
	}
	return out
}

// Batch returns sb's records of compensation batch b, in Seq order.
func (l *Ledger) Batch(sb, b string) []Record {
	rs, err := l.List(sb, "")
	if err != nil {
		return nil
	}
	var out []Record
	for _, r := range rs {
		if r.Compensation != nil && r.Compensation.Batch == b {
			out = append(out, r)
		}
	}
	return out
}

// Dependents returns, for each record of batch (one line's records, in
// Seq order), the records of the batch that depend on it: those naming
// it in DependsOn, and those without DependsOn that come after it (they
// may depend on any earlier record of their line).
func Dependents(batch []Record) map[string][]string {
	out := map[string][]string{}
	for j, r := range batch {
		if r.DependsOn == nil {
			for _, p := range batch[:j] {
				out[p.ID] = append(out[p.ID], r.ID)
			}
			continue
		}
		for _, d := range *r.DependsOn {
			out[d] = append(out[d], r.ID)
		}
	}
	return out
}

// RunOptions bound a batch's compensation.
type RunOptions struct {
	// Attempts per effect (at least 1); an attempt a crash interrupted
	// is always sent again, even past the limit: its outcome is unknown.
	Attempts int
	// Backoff before the second attempt, doubled before each next one.
	Backoff time.Duration
}

// Outcome is how one effect's compensation ended.
type Outcome struct {
	ID       string
	State    CompState // CompDone or CompFailed
	Attempts int
	Error    string
}

// Compensator runs one attempt of r's compensator: nil when it
// succeeded. attempt counts from 1.
type CompensatorFunc func(ctx context.Context, r Record, attempt int) error

// Run compensates sb's batch b, in reverse order of dependencies
// (Dependents): an effect is compensated only after every effect of the
// batch that depends on it was; when one of those failed, it is not
// compensated (failed: "dependent X's compensation failed"), and effects
// independent of the failure still are. Records of the batch already
// compensated or failed (a run a crash interrupted) keep their outcome.
// Each attempt writes an intent before run and its outcome after;
// failed attempts are retried after o.Backoff, doubled each time, up to
// o.Attempts. ctx ending stops Run between steps (the open records are
// left for the next Run).
func (l *Ledger) Run(ctx context.Context, sb, b string, o RunOptions, run CompensatorFunc) ([]Outcome, error) {
	batch := l.Batch(sb, b)
	deps := Dependents(batch)
	o.Attempts = max(o.Attempts, 1)
	byID := map[string]*Outcome{}
	var out []Outcome
	for _, r := range slices.Backward(batch) {
		c := *r.Compensation
		if c.State == CompCancelled {
			continue
		}
		oc := &Outcome{ID: r.ID, State: c.State, Attempts: c.Attempts, Error: c.Error}
		byID[r.ID] = oc
		if c.State == CompDone || c.State == CompFailed {
			out = append(out, *oc)
			continue
		}
		var failedDep string
		for _, d := range deps[r.ID] {
			if x := byID[d]; x != nil && x.State != CompDone {
				failedDep = d
				break
			}
		}
		if failedDep != "" {
			c.State, c.Error = CompFailed, fmt.Sprintf("dependent %s's compensation failed", failedDep)
			if _, err := l.setCompensation(sb, r.ID, c); err != nil {
				return out, err
			}
			oc.State, oc.Error = c.State, c.Error
			out = append(out, *oc)
			continue
		}
		if err := l.runOne(ctx, sb, r, &c, o, run); err != nil {
			return out, err
		}
		oc.State, oc.Attempts, oc.Error = c.State, c.Attempts, c.Error
		out = append(out, *oc)
	}
	return out, nil
}

// runOne compensates r, whose compensation is open, writing each step
// into c and the ledger.
func (l *Ledger) runOne(ctx context.Context, sb string, r Record, c *Compensation, o RunOptions, run CompensatorFunc) error {
	limit := o.Attempts
	if c.State == CompRunning {
		limit = max(limit, c.Attempts+1)
	}
	backoff := o.Backoff
	for {
		if r.Compensator == nil {
			c.State, c.Error = CompFailed, "no compensator"
			_, err := l.setCompensation(sb, r.ID, *c)
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		c.Attempts++
		c.State, c.Error = CompRunning, ""
		if _, err := l.setCompensation(sb, r.ID, *c); err != nil {
			return err
		}
		err := run(ctx, r, c.Attempts)
		if err == nil {
			c.State = CompDone
			_, err := l.setCompensation(sb, r.ID, *c)
			return err
		}
		if ctx.Err() != nil {
			// Stopped (the daemon is closing): the intent stays open
			// for the next start.
			return ctx.Err()
		}
		c.Error = err.Error()
		if c.Attempts >= limit {
			c.State = CompFailed
			c.Error = fmt.Sprintf("%d attempt(s), the last: %s", c.Attempts, err)
			_, err := l.setCompensation(sb, r.ID, *c)
			return err
		}
		c.State = CompRetrying
		if _, err := l.setCompensation(sb, r.ID, *c); err != nil {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		backoff *= 2
	}
}
