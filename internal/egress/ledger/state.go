package ledger

import (
	"errors"
	"fmt"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
)

// state is one sandbox's ledger in memory: the records in Seq order, the
// head, which records the head's line reaches, and the indexes Match
// uses. It is not safe for concurrent use (sandbox.mu guards it).
type state struct {
	recs    []*Record
	byID    map[string]int // index in recs
	head    string
	lastSeq uint64
	// reach[i]: recs[i] is on the head's line, or was joined to it by a
	// replay. orphans counts the committed records that are not.
	reach   []bool
	orphans int
	// Candidates for Match: the records that were committed when added
	// (only those can be orphans or pending), by canonKey and idemKey.
	byKey  map[string][]int
	byIdem map[string][]int
}

func newState() *state {
	return &state{byID: map[string]int{}, byKey: map[string][]int{}, byIdem: map[string][]int{}}
}

func validKind(k Kind) bool { return k == Read || k == Effect || k == Opaque }

func validState(s State) bool {
	switch s {
	case Pending, Completed, Failed, Denied, Blocked, Replayed, Refused:
		return true
	}
	return false
}

// check validates r against the records before it and, when add is set,
// appends it (the head moves to it; reach is left for rebuild).
func (st *state) check(r Record, add bool) error {
	switch {
	case r.ID == "":
		return errors.New("record without an ID")
	case st.has(r.ID):
		return fmt.Errorf("record %s appears twice", r.ID)
	case r.Seq <= st.lastSeq:
		return fmt.Errorf("record %s has seq %d after seq %d", r.ID, r.Seq, st.lastSeq)
	case r.Prev != "" && !st.has(r.Prev):
		return fmt.Errorf("record %s follows unknown record %q", r.ID, r.Prev)
	case r.ReplayOf != "" && !st.has(r.ReplayOf):
		return fmt.Errorf("record %s replays unknown record %q", r.ID, r.ReplayOf)
	case !validKind(r.Kind):
		return fmt.Errorf("record %s has kind %q", r.ID, r.Kind)
	case !validState(r.State):
		return fmt.Errorf("record %s has state %q", r.ID, r.State)
	}
	if add {
		st.add(r)
	}
	return nil
}

func (st *state) has(id string) bool {
	_, ok := st.byID[id]
	return ok
}

// add appends r, moves the head to it and indexes it. The caller keeps
// reach right: Begin through advance, a load or fork through rebuild.
func (st *state) add(r Record) int {
	i := len(st.recs)
	st.recs = append(st.recs, &r)
	st.reach = append(st.reach, false)
	st.byID[r.ID] = i
	st.head = r.ID
	st.lastSeq = r.Seq
	if r.Committed() {
		k := canonKey(r.Request)
		st.byKey[k] = append(st.byKey[k], i)
		if ik := idemKey(r.Request); ik != "" {
			st.byIdem[ik] = append(st.byIdem[ik], i)
		}
	}
	return i
}

// advance marks recs[i], just added at the head after the old head, as
// on the line, and joins the orphan it replays. The new line is the old
// one plus these, so nothing else changes.
func (st *state) advance(i int) {
	st.reach[i] = true
	r := st.recs[i]
	if r.State == Replayed && r.ReplayOf != "" {
		st.join(st.byID[r.ReplayOf])
	}
}

func (st *state) join(j int) {
	if !st.reach[j] {
		st.reach[j] = true
		if st.recs[j].live() {
			st.orphans--
		}
	}
}

func (st *state) setHead(head string) { st.head = head }

// rebuild recomputes reach and orphans from the head: the records on the
// Prev chain, and the ones their replays answered from.
func (st *state) rebuild() {
	clear(st.reach)
	st.orphans = 0
	for _, r := range st.recs {
		if r.live() {
			st.orphans++
		}
	}
	for id := st.head; id != ""; {
		i := st.byID[id]
		st.join(i)
		r := st.recs[i]
		if r.State == Replayed && r.ReplayOf != "" {
			st.join(st.byID[r.ReplayOf])
		}
		id = r.Prev
	}
}

// reachable marks the records on head's line and those joined to it by
// replays, as rebuild does for the head.
func (st *state) reachable(head string) []bool {
	r := make([]bool, len(st.recs))
	for id := head; id != ""; {
		i := st.byID[id]
		r[i] = true
		rec := st.recs[i]
		if rec.State == Replayed && rec.ReplayOf != "" {
			r[st.byID[rec.ReplayOf]] = true
		}
		id = rec.Prev
	}
	return r
}

func (st *state) orphan(i int) bool { return !st.reach[i] && st.recs[i].live() }

// finish moves the pending recs[i] to its final state.
func (st *state) finish(i int, s State, resp *Response, errText string, at time.Time) {
	was := st.orphan(i)
	r := st.recs[i]
	r.State, r.Response, r.Error, r.Finished = s, resp, errText, at
	if was && !st.orphan(i) {
		st.orphans--
	}
}

// compensate sets recs[i]'s compensation to c.
func (st *state) compensate(i int, c Compensation) {
	was := st.orphan(i)
	st.recs[i].Compensation = &c
	switch now := st.orphan(i); {
	case was && !now:
		st.orphans--
	case !was && now:
		st.orphans++
	}
}

// match finds, among the records equivalent to id, the earliest orphan
// that can answer (a completed effect with a response) and the earliest
// pending effect.
func (st *state) match(id Identity) Match {
	m := Match{Orphans: st.orphans}
	var cands []int
	cands = append(cands, st.byKey[canonKey(id)]...)
	if ik := idemKey(id); ik != "" {
		cands = append(cands, st.byIdem[ik]...)
	}
	orphan, pending := -1, -1
	for _, i := range cands {
		r := st.recs[i]
		if !Equivalent(r.Request, id) {
			continue
		}
		// An effect being compensated may or may not be in the world:
		// as for a pending one, nothing equivalent is sent meanwhile.
		if (r.State == Pending && r.Committed() || r.Compensation.Open()) && (pending < 0 || i < pending) {
			pending = i
		}
		if st.orphan(i) && !r.Compensation.Open() && r.Kind == Effect && r.State == Completed && r.Response != nil && (orphan < 0 || i < orphan) {
			orphan = i
		}
	}
	if orphan >= 0 {
		c := *st.recs[orphan]
		m.Orphan = &c
	}
	if pending >= 0 {
		c := *st.recs[pending]
		m.Pending = &c
	}
	return m
}

// fork copies st for sandbox child of parent, the head at head.
func (st *state) fork(parent, child, head string) (*state, error) {
	if head != "" && !st.has(head) {
		return nil, fmt.Errorf("fork %s at %s: no such record in %s's ledger: %w", child, head, parent, errdefs.ErrNotFound)
	}
	c := newState()
	for _, r := range st.recs {
		cp := *r
		cp.Sandbox = child
		if cp.Origin == "" {
			cp.Origin = parent
		}
		c.add(cp)
	}
	c.setHead(head)
	c.rebuild()
	return c, nil
}
