package meta

import (
	"bytes"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The metadata store (molt.db) is the index of the pool, not its only
// copy. Every committed sandbox record is also on disk next to the
// sandbox's root (sandboxes/ID/sandbox.json), every committed checkpoint
// record in its manifest (checkpoints/ID/manifest.json, with committed
// set), every image record next to the image (images/.NAME.json). They
// are written by the store's watchers, after each transaction that
// changes the records, so no commit point can forget them. A database
// that is lost, emptied or corrupt (set aside as molt.db.corrupt-TIME)
// is rebuilt from them at start-up (rebuild.go); whatever cannot be
// explained goes to pool/quarantine, never away.
//
// The copies are written off the path of the operation that committed
// (writing one by rename cost 0.15-0.24 ms, 11.5-13.4 ms with its
// fsyncs, against a hot rollback of 2-8 ms: BenchmarkSandboxRecord;
// queueing it costs 0.2 µs): Copies' writer
// writes each at once and fsyncs them in batches, out of any capture's
// commit window. A copy a crash kept from being written is written at
// the next start from the database (Heal); only a database lost
// together with a crash in that instant (or a host crash within the
// batch) leaves a rebuild the copy before.
//
// Where the copies live, what a checkpoint's copy holds beyond its
// record and what is on disk are the engine's to know: it tells them
// through a Disk.

// flushDelay is how long the writer gathers written records before it
// fsyncs them.
const flushDelay = 200 * time.Millisecond

// A Disk is what meta needs of the pool to keep the records' copies
// and to rebuild from them; the engine fills it in.
type Disk struct {
	Log *slog.Logger

	// Where each record's copy lives.
	SandboxCopy  func(id string) string
	ImageCopy    func(name string) string
	ManifestCopy func(id string) string
	// CommittedManifest is the copy of checkpoint ck: its artifact's
	// manifest, marked committed.
	CommittedManifest func(ck CheckpointRecord) []byte
	// ManifestCurrent reports whether checkpoint ck's manifest on disk
	// is marked committed and agrees with ck.
	ManifestCurrent func(ck CheckpointRecord) bool
	// Background holds the pool's commits for the writer's fsyncs, so
	// that they stay out of any capture's commit window; it returns the
	// release.
	Background func() (release func(), err error)

	// For a rebuild (rebuild.go). List lists the pool's directory of a
	// kind of object: "images", "checkpoints" or "sandboxes".
	List func(kind string) []fs.DirEntry
	// ValidName checks the name of an object of kind "image" or
	// "sandbox".
	ValidName func(kind, name string) error
	// Checkpoint reads the record of checkpoint id from its artifact,
	// checked complete, or says why it cannot.
	Checkpoint func(id string) (CheckpointRecord, string)
	// SandboxRoot is the root of sandbox id.
	SandboxRoot func(id string) string
	// Quarantine moves path, which nothing explains, to
	// pool/quarantine under name.
	Quarantine func(path, name, why string) error
}

// Copies writes the on-disk copies of records. A put only queues its
// copy (the commit point pays for a map entry); the writer goroutine
// writes it at once, and fsyncs what it wrote in batches. A delete
// removes its copy before it returns, after any write of it under way,
// and drops a queued one: the caller removes the directory next, and a
// late write there would keep it from going.
type Copies struct {
	db   *DB
	p    *Disk
	kick chan struct{}
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu sync.Mutex
	// by file: the newest copy to write
	pending map[string]copyWrite // +checklocks:mu

	wmu sync.Mutex // held while a file is written or removed
	// by file: transaction of the last write or removal
	written map[string]uint64 // +checklocks:wmu
	// files written, not yet fsynced
	dirty map[string]bool // +checklocks:wmu
}

// A copyWrite is a record's copy to write: the record's encoding, made
// into a committed manifest first if manifest is set.
type copyWrite struct {
	txid     uint64
	b        []byte
	manifest bool
}

// KeepCopies makes the store's changes of sandbox, checkpoint and
// image records reach their on-disk copies, and starts the writer,
// which Close stops.
func (d *DB) KeepCopies(p *Disk) *Copies {
	c := &Copies{
		db: d, p: p,
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		pending: map[string]copyWrite{},
		written: map[string]uint64{},
		dirty:   map[string]bool{},
	}
	d.Watch(Sandboxes, func(txid uint64, id string, b []byte) {
		c.queue(p.SandboxCopy(id), copyWrite{txid: txid, b: b})
	})
	d.Watch(Images, func(txid uint64, name string, b []byte) {
		c.queue(p.ImageCopy(name), copyWrite{txid: txid, b: b})
	})
	d.Watch(Checkpoints, func(txid uint64, id string, b []byte) {
		c.queue(p.ManifestCopy(id), copyWrite{txid: txid, b: b, manifest: true})
	})
	c.wg.Add(1)
	go c.run()
	return c
}

// queue queues w for file (a put), or removes file (a delete, b nil)
// unless a later transaction already wrote it.
func (c *Copies) queue(file string, w copyWrite) {
	if w.b == nil {
		c.remove(file, w.txid)
		return
	}
	c.mu.Lock()
	if p, ok := c.pending[file]; !ok || p.txid <= w.txid {
		c.pending[file] = w
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// remove removes file, the copy of a record transaction txid deleted,
// and drops a queued write of it.
func (c *Copies) remove(file string, txid uint64) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if p, ok := c.pending[file]; ok && p.txid <= txid {
		delete(c.pending, file)
	}
	c.mu.Unlock()
	if txid < c.written[file] {
		return
	}
	c.written[file] = txid
	delete(c.dirty, file)
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.p.Log.Warn("cannot remove the on-disk copy of a deleted record", "file", file, "err", err)
	}
}

// run writes the queued copies as they come and fsyncs them, with
// their directories, in batches of flushDelay, until Close.
func (c *Copies) run() {
	defer c.wg.Done()
	var flush <-chan time.Time
	for {
		select {
		case <-c.kick:
			c.drain()
			if flush == nil {
				flush = time.After(flushDelay)
			}
		case <-flush:
			flush = nil
			c.sync(true)
		case <-c.stop:
			c.drain()
			c.sync(false)
			return
		}
	}
}

// drain writes every queued copy.
func (c *Copies) drain() {
	c.mu.Lock()
	queued := c.pending
	c.pending = map[string]copyWrite{}
	c.mu.Unlock()
	for file, w := range queued {
		c.write(file, w)
	}
}

// write writes w to file unless a later transaction already wrote or
// removed it.
func (c *Copies) write(file string, w copyWrite) {
	c.wmu.Lock()
	if w.txid < c.written[file] {
		c.wmu.Unlock()
		return
	}
	b := w.b
	if w.manifest {
		var ck CheckpointRecord
		if json.Unmarshal(b, &ck) != nil {
			c.wmu.Unlock()
			return
		}
		b = c.p.CommittedManifest(ck)
	}
	// The record's directory is gone when its object was removed
	// without a delete of the record (a failed create): nothing is
	// written then.
	err := replaceFile(file, b)
	if err == nil {
		c.written[file] = w.txid
		c.dirty[file] = true
	}
	c.wmu.Unlock()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.p.Log.Warn("cannot write the on-disk copy of a record; a rebuild of the metadata would miss it until the next change", "file", file, "err", err)
	}
}

// replaceFile writes b to file through a temporary file and a rename:
// a reader sees the old content or the new, never part of it.
func replaceFile(file string, b []byte) error {
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// sync fsyncs the copies written since the last call, and their
// directories; gate: not while a capture holds the pool's commits
// (Disk.Background).
func (c *Copies) sync(gate bool) {
	if gate {
		release, err := c.p.Background()
		if err != nil {
			return
		}
		defer release()
	}
	c.wmu.Lock()
	files := c.dirty
	c.dirty = map[string]bool{}
	c.wmu.Unlock()
	dirs := map[string]bool{}
	for f := range files {
		if err := syncPath(f); err == nil {
			dirs[filepath.Dir(f)] = true
		}
	}
	for d := range dirs {
		_ = syncPath(d)
	}
}

func syncPath(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsync(fd)
}

// Close stops the writer once it has written and fsynced every queued
// copy. A nil Copies (an engine that failed before it kept them) has
// nothing to stop.
func (c *Copies) Close() {
	if c == nil {
		return
	}
	c.once.Do(func() { close(c.stop) })
	c.wg.Wait()
}

// Heal writes the on-disk copies the metadata has but the disk does
// not (a daemon that died between a commit and its copy, a root from
// before the copies were kept): of sbs and cks, the sandboxes and
// checkpoints the engine keeps, and of every image.
func (c *Copies) Heal(sbs []SandboxRecord, cks []CheckpointRecord) {
	for _, s := range sbs {
		b, _ := json.Marshal(s)
		if old, err := os.ReadFile(c.p.SandboxCopy(s.ID)); err != nil || !bytes.Equal(old, b) {
			c.queue(c.p.SandboxCopy(s.ID), copyWrite{b: b})
		}
	}
	for _, ck := range cks {
		if !c.p.ManifestCurrent(ck) {
			c.p.Log.Info("writing the committed manifest of a checkpoint", "checkpoint", ck.ID)
			c.queue(c.p.ManifestCopy(ck.ID), copyWrite{b: c.p.CommittedManifest(ck)})
		}
	}
	imgs, _ := List[Image](c.db, Images)
	for _, img := range imgs {
		b, _ := json.Marshal(img)
		if old, err := os.ReadFile(c.p.ImageCopy(img.Name)); err != nil || !bytes.Equal(old, b) {
			c.queue(c.p.ImageCopy(img.Name), copyWrite{b: b})
		}
	}
}
