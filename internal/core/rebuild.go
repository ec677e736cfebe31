package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/meta"
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
// is rebuilt from them at start-up (rebuild); whatever cannot be
// explained goes to pool/quarantine, never away.
//
// The copies are written off the path of the operation that committed
// (writing one by rename cost 0.15-0.24 ms, 11.5-13.4 ms with its
// fsyncs, against a hot rollback of 2-8 ms: BenchmarkSandboxRecord;
// queueing it costs 0.2 µs): diskRecords' writer
// writes each at once and fsyncs them in batches, out of any capture's
// commit window. A copy a crash kept from being written is written at
// the next start from the database (healRecords); only a database lost
// together with a crash in that instant (or a host crash within the
// batch) leaves a rebuild the copy before.

// Names of the on-disk records.
const (
	sandboxFile  = "sandbox.json"
	manifestFile = ckstore.ManifestFile
)

// flushDelay is how long the writer gathers written records before it
// fsyncs them.
const flushDelay = 200 * time.Millisecond

// imageFile is the on-disk record of image name (hidden: an image may
// be named like another's record).
func (m *Manager) imageFile(name string) string { return m.path("images", "."+name+".json") }

// diskRecords writes the on-disk copies of records. A put only queues
// its copy (the commit point pays for a map entry); the writer goroutine
// writes it at once, and fsyncs what it wrote in batches. A delete
// removes its copy before it returns, after any write of it under way,
// and drops a queued one: the caller removes the directory next, and a
// late write there would keep it from going.
type diskRecords struct {
	mu      sync.Mutex
	pending map[string]diskWrite // by file: the newest copy to write
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	wmu     sync.Mutex        // held while a file is written or removed
	written map[string]uint64 // by file: transaction of the last write or removal
	dirty   map[string]bool   // files written, not yet fsynced
}

// A diskWrite is a record's copy to write: the record's encoding, made
// into a committed manifest first if manifest is set.
type diskWrite struct {
	txid     uint64
	b        []byte
	manifest bool
}

// watchRecords makes the store's changes of sandbox, checkpoint and
// image records reach their on-disk copies, and starts the writer.
func (m *Manager) watchRecords() {
	r := &m.disk
	r.pending, r.written, r.dirty = map[string]diskWrite{}, map[string]uint64{}, map[string]bool{}
	r.kick, r.stop, r.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	m.db.Watch(meta.Sandboxes, func(txid uint64, id string, b []byte) {
		m.queueRecord(filepath.Join(m.sbDir(id), sandboxFile), diskWrite{txid: txid, b: b})
	})
	m.db.Watch(meta.Images, func(txid uint64, name string, b []byte) {
		m.queueRecord(m.imageFile(name), diskWrite{txid: txid, b: b})
	})
	m.db.Watch(meta.Checkpoints, func(txid uint64, id string, b []byte) {
		m.queueRecord(filepath.Join(m.ckDir(id), manifestFile), diskWrite{txid: txid, b: b, manifest: true})
	})
	go m.writeRecords()
}

// committedManifest is the manifest of a committed checkpoint ck. The
// host facts stay those of the manifest written at its capture: the
// images are that kernel's and that CRIU's, whichever daemon writes it
// again.
func (m *Manager) committedManifest(ck checkpointRec) []byte {
	mf := m.manifestOf(ck, true)
	if old, err := m.cks.ReadManifest(ck.ID); err == nil && old.ID == ck.ID {
		mf.Molt, mf.Kernel, mf.Arch = old.Molt, old.Kernel, old.Arch
	}
	mb, _ := json.MarshalIndent(mf, "", "  ")
	return mb
}

// queueRecord queues w for file (a put), or removes file (a delete, b
// nil) unless a later transaction already wrote it.
func (m *Manager) queueRecord(file string, w diskWrite) {
	r := &m.disk
	if w.b == nil {
		r.wmu.Lock()
		defer r.wmu.Unlock()
		r.mu.Lock()
		if p, ok := r.pending[file]; ok && p.txid <= w.txid {
			delete(r.pending, file)
		}
		r.mu.Unlock()
		if w.txid < r.written[file] {
			return
		}
		r.written[file] = w.txid
		delete(r.dirty, file)
		if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("cannot remove the on-disk copy of a deleted record", "file", file, "err", err)
		}
		return
	}
	r.mu.Lock()
	if p, ok := r.pending[file]; !ok || p.txid <= w.txid {
		r.pending[file] = w
	}
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// writeRecords writes the queued copies as they come and fsyncs them,
// with their directories, in batches of flushDelay, until Close.
func (m *Manager) writeRecords() {
	r := &m.disk
	defer close(r.done)
	var flush <-chan time.Time
	for {
		select {
		case <-r.kick:
			m.drainRecords()
			if flush == nil {
				flush = time.After(flushDelay)
			}
		case <-flush:
			flush = nil
			m.syncRecords(true)
		case <-r.stop:
			m.drainRecords()
			m.syncRecords(false)
			return
		}
	}
}

// drainRecords writes every queued copy.
func (m *Manager) drainRecords() {
	r := &m.disk
	r.mu.Lock()
	queued := r.pending
	r.pending = map[string]diskWrite{}
	r.mu.Unlock()
	for file, w := range queued {
		r.wmu.Lock()
		if w.txid < r.written[file] {
			r.wmu.Unlock()
			continue
		}
		b := w.b
		if w.manifest {
			var ck checkpointRec
			if json.Unmarshal(b, &ck) != nil {
				r.wmu.Unlock()
				continue
			}
			b = m.committedManifest(ck)
		}
		// The record's directory is gone when its object was removed
		// without a delete of the record (a failed create): nothing is
		// written then.
		err := replaceFile(file, b)
		if err == nil {
			r.written[file] = w.txid
			r.dirty[file] = true
		}
		r.wmu.Unlock()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("cannot write the on-disk copy of a record; a rebuild of the metadata would miss it until the next change", "file", file, "err", err)
		}
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

// syncRecords fsyncs the copies written since the last call, and their
// directories; gate: not while a capture holds the pool's commits
// (commitgate.go).
func (m *Manager) syncRecords(gate bool) {
	if gate {
		release, err := m.commits.background(context.Background())
		if err != nil {
			return
		}
		defer release()
	}
	r := &m.disk
	r.wmu.Lock()
	files := r.dirty
	r.dirty = map[string]bool{}
	r.wmu.Unlock()
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

// closeRecords stops the writer once it has written and fsynced every
// queued copy.
func (m *Manager) closeRecords() {
	r := &m.disk
	if r.stop == nil {
		return
	}
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	<-r.done
}

// openStore opens the metadata at path. A file that does not read as a
// database is set aside (path.corrupt-TIME) and a new one opened, which
// start-up then rebuilds from the disk.
func openStore(path string, log interface {
	Error(string, ...any)
}) (*meta.DB, error) {
	db, err := meta.Open(path)
	if err == nil {
		// Records that are JSON but not molt's records are corrupt too.
		if err = decodeRecords(db); err != nil {
			db.Close()
			err = fmt.Errorf("open %s: %w: %w", path, meta.ErrCorrupt, err)
		}
	}
	if !errors.Is(err, meta.ErrCorrupt) {
		return db, err
	}
	aside := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	if rerr := os.Rename(path, aside); rerr != nil {
		return nil, errors.Join(err, fmt.Errorf("set the corrupt database aside: %w", rerr))
	}
	log.Error("metadata database is corrupt; set aside, rebuilding it from the pool", "err", err, "set_aside", aside)
	return meta.Open(path)
}

// decodeRecords decodes every image, sandbox and checkpoint record.
func decodeRecords(db *meta.DB) error {
	if _, err := meta.List[meta.Image](db, meta.Images); err != nil {
		return err
	}
	if _, err := meta.List[sandboxRec](db, meta.Sandboxes); err != nil {
		return err
	}
	_, err := meta.List[checkpointRec](db, meta.Checkpoints)
	return err
}

// quarantine moves path, which nothing explains, to pool/quarantine
// under the time and name, for a person to look at.
func (m *Manager) quarantine(path, name, why string) error {
	dir := m.path("quarantine")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	dst := filepath.Join(dir, time.Now().UTC().Format("20060102T150405.000000000Z")+"-"+name)
	if err := os.Rename(path, dst); err != nil {
		return fmt.Errorf("quarantine %s: %w", path, err)
	}
	m.log.Warn("moved what the metadata does not explain to quarantine (nothing was deleted)", "path", path, "to", dst, "reason", why)
	return nil
}

// rebuild records, in a database that was empty when opened, the
// images, checkpoints and sandboxes on disk, from their on-disk records;
// what cannot be explained goes to quarantine. All records commit in one
// transaction, with the end of the rebuild: a crash leaves it to the
// next start. reconcile then runs as on every start.
func (m *Manager) rebuild(ctx context.Context) error {
	type put struct {
		bucket, key string
		b           []byte
	}
	var puts []put
	var imgs, cks, sbs int

	ents, _ := os.ReadDir(m.path("images"))
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		name := e.Name()
		if validName("image", name) != nil {
			// Left where it is: an image is a read-only subvolume,
			// which cannot move to another directory.
			m.log.Warn("not an image name; left in the pool unlisted", "path", m.imageDir(name))
			continue
		}
		var img meta.Image
		if b, err := os.ReadFile(m.imageFile(name)); err != nil || json.Unmarshal(b, &img) != nil || img.Name != name {
			img = meta.Image{Name: name, Source: "unknown (rebuilt from the pool)"}
			if fi, err := e.Info(); err == nil {
				img.Created = fi.ModTime().UTC()
			}
		}
		b, _ := json.Marshal(img)
		puts = append(puts, put{meta.Images, name, b})
		imgs++
	}

	known := map[string]checkpointRec{}
	ents, _ = os.ReadDir(m.path("checkpoints"))
	for _, e := range ents {
		id := e.Name()
		ck, why := m.checkpointOnDisk(id)
		if why != "" {
			if err := m.quarantine(m.ckDir(id), "checkpoint-"+id, why); err != nil {
				return err
			}
			continue
		}
		known[id] = ck
	}
	for _, ck := range known {
		// A parent the pool no longer holds (its deletion's rewrite of
		// this manifest was lost) leaves the checkpoint a root.
		if _, ok := known[ck.Parent]; ck.Parent != "" && !ok {
			m.log.Warn("rebuilt checkpoint names a parent the pool does not hold; it becomes a root", "checkpoint", ck.ID, "parent", ck.Parent)
			ck.Parent = ""
		}
		b, _ := json.Marshal(ck)
		puts = append(puts, put{meta.Checkpoints, ck.ID, b})
		cks++
	}

	names := map[string]string{}
	ents, _ = os.ReadDir(m.path("sandboxes"))
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		id := e.Name()
		rec, why := m.sandboxOnDisk(id)
		if why == "" && rec.Name != "" && names[rec.Name] != "" {
			m.log.Warn("rebuilt sandbox has the name of another; it loses it", "sandbox", id, "name", rec.Name, "other", names[rec.Name])
			rec.Name = ""
		}
		if why != "" {
			if err := m.quarantine(m.sbDir(id), "sandbox-"+id, why); err != nil {
				return err
			}
			continue
		}
		if rec.Name != "" {
			names[rec.Name] = id
		}
		b, _ := json.Marshal(rec)
		puts = append(puts, put{meta.Sandboxes, id, b})
		sbs++
	}
	err := m.db.Update(func(tx *meta.Tx) error {
		for _, p := range puts {
			if err := tx.PutRaw(p.bucket, p.key, p.b); err != nil {
				return err
			}
		}
		return tx.Rebuilt()
	})
	if err != nil {
		return fmt.Errorf("rebuild the metadata: %w", err)
	}
	if imgs+cks+sbs > 0 {
		m.log.Warn("metadata rebuilt from the pool", "images", imgs, "checkpoints", cks, "sandboxes", sbs)
	}
	return nil
}

// checkpointOnDisk reads the record of checkpoint id from its manifest,
// or says why it cannot: the manifest is missing or unreadable, or
// names another checkpoint, or files it lists are missing. A manifest
// not marked committed is taken too when its files are all there: it
// is then a complete checkpoint whose commit the lost database may have
// held.
func (m *Manager) checkpointOnDisk(id string) (checkpointRec, string) {
	mf, why := m.cks.Complete(id)
	if why != "" {
		return checkpointRec{}, why
	}
	ck := checkpointRec{Checkpoint: meta.Checkpoint{
		ID: mf.ID, Sandbox: mf.Sandbox, Parent: mf.Parent, Kind: mf.Kind, Label: mf.Label,
		Created: mf.Created, StallMS: mf.StallMS, DurationMS: mf.DurationMS,
		Capture: mf.Capture, CaptureNote: mf.CaptureNote, StallParts: (*meta.StallParts)(mf.StallParts),
		BytesWritten: mf.BytesWritten, ImageBytes: ckstore.ImageBytes(mf.Objects), Keep: mf.Keep,
	}, Image: mf.Image, Objects: mf.Objects, CRIU: mf.CRIU,
		ExternalNet: mf.ExternalNet, ExternalUTS: mf.ExternalUTS, ExternalIPC: mf.ExternalIPC, IDs: mf.IDs}
	if !mf.Committed {
		m.log.Warn("rebuilding a complete checkpoint whose manifest was not marked committed", "checkpoint", id)
	}
	return ck, ""
}

// sandboxOnDisk reads the record of sandbox id from sandbox.json, or
// says why it cannot.
func (m *Manager) sandboxOnDisk(id string) (sandboxRec, string) {
	var rec sandboxRec
	b, err := os.ReadFile(filepath.Join(m.sbDir(id), sandboxFile))
	if err != nil {
		return rec, "no readable " + sandboxFile + ": " + err.Error()
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, sandboxFile + " does not decode: " + err.Error()
	}
	if rec.ID != id {
		return rec, fmt.Sprintf("%s names sandbox %q", sandboxFile, rec.ID)
	}
	if rec.Name != "" && validName("sandbox", rec.Name) != nil {
		return rec, fmt.Sprintf("name %q", rec.Name)
	}
	if _, err := os.Lstat(m.sbRoot(id)); err != nil {
		return rec, "no root"
	}
	return rec, ""
}

// healRecords writes the on-disk copies the metadata has but the disk
// does not (a daemon that died between a commit and its copy, a root
// from before the copies were kept).
func (m *Manager) healRecords(sbs []sandboxRec, cks []checkpointRec) {
	for _, s := range sbs {
		b, _ := json.Marshal(s)
		if old, err := os.ReadFile(filepath.Join(m.sbDir(s.ID), sandboxFile)); err != nil || !bytes.Equal(old, b) {
			m.queueRecord(filepath.Join(m.sbDir(s.ID), sandboxFile), diskWrite{b: b})
		}
	}
	for _, c := range cks {
		if mf, err := m.cks.ReadManifest(c.ID); err != nil || !mf.Committed || mf.ID != c.ID || mf.Parent != c.Parent || mf.Label != c.Label {
			m.log.Info("writing the committed manifest of a checkpoint", "checkpoint", c.ID)
			m.queueRecord(filepath.Join(m.ckDir(c.ID), manifestFile), diskWrite{b: m.committedManifest(c)})
		}
	}
	imgs, _ := meta.List[meta.Image](m.db, meta.Images)
	for _, img := range imgs {
		if _, err := os.Stat(m.imageDir(img.Name) + ".json"); err != nil {
			b, _ := json.Marshal(img)
			m.queueRecord(m.imageFile(img.Name), diskWrite{b: b})
		}
	}
}

// unlistedCheckpoint handles a checkpoint directory the metadata does
// not list: one that never committed (no manifest, or one not marked
// committed) is removed, as a crash inside its checkpoint leaves it;
// one that did is quarantined. Neither stops the start.
func (m *Manager) unlistedCheckpoint(id string) {
	mf, err := m.cks.ReadManifest(id)
	switch {
	case errors.Is(err, fs.ErrNotExist) || (err == nil && mf.ID == id && !mf.Committed):
		m.log.Warn("removing a checkpoint a crash kept from committing", "checkpoint", id)
		m.removeOrSetAside(m.ckDir(id), "checkpoint-"+id, "a checkpoint a crash kept from committing")
	case err != nil:
		m.setAside(m.ckDir(id), "checkpoint-"+id, "unlisted, with a manifest that does not read: "+err.Error())
	default:
		m.setAside(m.ckDir(id), "checkpoint-"+id, "unlisted, but its manifest says it was committed")
	}
}

// unlistedSandbox handles a sandbox directory the metadata does not
// list: one without sandbox.json never committed (a create or a fork a
// crash interrupted) and goes with its cgroup; one with it is
// quarantined, its cgroup left alone. Neither stops the start.
func (m *Manager) unlistedSandbox(ctx context.Context, id string) {
	_, err := os.Lstat(filepath.Join(m.sbDir(id), sandboxFile))
	if errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("removing a sandbox a crash kept from committing", "sandbox", id)
		if cg, err := cgroup.Load(cgroupName(id)); err == nil {
			_ = cg.Destroy(ctx)
		}
		m.removeOrSetAside(m.sbDir(id), "sandbox-"+id, "a sandbox a crash kept from committing")
		return
	}
	m.setAside(m.sbDir(id), "sandbox-"+id, "unlisted, but it has a "+sandboxFile)
}

// removeOrSetAside removes path, debris start-up found; what it cannot remove
// (a tree it cannot delete, whatever a sandbox left in it) is set
// aside instead, so that the daemon starts regardless.
func (m *Manager) removeOrSetAside(path, name, why string) {
	err := removeTree(path)
	if err == nil {
		return
	}
	m.setAside(path, name, why+"; removing it failed: "+err.Error())
}

// setAside quarantines path, and logs what it cannot move: start-up
// goes on either way.
func (m *Manager) setAside(path, name, why string) {
	if err := m.quarantine(path, name, why); err != nil {
		m.log.Error("cannot remove or set aside; left in place", "path", path, "reason", why, "err", err)
	}
}
