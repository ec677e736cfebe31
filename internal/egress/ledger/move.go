package ledger

import (
	"bytes"
	"fmt"

	"github.com/molt-sh/molt/internal/errdefs"
)

// MaxExport bounds a ledger that moves between hosts (Export, Import).
const MaxExport = 256 << 20

// Export returns sb's ledger as a file of its own (every record in its
// latest state, then the head) for another host's Import, or nil when sb
// has no ledger. A ledger with payloads this host seals (a vault) is not
// exported: the other host could not open them, and the plaintext does
// not leave the host. Without sealed payloads, the export is the file
// as this host writes it.
func (l *Ledger) Export(sb string) ([]byte, error) {
	if err := checkName(sb); err != nil {
		return nil, err
	}
	s, err := l.get(sb, false)
	if err != nil || s == nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return nil, fmt.Errorf("ledger %s: %w", sb, err)
	}
	if len(s.st.recs) == 0 && s.st.head == "" {
		return nil, nil
	}
	// As this host writes it: a payload it seals (one that holds a
	// secret, or every one with encryption at rest) stays.
	b, err := s.c.encodeState(s.st)
	if err != nil {
		return nil, fmt.Errorf("ledger %s: %w", sb, err)
	}
	for line := range bytes.Lines(b) {
		if e, err := decodeLine(bytes.TrimSuffix(line, []byte("\n"))); err != nil || len(e.Sealed) > 0 {
			return nil, fmt.Errorf("ledger %s holds payloads sealed with this host's data keys; moving them to another host is not supported yet: %w", sb, errdefs.ErrNotSupported)
		}
	}
	if len(b) > MaxExport {
		return nil, fmt.Errorf("ledger %s: %d bytes, more than %d can move: %w", sb, len(b), MaxExport, errdefs.ErrNotSupported)
	}
	return b, nil
}

// Import makes data, another host's Export, sb's ledger here, in place
// of the one sb has. data is checked whole first, as Open reads a file,
// except that nothing in it may be torn or sealed: an import that fails
// changes nothing. Durable.
func (l *Ledger) Import(sb string, data []byte) error {
	if err := checkName(sb); err != nil {
		return err
	}
	if len(data) > MaxExport {
		return fmt.Errorf("ledger %s: an import of %d bytes, more than %d: %w", sb, len(data), MaxExport, errdefs.ErrInvalidArgument)
	}
	res, err := load("the imported ledger of "+sb, bytes.NewReader(data), codec{sb: sb})
	if err == nil && res.valid != res.size {
		err = fmt.Errorf("its last line is cut at byte %d", res.valid)
	}
	if err == nil {
		for _, r := range res.state.recs {
			if r.Sandbox != sb {
				err = fmt.Errorf("record %s is sandbox %q's", r.ID, r.Sandbox)
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("ledger %s: import: %v: %w", sb, err, errdefs.ErrInvalidArgument)
	}
	c := codec{sb: sb, v: l.vault}
	out, err := c.encodeState(res.state)
	if err != nil {
		return fmt.Errorf("ledger %s: import: %w", sb, err)
	}
	if err := l.Remove(sb); err != nil {
		return err
	}
	s := &sandbox{c: c}
	s.mu.Lock()
	defer s.mu.Unlock()
	l.mu.Lock()
	switch {
	case l.closed:
		l.mu.Unlock()
		return ErrClosed
	case l.sbs[sb] != nil:
		l.mu.Unlock()
		return fmt.Errorf("ledger %s: import: written to meanwhile: %w", sb, errdefs.ErrConflict)
	}
	l.sbs[sb] = s
	l.mu.Unlock()
	f, err := writeNew(l.dir, sb, out)
	if err != nil {
		s.gone = true
		l.mu.Lock()
		if l.sbs[sb] == s {
			delete(l.sbs, sb)
		}
		l.mu.Unlock()
		return fmt.Errorf("ledger %s: import: %w", sb, err)
	}
	s.st, s.f, s.size = res.state, f, int64(len(out))
	s.syncMu.Lock()
	s.sf = f
	s.syncMu.Unlock()
	return nil
}
