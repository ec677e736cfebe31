package audit

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned by Append after Close.
var ErrClosed = errors.New("audit log closed") // +checklocksignore: never changes

// FileName is the log's file in its directory; AnchorName the default
// anchor's.
const (
	FileName   = "audit.log"
	AnchorName = "audit.anchor"
)

// Options configure Open.
type Options struct {
	// Anchor keeps the latest (seq, hash) elsewhere; nil: a FileAnchor
	// at <dir>/audit.anchor.
	Anchor Anchor
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// Repair is a torn last line Open cut: a crash in the middle of an
// append. Nothing it held had been acknowledged.
type Repair struct {
	Offset int64 // where the file now ends
	Bytes  int64 // how many bytes were cut
}

// Damage is a segment Open set aside: the log did not verify before its
// last line, or did not reach its anchor.
type Damage struct {
	Moved  string // where the damaged file now is
	Seq    uint64 // the first bad seq
	Reason string
}

// Log is the audit log of one daemon. It is safe for concurrent use.
type Log struct {
	mu     sync.Mutex
	file   *os.File // +checklocks:mu
	head   Head     // +checklocks:mu
	size   int64    // +checklocks:mu
	err    error    // +checklocks:mu
	closed bool     // +checklocks:mu

	// checklocks needs one name per field line.
	dir    string
	path   string
	anchor Anchor
	now    func() time.Time // +checklocksignore: set by Open
	// What Open found, read-only after.
	repair        *Repair
	damage        *Damage
	anchorProblem string

	syncMu  sync.Mutex
	sf      *os.File // +checklocks:syncMu
	synced  uint64   // +checklocks:syncMu
	syncErr error    // +checklocks:syncMu
	// syncs counts the log's fdatasyncs (tests).
	syncs uint64 // +checklocks:syncMu
	// The head the anchor should name next (the last synced) and the
	// seq it names.
	anchorWant Head   // +checklocks:syncMu
	anchored   uint64 // +checklocks:anchorMu
	anchorErr  error  // +checklocks:syncMu

	// anchorMu orders the anchor's stores.
	anchorMu   sync.Mutex
	kick       chan struct{}
	anchorKick chan struct{}
	done       chan struct{}
	wg         sync.WaitGroup
}

// Open opens the log in dir (created 0700), checks it against its
// anchor, cuts a torn last line and sets a damaged segment aside (see the
// package doc); Repaired, Damaged and AnchorProblem say what it did.
func Open(dir string, opts Options) (*Log, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{dir: dir, path: filepath.Join(dir, FileName), anchor: opts.Anchor, now: opts.Now,
		kick: make(chan struct{}, 1), anchorKick: make(chan struct{}, 1), done: make(chan struct{})}
	if l.anchor == nil {
		l.anchor = &FileAnchor{Path: filepath.Join(dir, AnchorName)}
	}
	if l.now == nil {
		l.now = time.Now
	}
	l.mu.Lock()
	err := l.load()
	if err != nil && l.file != nil {
		l.file.Close()
	}
	f, head := l.file, l.head
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	l.syncMu.Lock()
	l.sf, l.synced, l.anchorWant = f, head.Seq, head
	l.syncMu.Unlock()
	l.anchorMu.Lock()
	l.anchored = head.Seq
	l.anchorMu.Unlock()
	l.wg.Add(2)
	go l.flushLoop()
	go l.anchorLoop()
	return l, nil
}

// load reads the file and leaves l.file open for appends at a good end.
//
// +checklocks:l.mu
func (l *Log) load() error {
	ah, haveAnchor, aerr := l.anchor.Load()
	if aerr != nil {
		l.anchorProblem = aerr.Error()
	}
	f, err := l.openFile()
	if err != nil {
		return err
	}
	l.file = f
	c := &chain{}
	if haveAnchor {
		c.anchor = &ah
	}
	res := scan(f, c)
	l.head = c.head
	if c.n == 0 {
		l.head = Head{Hash: ZeroHash}
	}
	l.size = res.valid
	damage := res.err
	if damage == nil {
		// A torn line is never anchored (the anchor follows the sync):
		// a cut within the anchored part is damage.
		damage = c.checkAnchor()
	}
	if damage != nil {
		return l.newSegment(c.head.Seq+1, damage)
	}
	if res.torn {
		if err := f.Truncate(res.valid); err != nil {
			return fmt.Errorf("audit %s: cutting the torn last line: %w", l.path, err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("audit %s: cutting the torn last line: %w", l.path, err)
		}
		l.repair = &Repair{Offset: res.valid, Bytes: res.size - res.valid}
	}
	if !haveAnchor && aerr == nil && c.n > 0 {
		l.anchorProblem = "no anchor for a log of " + fmt.Sprint(c.n) + " entries: a cut tail before now would not be detected"
	}
	if !haveAnchor || aerr != nil {
		return l.anchor.Reset(l.head)
	}
	return nil
}

func (l *Log) openFile() (*os.File, error) {
	_, err := os.Stat(l.path)
	created := errors.Is(err, os.ErrNotExist)
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if created {
		if err := syncDir(l.dir); err != nil {
			f.Close()
			return nil, fmt.Errorf("audit: %w", err)
		}
	}
	return f, nil
}

// newSegment sets the damaged file aside and starts a new chain whose
// first entry says why.
//
// +checklocks:l.mu
func (l *Log) newSegment(badSeq uint64, why error) error {
	l.file.Close()
	l.file = nil
	moved := fmt.Sprintf("%s.damaged-%s", l.path, l.now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(l.path, moved); err != nil {
		return fmt.Errorf("audit: setting the damaged log aside: %w", err)
	}
	l.damage = &Damage{Moved: moved, Seq: badSeq, Reason: why.Error()}
	f, err := l.openFile()
	if err != nil {
		return err
	}
	l.file, l.head, l.size = f, Head{Hash: ZeroHash}, 0
	e := Entry{Kind: KindSegment, Note: fmt.Sprintf("new segment: the previous one, set aside as %s, is damaged at seq %d: %s",
		filepath.Base(moved), badSeq, why)}
	e, line, err := l.prepare(e)
	if err != nil {
		return err
	}
	if _, err := f.Write(line); err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		return fmt.Errorf("audit: fdatasync: %w", err)
	}
	l.head, l.size = Head{Seq: e.Seq, Hash: e.Hash}, int64(len(line))
	return l.anchor.Reset(l.head)
}

// Repaired returns the torn line Open cut, if any.
func (l *Log) Repaired() *Repair { return l.repair }

// Damaged returns the damaged segment Open set aside, if any.
func (l *Log) Damaged() *Damage { return l.damage }

// AnchorProblem says what was wrong with the anchor at Open ("" if
// nothing); Open replaced it with the log's head.
func (l *Log) AnchorProblem() string { return l.anchorProblem }

// Path returns the log's file.
func (l *Log) Path() string { return l.path }

// prepare numbers e after l.head and encodes it.
//
// +checklocks:l.mu
func (l *Log) prepare(e Entry) (Entry, []byte, error) {
	e.Seq, e.Prev = l.head.Seq+1, l.head.Hash
	if e.Time.IsZero() {
		e.Time = l.now()
	}
	e.Time = e.Time.UTC()
	e.bound()
	line, sum, err := encode(e)
	e.Hash = sum
	return e, line, err
}

// Append adds e (Seq, Prev and Hash are set; Time when zero) and returns
// it once it is on disk. The anchor is brought to it (or a later entry)
// right after, in the background: see the package doc.
func (l *Log) Append(e Entry) (Entry, error) {
	e, err := l.write(e)
	if err != nil {
		return e, err
	}
	return e, l.syncTo(e.Seq)
}

// AppendAsync adds e as Append does but returns once it is written: a
// background flush syncs it a few milliseconds later, so a host crash
// may lose it (a daemon crash does not).
func (l *Log) AppendAsync(e Entry) (Entry, error) {
	e, err := l.write(e)
	if err != nil {
		return e, err
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return e, nil
}

// Sync returns once every entry written so far is on disk and anchored.
func (l *Log) Sync() error {
	l.mu.Lock()
	seq := l.head.Seq
	l.mu.Unlock()
	if err := l.syncTo(seq); err != nil {
		return err
	}
	return l.storeAnchor()
}

func (l *Log) write(e Entry) (Entry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return e, ErrClosed
	}
	if l.err != nil {
		return e, fmt.Errorf("audit: an earlier write failed: %w", l.err)
	}
	e, line, err := l.prepare(e)
	if err != nil {
		return e, err
	}
	n, err := l.file.Write(line)
	if err != nil {
		if n > 0 {
			// A torn line: nothing may follow it (Open would take the
			// next line for damage).
			l.err = err
		}
		return e, fmt.Errorf("audit: %w", err)
	}
	l.head = Head{Seq: e.Seq, Hash: e.Hash}
	l.size += int64(len(line))
	return e, nil
}

// syncTo returns once entry seq is on disk and hands the anchor's update
// to anchorLoop. One fdatasync covers every entry written before it starts,
// so concurrent callers share it.
func (l *Log) syncTo(seq uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.synced >= seq {
		return nil
	}
	if l.syncErr != nil {
		return l.syncErr
	}
	if l.sf == nil {
		return nil // closed: Close synced
	}
	l.mu.Lock()
	h := l.head
	l.mu.Unlock()
	l.syncs++
	if err := unix.Fdatasync(int(l.sf.Fd())); err != nil {
		// After a failed fdatasync the kernel may have dropped the
		// pages: what is on disk is unknown from here on.
		l.syncErr = fmt.Errorf("audit: fdatasync: %w", err)
		l.mu.Lock()
		l.err = l.syncErr
		l.mu.Unlock()
		return l.syncErr
	}
	l.synced, l.anchorWant = h.Seq, h
	select {
	case l.anchorKick <- struct{}{}:
	default:
	}
	return nil
}

// anchorLoop brings the anchor to the last synced entry, until Close.
func (l *Log) anchorLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.anchorKick:
		case <-l.done:
			return
		}
		_ = l.storeAnchor() // kept in anchorErr
	}
}

// storeAnchor stores the last synced head in the anchor. The stores are
// ordered, so the anchor never goes back.
func (l *Log) storeAnchor() error {
	l.anchorMu.Lock()
	defer l.anchorMu.Unlock()
	l.syncMu.Lock()
	h := l.anchorWant
	l.syncMu.Unlock()
	if l.anchored >= h.Seq {
		return nil
	}
	err := l.anchor.Store(h)
	if err == nil {
		l.anchored = h.Seq
	}
	l.syncMu.Lock()
	l.anchorErr = err
	l.syncMu.Unlock()
	return err
}

// flushLoop syncs what AppendAsync wrote, until Close.
func (l *Log) flushLoop() {
	defer l.wg.Done()
	for {
		select {
		case <-l.kick:
		case <-l.done:
			return
		}
		l.mu.Lock()
		seq := l.head.Seq
		l.mu.Unlock()
		_ = l.syncTo(seq) // a failure stops further appends (l.err)
	}
}

// Head returns the last entry written.
func (l *Log) Head() Head {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

// Close syncs what is written and closes the log.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	seq := l.head.Seq
	l.mu.Unlock()
	close(l.done)
	l.wg.Wait()
	err := l.syncTo(seq)
	if err == nil {
		err = l.storeAnchor()
	}
	l.syncMu.Lock()
	l.sf = nil
	l.syncMu.Unlock()
	l.mu.Lock()
	if cerr := l.file.Close(); err == nil {
		err = cerr
	}
	l.mu.Unlock()
	if c, ok := l.anchor.(io.Closer); ok {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// snapshot opens the file for reading and returns how many bytes of
// whole lines it holds now.
func (l *Log) snapshot() (*os.File, int64, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, 0, fmt.Errorf("audit: %w", err)
	}
	l.mu.Lock()
	n := l.size
	l.mu.Unlock()
	return f, n, nil
}

// Export writes the entries after seq since, as they are in the file.
func (l *Log) Export(w io.Writer, since uint64) error {
	f, n, err := l.snapshot()
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReaderSize(io.LimitReader(f, n), 64<<10)
	bw := bufio.NewWriterSize(w, 64<<10)
	for {
		line, err := readLine(br)
		if len(line) > 0 && err == nil {
			if seq, ok := lineSeq(line); !ok || seq > since {
				if _, werr := bw.Write(line); werr != nil {
					return werr
				}
			}
		}
		if err == io.EOF {
			return bw.Flush()
		}
		if err != nil {
			return err
		}
	}
}

// Verify checks the log as it is on disk now against its anchor.
func (l *Log) Verify() (Report, error) {
	l.syncMu.Lock()
	aerr := l.anchorErr
	l.syncMu.Unlock()
	if aerr != nil {
		return Report{}, fmt.Errorf("audit anchor: the last update failed: %w", aerr)
	}
	// The anchor first: it never names an entry the file does not hold
	// by the time the file is read.
	ah, ok, err := l.anchor.Load()
	if err != nil {
		return Report{}, err
	}
	f, n, err := l.snapshot()
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	var a *Head
	if ok {
		a = &ah
	}
	return verify(io.LimitReader(f, n), a, false), nil
}
