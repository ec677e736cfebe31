package ledger

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// append writes e to s's file, creating the file on the first write, and
// returns the append's generation for syncTo.
//
// +checklocks:s.mu
func (s *sandbox) append(path string, e entry) (uint64, error) {
	if s.err != nil {
		return 0, fmt.Errorf("an earlier write failed: %w", s.err)
	}
	line, err := s.c.encode(e)
	if err != nil {
		return 0, err
	}
	if s.f == nil {
		if err := s.create(path); err != nil {
			return 0, err
		}
	}
	if torn, err := writeAll(s.f, s.size, line); err != nil {
		if torn {
			// The next append would follow a torn line, which Open
			// would take for corruption.
			s.err = err
		}
		return 0, err
	}
	s.size += int64(len(line))
	return s.written.Add(1), nil
}

// create makes s's file. O_EXCL: a file this Ledger did not load is not
// appended to.
//
// +checklocks:s.mu
func (s *sandbox) create(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	// The name must survive a host crash as the synced lines do.
	if err := syncDir(filepath.Dir(path)); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	s.f = f
	s.syncMu.Lock()
	s.sf = f
	s.syncMu.Unlock()
	return nil
}

// syncTo returns once every append up to generation gen is on disk. One
// fdatasync covers every append made before it starts, so concurrent
// callers share it.
func (s *sandbox) syncTo(gen uint64) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	if s.synced >= gen {
		return nil
	}
	if s.syncErr != nil {
		return s.syncErr
	}
	if s.sf == nil {
		// Closed or removed: Close synced before closing, Remove deleted.
		return nil
	}
	g := s.written.Load()
	if err := unix.Fdatasync(int(s.sf.Fd())); err != nil {
		// After a failed fdatasync the kernel may have dropped the
		// pages: what is on disk is unknown from here on.
		s.syncErr = fmt.Errorf("fdatasync: %w", err)
		return s.syncErr
	}
	s.synced = g
	return nil
}

// commit makes generation gen of s durable now (now set) or hands it to
// the group commit. A failed sync stops further writes to s.
func (l *Ledger) commit(s *sandbox, gen uint64, now bool) error {
	if !now {
		l.dirtyMu.Lock()
		l.dirty[s] = struct{}{}
		l.dirtyMu.Unlock()
		select {
		case l.kick <- struct{}{}:
		default:
		}
		return nil
	}
	if err := s.syncTo(gen); err != nil {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		return err
	}
	return nil
}

// flushLoop is the group commit of read records: woken by commit, it
// syncs every sandbox written since, so the appends that arrive during
// one fdatasync share the next. It runs until Close and flushes once
// more on the way out.
func (l *Ledger) flushLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.kick:
			l.flush()
		case <-l.done:
			l.flush()
			return
		}
	}
}

func (l *Ledger) flush() {
	l.dirtyMu.Lock()
	dirty := l.dirty
	l.dirty = map[*sandbox]struct{}{}
	l.dirtyMu.Unlock()
	for s := range dirty {
		if err := s.syncTo(s.written.Load()); err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
		}
	}
}
