package ledger

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/secret"
)

// ErrClosed is returned by a Ledger's methods after Close.
var ErrClosed = errors.New("ledger closed")

// Ledger holds the ledgers of every sandbox, one file each in its
// directory (file.go has the format). It is safe for concurrent use.
// Records it returns share their Response with it: read them only.
//
// Durability: Begin, Finish, Rewind and Fork return once what they wrote
// is on disk (fdatasync) when it concerns an effect or opaque record.
// A read record's lines are written (write(2)) before Begin or Finish
// returns and synced by a background group commit a few milliseconds
// later: they survive a daemon crash at once (the page cache has them)
// and a host crash once synced, so a host crash may lose the last reads.
// Concurrent syncs of one file share one fdatasync.
//
// Locks: a sandbox's mu before Ledger.mu; a sandbox's mu before its
// syncMu; dirtyMu is taken alone. Ledger.mu is never held while waiting
// for a sandbox's mu that another goroutine may hold (Fork locks the
// child's before publishing it). Fork holds the new child's mu while it
// takes the parent's: children are always newer, so no cycle forms.
type Ledger struct {
	dir     string
	repairs []Repair      // set by Open, read-only after
	vault   *secret.Vault // redacts and seals payloads (seal.go); nil: none

	mu     sync.Mutex
	sbs    map[string]*sandbox // +checklocks:mu
	broken map[string]error    // +checklocks:mu
	closed bool                // +checklocks:mu

	dirtyMu sync.Mutex
	dirty   map[*sandbox]struct{} // +checklocks:dirtyMu
	kick    chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	onAppend atomic.Pointer[func(Record)]
}

// OnAppend sets fn (nil: none) to be called with every record Begin
// appends and Finish completes, once it is written (as durable as the
// call that wrote it), outside the ledger's locks. fn must not call the
// Ledger. The daemon's audit log uses it.
func (l *Ledger) OnAppend(fn func(Record)) {
	if fn == nil {
		l.onAppend.Store(nil)
		return
	}
	l.onAppend.Store(&fn)
}

func (l *Ledger) appended(r Record) {
	if fn := l.onAppend.Load(); fn != nil {
		(*fn)(l.View(r))
	}
}

// Broken returns the sandboxes whose ledger file Open refused (a bad
// line before the last), with the reasons. Their files are left as they
// are; every call about them fails until Remove deletes the file.
func (l *Ledger) Broken() map[string]error {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]error, len(l.broken))
	for k, v := range l.broken {
		out[k] = v
	}
	return out
}

// Repair is a torn last line that Open cut from a sandbox's file: a
// crash in the middle of an append. Nothing it held had been
// acknowledged as durable.
type Repair struct {
	Sandbox string
	Path    string
	Offset  int64 // where the file now ends
	Bytes   int64 // how many bytes were cut
}

type sandbox struct {
	mu sync.Mutex
	// c protects the lines of the file (seal.go); set at creation.
	c    codec    // +checklocks:mu
	st   *state   // +checklocks:mu
	f    *os.File // +checklocks:mu
	size int64    // +checklocks:mu
	// gone: removed or closed; whoever locks it looks the name up again.
	gone bool // +checklocks:mu
	// err: a write or sync failed; what the file holds is unknown, so
	// nothing more is written to it.
	err error // +checklocks:mu

	written atomic.Uint64 // appends made to f
	syncMu  sync.Mutex
	sf      *os.File // +checklocks:syncMu
	synced  uint64   // +checklocks:syncMu
	syncErr error    // +checklocks:syncMu
}

// validName reports whether sb is a sandbox ID usable as a file name.
func validName(sb string) bool {
	if len(sb) == 0 || len(sb) > 64 {
		return false
	}
	for _, c := range []byte(sb) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func checkName(sb string) error {
	if !validName(sb) {
		return fmt.Errorf("sandbox %q: want [a-z0-9-]{1,64}: %w", sb, errdefs.ErrInvalidArgument)
	}
	return nil
}

const suffix = ".ledger"

func (l *Ledger) path(sb string) string { return filepath.Join(l.dir, sb+suffix) }

func tmpName(sb string) string { return "." + sb + suffix + ".tmp" }

// Open opens the ledgers under dir, created (0700) if missing, and loads
// every sandbox's file. A torn last line is cut away (Repairs lists
// them); any other damage leaves that file as it is and its sandbox
// refusing every call (Broken lists them, with the file and line).
func Open(dir string) (*Ledger, error) { return OpenSealed(dir, nil) }

// OpenSealed is Open with v redacting and sealing the records' payloads
// in the files (seal.go), and View redacting them.
func OpenSealed(dir string, v *secret.Vault) (*Ledger, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	l := &Ledger{dir: dir, vault: v, sbs: map[string]*sandbox{}, broken: map[string]error{}, dirty: map[*sandbox]struct{}{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if sb, ok := strings.CutSuffix(strings.TrimPrefix(name, "."), suffix+".tmp"); ok && validName(sb) && name == tmpName(sb) {
			// A fork that crashed before its file was linked in.
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		sb, ok := strings.CutSuffix(name, suffix)
		if !ok || !validName(sb) || !e.Type().IsRegular() {
			continue
		}
		s, rep, err := openSandbox(dir, sb, codec{sb: sb, v: v})
		if err != nil {
			// One damaged ledger does not take the others down: it is
			// left as it is, and its sandbox records nothing (so its
			// proxy sends nothing) until it is repaired or removed.
			l.broken[sb] = err
			continue
		}
		if rep != nil {
			l.repairs = append(l.repairs, *rep)
		}
		l.sbs[sb] = s
	}
	if err := errors.Join(errs...); err != nil {
		for _, s := range l.sbs {
			s.mu.Lock()
			s.f.Close()
			s.mu.Unlock()
		}
		return nil, err
	}
	l.wg.Add(1)
	go l.flushLoop()
	return l, nil
}

func openSandbox(dir, sb string, c codec) (*sandbox, *Repair, error) {
	path := filepath.Join(dir, sb+suffix)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ledger: %w", err)
	}
	res, err := load(path, f, c)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	var rep *Repair
	if res.valid < res.size {
		err := f.Truncate(res.valid)
		if err == nil {
			err = unix.Fdatasync(int(f.Fd()))
		}
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("ledger %s: cutting the torn last line: %w", path, err)
		}
		rep = &Repair{Sandbox: sb, Path: path, Offset: res.valid, Bytes: res.size - res.valid}
	}
	s := &sandbox{c: c, st: res.state, f: f, size: res.valid, sf: f}
	return s, rep, nil
}

// Repairs lists the torn last lines Open cut away, for the caller to log.
func (l *Ledger) Repairs() []Repair { return slices.Clone(l.repairs) }

// Close syncs what is not yet synced and closes every file. The Ledger
// is unusable after.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	sbs := make([]*sandbox, 0, len(l.sbs))
	for _, s := range l.sbs {
		sbs = append(sbs, s)
	}
	l.mu.Unlock()
	close(l.done)
	l.wg.Wait()
	var errs []error
	for _, s := range sbs {
		s.mu.Lock()
		if err := s.close(); err != nil {
			errs = append(errs, err)
		}
		s.mu.Unlock()
	}
	return errors.Join(errs...)
}

// close syncs and closes s's file and marks s gone.
//
// +checklocks:s.mu
func (s *sandbox) close() error {
	s.gone = true
	if s.f == nil {
		return nil
	}
	err := s.syncTo(s.written.Load())
	s.syncMu.Lock()
	s.sf = nil
	s.syncMu.Unlock()
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	s.f = nil
	return err
}

// get returns sb's sandbox, unlocked, creating it (without a file) when
// create is set; nil when it has no ledger. Whoever locks it checks
// gone: it may have been removed since.
func (l *Ledger) get(sb string, create bool) (*sandbox, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	if err := l.broken[sb]; err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	s := l.sbs[sb]
	if s == nil && create {
		s = &sandbox{c: codec{sb: sb, v: l.vault}, st: newState()}
		l.sbs[sb] = s
	}
	return s, nil
}

// peek is get for the methods that report no error: an invalid,
// unknown or removed sandbox has an empty ledger.
func (l *Ledger) peek(sb string) *sandbox {
	if !validName(sb) {
		return nil
	}
	s, _ := l.get(sb, false)
	return s
}

// +checklocks:s.mu
func (s *sandbox) usable() error {
	if s.gone {
		return fmt.Errorf("removed or closed meanwhile: %w", errdefs.ErrUnavailable)
	}
	return nil
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func durableNow(k Kind) bool { return k == Effect || k == Opaque }

// Begin appends r to sandbox sb's current line and returns it with ID,
// Seq, Prev (the head before), Sandbox and Started (when zero) set; the
// head moves to it. State "" means Pending; a terminal state gets
// Finished set (when zero). A Replayed record joins the orphan ReplayOf
// to the line. The record is on disk when Begin returns for an effect or
// opaque record; a read's is synced soon after (see Ledger).
func (l *Ledger) Begin(sb string, r Record) (Record, error) {
	if err := checkName(sb); err != nil {
		return Record{}, err
	}
	if r.State == "" {
		r.State = Pending
	}
	if !validKind(r.Kind) || !validState(r.State) {
		return Record{}, fmt.Errorf("ledger %s: record of kind %q in state %q: %w", sb, r.Kind, r.State, errdefs.ErrInvalidArgument)
	}
	now := time.Now().UTC()
	if r.Started.IsZero() {
		r.Started = now
	}
	r.Started = r.Started.UTC()
	if r.State == Pending {
		r.Finished = time.Time{}
	} else if r.Finished.IsZero() {
		r.Finished = now
	}
	r.Finished = r.Finished.UTC()
	s, err := l.get(sb, true)
	if err != nil {
		return Record{}, err
	}
	r.Sandbox = sb
	s.mu.Lock()
	r, gen, err := s.begin(l.path(sb), r)
	s.mu.Unlock()
	if err == nil {
		err = l.commit(s, gen, durableNow(r.Kind))
	}
	if err != nil {
		return Record{}, fmt.Errorf("ledger %s: %w", sb, err)
	}
	l.appended(r)
	return r, nil
}

// +checklocks:s.mu
func (s *sandbox) begin(path string, r Record) (Record, uint64, error) {
	if err := s.usable(); err != nil {
		return Record{}, 0, err
	}
	r.Prev = s.st.head
	r.Seq = s.st.lastSeq + 1
	for r.ID = newID(); s.st.has(r.ID); r.ID = newID() {
	}
	if err := s.st.check(r, false); err != nil {
		return Record{}, 0, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	gen, err := s.append(path, entry{Op: opRec, Rec: &r})
	if err != nil {
		return Record{}, 0, err
	}
	s.st.advance(s.st.add(r))
	return r, gen, nil
}

// Finish completes the pending record id of sb as Completed or Failed.
// Durable as Begin is for the record's kind. The ledger keeps resp: the
// caller must not change it after.
func (l *Ledger) Finish(sb, id string, st State, resp *Response, errText string) (Record, error) {
	if err := checkName(sb); err != nil {
		return Record{}, err
	}
	if st != Completed && st != Failed {
		return Record{}, fmt.Errorf("ledger %s: finish %s as %q: want completed or failed: %w", sb, id, st, errdefs.ErrInvalidArgument)
	}
	s, err := l.get(sb, false)
	if err != nil {
		return Record{}, err
	}
	if s == nil {
		return Record{}, fmt.Errorf("ledger %s: finish %s: no such record: %w", sb, id, errdefs.ErrNotFound)
	}
	s.mu.Lock()
	r, gen, err := s.finish(l.path(sb), id, st, resp, errText)
	s.mu.Unlock()
	if err == nil {
		err = l.commit(s, gen, durableNow(r.Kind))
	}
	if err != nil {
		return Record{}, fmt.Errorf("ledger %s: %w", sb, err)
	}
	l.appended(r)
	return r, nil
}

// +checklocks:s.mu
func (s *sandbox) finish(path, id string, st State, resp *Response, errText string) (Record, uint64, error) {
	if err := s.usable(); err != nil {
		return Record{}, 0, err
	}
	i, ok := s.st.byID[id]
	if !ok {
		return Record{}, 0, fmt.Errorf("finish %s: no such record: %w", id, errdefs.ErrNotFound)
	}
	if cur := s.st.recs[i].State; cur != Pending {
		return Record{}, 0, fmt.Errorf("finish %s: it is %s, not pending: %w", id, cur, errdefs.ErrFailedPrecondition)
	}
	now := time.Now().UTC()
	gen, err := s.append(path, entry{Op: opFin, ID: id, State: st, Response: resp, Error: errText, Finished: now})
	if err != nil {
		return Record{}, 0, err
	}
	s.st.finish(i, st, resp, errText, now)
	return *s.st.recs[i], gen, nil
}

// Head returns sb's head record ID, "" when its line is empty.
func (l *Ledger) Head(sb string) string {
	s := l.peek(sb)
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return ""
	}
	return s.st.head
}

// Rewind moves sb's head to head, a record of sb's ledger or "" for the
// start: a rollback to a checkpoint taken at that head. Durable.
func (l *Ledger) Rewind(sb, head string) error {
	if err := checkName(sb); err != nil {
		return err
	}
	s, err := l.get(sb, false)
	if err != nil {
		return err
	}
	if s == nil {
		if head == "" {
			return nil
		}
		return fmt.Errorf("ledger %s: rewind to %s: no such record: %w", sb, head, errdefs.ErrNotFound)
	}
	s.mu.Lock()
	gen, err := s.rewind(l.path(sb), head)
	s.mu.Unlock()
	if err == nil && gen != 0 {
		err = l.commit(s, gen, true)
	}
	if err != nil {
		return fmt.Errorf("ledger %s: %w", sb, err)
	}
	return nil
}

// rewind moves the head; generation 0 when it was there already.
//
// +checklocks:s.mu
func (s *sandbox) rewind(path, head string) (uint64, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	if head != "" && !s.st.has(head) {
		return 0, fmt.Errorf("rewind to %s: no such record: %w", head, errdefs.ErrNotFound)
	}
	if head == s.st.head {
		return 0, nil
	}
	gen, err := s.append(path, entry{Op: opHead, Head: &head})
	if err != nil {
		return 0, err
	}
	s.st.setHead(head)
	s.st.rebuild()
	return gen, nil
}

// Match is what the ledger knows of a request about to be sent.
type Match struct {
	// Orphan is the earliest orphan equivalent to the request that can
	// answer it (a completed effect with a response).
	Orphan *Record
	// Pending is the earliest pending effect or opaque record (on the
	// line or orphaned) equivalent to the request: its outcome is
	// unknown, so the request must not be sent again.
	Pending *Record
	// Orphans counts the line's committed orphans not yet replayed: a
	// line with orphans is re-running history.
	Orphans int
}

// Match looks id up among sb's orphans and pending records (Equivalent).
// Orphans of the line are the committed records (Record.Committed) that
// the head does not reach through Prev links, nor through the ReplayOf
// of a Replayed record it reaches.
func (l *Ledger) Match(sb string, id Identity) Match {
	s := l.peek(sb)
	if s == nil {
		return Match{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return Match{}
	}
	return s.st.match(id)
}

// Fork gives sandbox child, which must have no ledger yet, a copy of
// every record of parent's (Origin set to the sandbox that wrote it; IDs
// and Seqs kept, so links hold), with child's head at head (a record of
// parent's, or ""). Durable. A parent without a ledger forks as empty.
func (l *Ledger) Fork(parent, child, head string) error {
	if err := checkName(parent); err != nil {
		return err
	}
	if err := checkName(child); err != nil {
		return err
	}
	if parent == child {
		return fmt.Errorf("ledger: fork %s from itself: %w", child, errdefs.ErrInvalidArgument)
	}
	c := &sandbox{c: codec{sb: child, v: l.vault}}
	c.mu.Lock()
	defer c.mu.Unlock()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.sbs[child] != nil {
		l.mu.Unlock()
		return fmt.Errorf("ledger: fork %s: it already has a ledger: %w", child, errdefs.ErrAlreadyExists)
	}
	l.sbs[child] = c
	l.mu.Unlock()
	if err := l.fork(c, parent, child, head); err != nil {
		c.gone = true
		l.mu.Lock()
		if l.sbs[child] == c {
			delete(l.sbs, child)
		}
		l.mu.Unlock()
		return err
	}
	return nil
}

// +checklocks:c.mu
func (l *Ledger) fork(c *sandbox, parent, child, head string) error {
	var st *state
	p, err := l.get(parent, false)
	if err != nil {
		return err
	}
	if p != nil {
		p.mu.Lock()
		st, err = p.forkState(parent, child, head)
		p.mu.Unlock()
	} else {
		st, err = newState().fork(parent, child, head)
	}
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	data, err := c.c.encodeState(st)
	if err != nil {
		return fmt.Errorf("ledger: fork %s: %w", child, err)
	}
	f, err := writeNew(l.dir, child, data)
	if err != nil {
		return fmt.Errorf("ledger: fork %s: %w", child, err)
	}
	c.st, c.f, c.size = st, f, int64(len(data))
	c.syncMu.Lock()
	c.sf = f
	c.syncMu.Unlock()
	return nil
}

// +checklocks:p.mu
func (p *sandbox) forkState(parent, child, head string) (*state, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	return p.st.fork(parent, child, head)
}

// writeNew creates sb's file holding data, synced, atomically: written
// under a temporary name and linked into place (link fails if the name
// exists), so a crash leaves either no file or all of it.
func writeNew(dir, sb string, data []byte) (*os.File, error) {
	tmp := filepath.Join(dir, tmpName(sb))
	path := filepath.Join(dir, sb+suffix)
	t, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	_, err = t.Write(data)
	if err == nil {
		err = unix.Fdatasync(int(t.Fd()))
	}
	if cerr := t.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%s exists: %w", path, errdefs.ErrAlreadyExists)
		}
		return nil, err
	}
	if err := syncDir(dir); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
