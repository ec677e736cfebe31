package ledger

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
)

// List returns sb's records in Seq order, each in its latest state,
// those after the record after only ("" = all).
func (l *Ledger) List(sb, after string) ([]Record, error) {
	if err := checkName(sb); err != nil {
		return nil, err
	}
	s, err := l.get(sb, false)
	if err != nil || s == nil {
		if err == nil && after != "" {
			err = fmt.Errorf("ledger %s: list after %s: no such record: %w", sb, after, errdefs.ErrNotFound)
		}
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return nil, fmt.Errorf("ledger %s: %w", sb, err)
	}
	from := 0
	if after != "" {
		i, ok := s.st.byID[after]
		if !ok {
			return nil, fmt.Errorf("ledger %s: list after %s: no such record: %w", sb, after, errdefs.ErrNotFound)
		}
		from = i + 1
	}
	out := make([]Record, 0, len(s.st.recs)-from)
	for _, r := range s.st.recs[from:] {
		out = append(out, *r)
	}
	return out, nil
}

// Get returns record id of sb's ledger.
func (l *Ledger) Get(sb, id string) (Record, bool) {
	s := l.peek(sb)
	if s == nil {
		return Record{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return Record{}, false
	}
	i, ok := s.st.byID[id]
	if !ok {
		return Record{}, false
	}
	return *s.st.recs[i], true
}

// Orphans returns the committed records of sb's ledger that its line
// does not reach (see Match), in Seq order.
func (l *Ledger) Orphans(sb string) []Record {
	s := l.peek(sb)
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil
	}
	var out []Record
	for i, r := range s.st.recs {
		if s.st.orphan(i) {
			out = append(out, *r)
		}
	}
	return out
}

// Remove deletes sb's ledger. A sandbox without one is not an error.
func (l *Ledger) Remove(sb string) error {
	if err := checkName(sb); err != nil {
		return err
	}
	l.mu.Lock()
	_, broken := l.broken[sb]
	delete(l.broken, sb)
	l.mu.Unlock()
	if broken {
		if err := os.Remove(l.path(sb)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("ledger %s: %w", sb, err)
		}
		return syncDir(l.dir)
	}
	s, err := l.get(sb, false)
	if err != nil || s == nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil
	}
	s.gone = true
	l.mu.Lock()
	if l.sbs[sb] == s {
		delete(l.sbs, sb)
	}
	l.mu.Unlock()
	if s.f == nil {
		return nil
	}
	s.syncMu.Lock()
	s.sf = nil
	s.syncMu.Unlock()
	s.f.Close()
	s.f = nil
	if err := os.Remove(l.path(sb)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ledger %s: %w", sb, err)
	}
	return syncDir(l.dir)
}

// Sandboxes returns the sandboxes that have a ledger file, sorted.
func (l *Ledger) Sandboxes() []string {
	l.mu.Lock()
	sbs := make(map[string]*sandbox, len(l.sbs))
	maps.Copy(sbs, l.sbs)
	l.mu.Unlock()
	var out []string
	for name, s := range sbs {
		s.mu.Lock()
		if !s.gone && s.f != nil {
			out = append(out, name)
		}
		s.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// Consume records that c acted on record id of sb. Durable.
func (l *Ledger) Consume(sb, id string, c Consumer) (Record, error) {
	if err := checkName(sb); err != nil {
		return Record{}, err
	}
	if c.By == "" || len(c.By) > 256 || len(c.Note) > 4096 {
		return Record{}, fmt.Errorf("ledger %s: a consumer names who (at most 256 bytes; a note at most 4096): %w", sb, errdefs.ErrInvalidArgument)
	}
	if c.At.IsZero() {
		c.At = time.Now()
	}
	c.At = c.At.UTC()
	s, err := l.get(sb, false)
	if err != nil {
		return Record{}, err
	}
	if s == nil {
		return Record{}, fmt.Errorf("ledger %s: record %s: %w", sb, id, errdefs.ErrNotFound)
	}
	s.mu.Lock()
	r, gen, err := s.consume(l.path(sb), id, c)
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
func (s *sandbox) consume(path, id string, c Consumer) (Record, uint64, error) {
	if err := s.usable(); err != nil {
		return Record{}, 0, err
	}
	i, ok := s.st.byID[id]
	if !ok {
		return Record{}, 0, fmt.Errorf("record %s: %w", id, errdefs.ErrNotFound)
	}
	if k := s.st.recs[i].Kind; k == Read {
		return Record{}, 0, fmt.Errorf("record %s is a read: only effects are consumed: %w", id, errdefs.ErrInvalidArgument)
	}
	gen, err := s.append(path, entry{Op: opUse, ID: id, Consumer: &c})
	if err != nil {
		return Record{}, 0, err
	}
	s.st.recs[i].Consumers = append(s.st.recs[i].Consumers, c)
	return *s.st.recs[i], gen, nil
}

// Find returns the sandbox whose ledger holds record id (its own record,
// not a fork's inherited copy).
func (l *Ledger) Find(id string) (string, bool) {
	l.mu.Lock()
	sbs := make(map[string]*sandbox, len(l.sbs))
	for k, v := range l.sbs {
		sbs[k] = v
	}
	l.mu.Unlock()
	for name, s := range sbs {
		s.mu.Lock()
		i, ok := s.st.byID[id]
		own := ok && s.st.recs[i].Origin == ""
		s.mu.Unlock()
		if own {
			return name, true
		}
	}
	return "", false
}

// WouldOrphan lists the committed records of sb that a rewind to head
// would orphan: on the current line, not on head's.
func (l *Ledger) WouldOrphan(sb, head string) ([]Record, error) {
	s := l.peek(sb)
	if s == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if head != "" && !s.st.has(head) {
		return nil, fmt.Errorf("ledger %s: %s: no such record: %w", sb, head, errdefs.ErrNotFound)
	}
	after := s.st.reachable(head)
	var out []Record
	for i, r := range s.st.recs {
		if s.st.reach[i] && !after[i] && r.live() {
			out = append(out, *r)
		}
	}
	return out, nil
}
