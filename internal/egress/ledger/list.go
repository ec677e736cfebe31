package ledger

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

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
