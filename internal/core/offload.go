package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/progress"
	"github.com/molt-sh/molt/internal/remote"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sched"
)

// Checkpoints in an object store (Config.Store; docs/storage.md).
//
// Every committed checkpoint is uploaded in the background (a GC-class
// job of the host scheduler: the lowest priority, paced by its I/O
// budget); content the store holds already is not sent again. Offload
// frees a hibernated sandbox's local copy (its head checkpoint's
// artifact and its root) once the checkpoint and a signed document of
// the sandbox are in the store; Resume fetches what it needs, on this
// daemon or on any other that shares the store and trusts this host's
// key (it adopts the sandbox from the store first). The store's
// document says which host runs the sandbox: a resume anywhere claims
// it, and a sandbox another host claimed is not resumed here.

func (m *Manager) storeReady() error {
	if m.store == nil {
		return fmt.Errorf("this daemon has no object store (molt daemon --store s3://BUCKET/PREFIX): %w", errdefs.ErrFailedPrecondition)
	}
	return nil
}

// scheduleUpload uploads checkpoint id in the background, if the daemon
// has a store.
func (m *Manager) scheduleUpload(sandboxID, id string) {
	if m.store == nil {
		return
	}
	m.background(sandboxID, sched.GC, "upload checkpoint "+id, func(ctx context.Context, t *sched.Task) error {
		err := m.uploadCheckpoint(ctx, t, id)
		if err == nil || errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
		// An offload (which uploads it itself) or a delete may have
		// taken the local copy meanwhile.
		var ck checkpointRec
		if gerr := m.db.Get(meta.Checkpoints, id, &ck); gerr != nil || ck.InStore || ck.Offloaded {
			return nil
		}
		m.log.Warn("checkpoint not uploaded to the store", "checkpoint", id, "err", err)
		return err
	})
}

// uploadCheckpoint puts checkpoint id into the store unless it is there,
// records that it is, and trims the local cache.
func (m *Manager) uploadCheckpoint(ctx context.Context, t *sched.Task, id string) error {
	if err := m.putCheckpoint(ctx, t, id); err != nil {
		return err
	}
	m.evict()
	return nil
}

// putCheckpoint is uploadCheckpoint without the cache's trim, which
// locks sandboxes: for callers that hold one's lock.
func (m *Manager) putCheckpoint(ctx context.Context, t *sched.Task, id string) error {
	// One upload at a time: an offload waits for the background upload
	// of its checkpoint rather than sending the same content again.
	m.uploadMu.Lock()
	defer m.uploadMu.Unlock()
	var ck checkpointRec
	if err := m.db.Get(meta.Checkpoints, id, &ck); err != nil {
		return fmt.Errorf("checkpoint %s: %w", id, errdefs.ErrNotFound)
	}
	if ck.InStore || ck.Pending || ck.Failed {
		return nil
	}
	mf, err := m.cks.Backend().Manifest(ck.ID)
	if err != nil {
		return fmt.Errorf("checkpoint %s: manifest: %w", id, err)
	}
	rb, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	// The snapshot was taken before the record's time, and for a full
	// checkpoint while the sandbox was frozen, at most its stall before.
	snapshot := ck.Created.Add(-time.Duration(ck.StallMS * float64(time.Millisecond)))
	src := remote.Source{Checkpoint: ck.ID, Sandbox: ck.Sandbox, Record: rb, Manifest: mf,
		Dir: m.ckDir(ck.ID), Objects: ck.Objects, Tree: m.ckFS(ck.ID), Snapshot: snapshot, Parent: ck.Parent}
	if t != nil {
		src.Charge = func(n int64) error { return t.Charge(ctx, n) }
	}
	_, st, err := m.store.Upload(ctx, src)
	if errors.Is(err, errdefs.ErrUnavailable) && ctx.Err() == nil {
		// A GC condemned a pack it shared (remote/gc.go): once more,
		// sharing none of those.
		_, st, err = m.store.Upload(ctx, src)
	}
	if err != nil {
		m.metrics.uploads.WithLabelValues("failed").Inc()
		return err
	}
	m.metrics.uploads.WithLabelValues("ok").Inc()
	m.metrics.storeSent.Add(float64(st.UploadedBytes))
	m.log.Debug("checkpoint uploaded", "checkpoint", id, "uploaded", st.UploadedBytes, "shared", st.SharedBytes)
	err = m.setCheckpoint(id, func(c *checkpointRec) { c.InStore = true })
	if errors.Is(err, errdefs.ErrNotFound) {
		// Deleted while it was uploaded: its recipe must not outlive it.
		if derr := m.store.Delete(ctx, id); derr != nil {
			m.log.Warn("store: the recipe of a checkpoint deleted during its upload stays", "checkpoint", id, "err", derr)
		}
	}
	return err
}

// Offload puts a hibernated sandbox's checkpoint and record into the
// store, then frees their local copies: the checkpoint's artifact and
// the sandbox's root. Nothing is freed before the store has them.
func (m *Manager) Offload(ctx context.Context, ref string) (meta.Sandbox, error) {
	if err := m.storeReady(); err != nil {
		return meta.Sandbox{}, err
	}
	rec, unlock, err := m.lockHibernated(ref, "offload")
	if err != nil {
		return meta.Sandbox{}, err
	}
	defer unlock()
	if rec.Offloaded {
		return m.report(rec), nil
	}
	progress.Report(ctx, progress.Step{Message: "uploading checkpoint " + rec.Head})
	if err := m.putCheckpoint(ctx, nil, rec.Head); err != nil {
		return meta.Sandbox{}, fmt.Errorf("offload %s: %w", rec.ID, err)
	}
	// Its other checkpoints go with it (those the background has not
	// uploaded yet, first), so that a rollback after a resume elsewhere
	// reaches them as after a migration.
	lineage, err := m.uploadLineage(ctx, rec.ID, false)
	if err != nil {
		return meta.Sandbox{}, fmt.Errorf("offload %s: %w", rec.ID, err)
	}
	rec.Offloaded = true
	rb, err := storedRecord(rec)
	if err != nil {
		return meta.Sandbox{}, err
	}
	doc := remote.SandboxDoc{Sandbox: rec.ID, Name: rec.Name, Tenant: rec.Tenant, Head: rec.Head, Record: rb}
	for _, id := range lineage {
		if id != rec.Head {
			doc.Checkpoints = append(doc.Checkpoints, id)
		}
	}
	// A history this host seals stays here (and so does the sandbox: its
	// checkpoints are sealed too, and no other host adopts them).
	if err := m.putHistory(ctx, rec.ID, &doc); errors.Is(err, errdefs.ErrNotSupported) {
		m.log.Info("offload: the sandbox's turn log and ledger stay on this host", "sandbox", rec.ID, "reason", err)
	} else if err != nil {
		return meta.Sandbox{}, fmt.Errorf("offload %s: %w", rec.ID, err)
	}
	if err := m.putOwnDoc(ctx, &doc); err != nil {
		return meta.Sandbox{}, fmt.Errorf("offload %s: %w", rec.ID, err)
	}
	// The store has all a resume needs: the records say so before the
	// local copies go, so a crash in between leaves only garbage.
	if err := m.setCheckpoint(rec.Head, func(c *checkpointRec) { c.Offloaded = true }); err != nil {
		return meta.Sandbox{}, err
	}
	if err := m.db.Put(meta.Sandboxes, rec.ID, rec); err != nil {
		return meta.Sandbox{}, err
	}
	progress.Report(ctx, progress.Step{Message: "freeing the local copy"})
	m.dropStandbyOf(rec.ID, rec.Head, true)
	m.dropViews(func(v, _ string) bool { return v == rec.Head })
	m.removeLocal(rec.Head)
	if err := removeTree(m.sbRoot(rec.ID)); err != nil {
		m.log.Warn("offload: the local root stays", "sandbox", rec.ID, "err", err)
	}
	return m.report(rec), nil
}

// fetchCheckpoint makes offloaded checkpoint ck's artifact local again
// from the store, and verifies it thoroughly (every object's hash
// against the record, the signed manifest, the CRIU images) before
// anything restores from it.
func (m *Manager) fetchCheckpoint(ctx context.Context, ck *checkpointRec) error {
	if err := m.storeReady(); err != nil {
		return fmt.Errorf("checkpoint %s was offloaded: %w", ck.ID, err)
	}
	progress.Report(ctx, progress.Step{Message: "fetching checkpoint " + ck.ID + " from the store"})
	r, err := m.store.Recipe(ctx, ck.ID)
	if err != nil {
		return err
	}
	if err := m.room("fetch "+ck.ID, r.Size()); err != nil {
		return err
	}
	rv := revert.Logged(m.log, "fetch checkpoint")
	defer rv.Fail()
	_ = m.cks.Delete(ck.ID) // what a failed fetch left
	if _, err := m.cks.Create(ck.ID); err != nil {
		return err
	}
	id := ck.ID
	rv.Add(func() error { return m.cks.Delete(id) })
	if _, err := m.store.FetchObjects(ctx, r, m.ckDir(ck.ID)); err != nil {
		return err
	}
	if err := m.fetchTree(ctx, *ck, r); err != nil {
		return err
	}
	// The manifest as this host's records have it now (signed here): its
	// parent may have changed since the upload (a deleted parent's
	// children are re-linked), and the recipe, signed by the uploader,
	// vouched for the objects it lists, which are the record's.
	// (The uploaded one first: its host facts, the capture's, stay.)
	if err := m.cks.Backend().PutManifest(ck.ID, r.Manifest); err != nil {
		return err
	}
	if err := m.cks.Backend().PutManifest(ck.ID, m.committedManifest(*ck)); err != nil {
		return err
	}
	if err := fsnap.SyncFS(m.ckDir(ck.ID)); err != nil {
		return err
	}
	progress.Report(ctx, progress.Step{Message: "verifying checkpoint " + ck.ID})
	local := *ck
	local.Offloaded = false
	// Each object was hashed as it was fetched, against the recipe: if
	// the recipe lists the record's objects, that was the verification
	// of their content, and the rest (the signed manifest, the CRIU
	// images, validated by every restore) is checked as for any
	// restore. Otherwise everything is hashed again.
	thorough := !sameObjects(r, ck.Objects)
	if !thorough {
		m.cks.Remember(ck.ID, ck.Objects)
	}
	if err := m.verify(local, thorough); err != nil {
		return fmt.Errorf("checkpoint %s fetched from the store: %w", ck.ID, err)
	}
	ck.Offloaded = false
	if err := m.setCheckpoint(ck.ID, func(c *checkpointRec) { c.Offloaded = false }); err != nil {
		return err
	}
	rv.Success()
	m.metrics.fetches.Inc()
	return nil
}

// fetchTree makes recipe r's file tree checkpoint ck's artifact's files
// (device nodes made by the host), read-only: in a scratch subvolume
// that is a snapshot of the image ck's sandbox was made from, if this
// host has it (what the sandbox did not change stays, and what the image
// holds is not fetched), else an empty one.
func (m *Manager) fetchTree(ctx context.Context, ck checkpointRec, r remote.Recipe) error {
	tree := filepath.Join(m.ckDir(ck.ID), "fs.fetch")
	base, unlock, err := m.treeBase(ck.Sandbox, tree)
	if err != nil {
		return err
	}
	defer unlock()
	if base != nil {
		st, err := m.store.FetchTreeOver(ctx, r, tree, *base)
		if err == nil {
			m.log.Info("file tree fetched over its image", "checkpoint", ck.ID, "entries", st.Entries, "kept", st.KeptEntries,
				"kept_bytes", st.Kept, "fetched_bytes", st.Fetched, "base_bytes", st.FromBase, "remembered", st.Remembered)
			m.metrics.treeFetches.WithLabelValues("image").Inc()
		}
		if err == nil || ctx.Err() != nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			return m.sealTree(ck, tree, err)
		}
		// The tree's hash refused what the image gave (an image changed
		// under its index): fetch it whole.
		m.log.Warn("file tree: fetching it whole", "checkpoint", ck.ID, "err", err)
		m.metrics.treeFetches.WithLabelValues("image_refused").Inc()
		if err := removeTree(tree); err != nil {
			return err
		}
	}
	if err := fsnap.CreateSubvolume(tree); err != nil {
		return err
	}
	m.metrics.treeFetches.WithLabelValues("whole").Inc()
	return m.sealTree(ck, tree, m.store.FetchTree(ctx, r, tree))
}

// sealTree makes the fetched tree, once fetched without error, ck's
// read-only files.
func (m *Manager) sealTree(ck checkpointRec, tree string, err error) error {
	if err != nil {
		return err
	}
	if err := sandbox.MakeDevNodes(tree); err != nil {
		return err
	}
	if err := fsnap.SnapshotIn(tree, m.ckFS(ck.ID), true, m.groupsOfID(ck.Sandbox)...); err != nil {
		return err
	}
	return removeTree(tree)
}

// treeBase snapshots, as tree, the image sandbox sb was made from, and
// returns it as a base to fetch its tree over, locked against its
// removal until unlock: nil if this host has no such image (a read-only
// subvolume), the tree then left to be made.
func (m *Manager) treeBase(sb, tree string) (base *remote.Base, unlock func(), err error) {
	none := func() {}
	rec, ok := m.sandboxRecord(sb)
	if !ok || rec.Image == "" || validName("image", rec.Image) != nil || m.opts.noTreeBase {
		return nil, none, nil
	}
	unlock = m.lock("image/" + rec.Image)
	dir := m.imageDir(rec.Image)
	if ro, err := fsnap.Readonly(dir); err != nil || !ro {
		unlock()
		return nil, none, nil
	}
	if err := fsnap.Snapshot(dir, tree, false); err != nil {
		unlock()
		return nil, none, err
	}
	// The index's key is the UUID of the subvolume snapshotted, as the
	// snapshot names it.
	key, err := fsnap.SnapshotOf(tree)
	if err != nil || key == "" {
		unlock()
		return nil, none, errors.Join(fmt.Errorf("file tree: the image's snapshot names no source (%v)", err), removeTree(tree))
	}
	return &remote.Base{Dir: dir, Key: key}, unlock, nil
}

// sameObjects reports whether recipe r lists exactly the objects objs.
func sameObjects(r remote.Recipe, objs []ckstore.Object) bool {
	if len(r.Objects) != len(objs) {
		return false
	}
	for i, o := range objs {
		ro := r.Objects[i]
		if ro.Name != o.Path || ro.Size != o.Size || ro.SHA256 != o.SHA256 {
			return false
		}
	}
	return true
}

// adopt makes sandbox ref, offloaded to the store by this or another
// daemon, one of this daemon's: its record and its head checkpoint's,
// which a resume then fetches. Only an ID is looked up in the store.
func (m *Manager) adopt(ctx context.Context, ref string, h *v1.Handover) error {
	if m.store == nil {
		return fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
	}
	doc, err := m.store.Sandbox(ctx, ref)
	if err != nil {
		return err
	}
	if doc.Owner != "" {
		return fmt.Errorf("sandbox %s was resumed by host %s: %w", doc.Sandbox, doc.Owner, errdefs.ErrConflict)
	}
	var rec sandboxRec
	if err := strictRecord(doc.Record, &rec); err != nil || rec.ID != doc.Sandbox || rec.Head != doc.Head {
		return fmt.Errorf("store: sandbox %s: its record does not match its document (%v): %w", doc.Sandbox, err, errdefs.ErrFailedPrecondition)
	}
	r, err := m.store.Recipe(ctx, doc.Head)
	if err != nil {
		return err
	}
	var ck checkpointRec
	if err := strictRecord(r.Record, &ck); err != nil || ck.ID != doc.Head || ck.Sandbox != rec.ID || ck.Kind != v1.KindFull {
		return fmt.Errorf("store: checkpoint %s: its record does not match (%v): %w", doc.Head, err, errdefs.ErrFailedPrecondition)
	}
	ck = fromStore(ck)
	if ck.DataKey != "" {
		return fmt.Errorf("sandbox %s: its checkpoint is encrypted with a data key of its host's; resuming it on another host is not supported yet: %w", rec.ID, errdefs.ErrNotSupported)
	}
	if rec.Tenant != "" {
		var t meta.TenantRecord
		if err := m.db.Get(meta.Tenants, rec.Tenant, &t); err != nil {
			return fmt.Errorf("sandbox %s: tenant %q does not exist here: %w", rec.ID, rec.Tenant, errdefs.ErrFailedPrecondition)
		}
	}
	if rec.Name != "" {
		if other, err := m.lookupSandbox(rec.Name); err == nil {
			return fmt.Errorf("sandbox %s: the name %q is sandbox %s's here: %w", rec.ID, rec.Name, other.ID, errdefs.ErrAlreadyExists)
		}
	}
	signer := ""
	if doc.Signature != nil {
		signer = doc.Signature.Key
	}
	if err := m.adoptEgress(&rec, h, signer); err != nil {
		return err
	}
	if rec.IDs.Enabled() {
		return fmt.Errorf("sandbox %s has a user namespace of this host's ids; resuming it on another host is not supported yet: %w", rec.ID, errdefs.ErrNotSupported)
	}
	lineage, err := m.storedLineage(ctx, doc)
	if err != nil {
		return err
	}
	lineage = append(lineage, ck)
	hist, err := m.storedHistory(ctx, doc)
	if err != nil {
		return err
	}
	rec.State, rec.Init, rec.Offloaded, rec.DiskGroup = v1.StateHibernated, sandbox.Init{}, true, false
	rec.Standby, rec.Standbys, rec.StandbyBytes = "", nil, 0
	if err := os.MkdirAll(m.sbDir(rec.ID), 0o700); err != nil {
		return err
	}
	// Its disk quota, as a sandbox created here has it.
	if _, _, err := m.makeQgroup(&rec); err != nil {
		return err
	}
	// Its turn log and ledger first: a failure from here leaves no
	// record, and a retry writes them again.
	if err := m.installHistory(rec.ID, hist); err != nil {
		return err
	}
	known := map[string]bool{}
	for _, c := range lineage {
		known[c.ID] = true
	}
	// Its address here (its own if free and in this host's range).
	if rec.Network == v1.NetworkEgress {
		if err := m.netRegister(&rec); err != nil {
			return err
		}
	}
	err = m.db.Update(func(tx *meta.Tx) error {
		for _, c := range lineage {
			if !known[c.Parent] {
				c.Parent = "" // another sandbox's (a fork's origin), not in the store
			}
			var old checkpointRec
			if err := tx.Get(meta.Checkpoints, c.ID, &old); err == nil && old.Sandbox != rec.ID {
				return fmt.Errorf("store: checkpoint %s is sandbox %s's here: %w", c.ID, old.Sandbox, errdefs.ErrAlreadyExists)
			}
			if err := tx.Put(meta.Checkpoints, c.ID, c); err != nil {
				return err
			}
		}
		return tx.Put(meta.Sandboxes, rec.ID, rec)
	})
	if err != nil && rec.Network == v1.NetworkEgress {
		_ = m.net.Remove(rec.ID)
	}
	return err
}

// storedLineage reads the records of the checkpoints doc names besides
// its head (a migrated sandbox's lineage), each from its signed recipe;
// encrypted ones (a data key of the host that took them) are left out.
func (m *Manager) storedLineage(ctx context.Context, doc remote.SandboxDoc) ([]checkpointRec, error) {
	var out []checkpointRec
	for _, id := range doc.Checkpoints {
		r, err := m.store.Recipe(ctx, id)
		if errors.Is(err, fs.ErrNotExist) {
			// Deleted on the host that held the sandbox after the
			// document was written: not one to roll back to.
			m.log.Info("adopt: a checkpoint the store's document names is gone", "sandbox", doc.Sandbox, "checkpoint", id)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox %s's checkpoint %s: %w", doc.Sandbox, id, err)
		}
		var ck checkpointRec
		if err := strictRecord(r.Record, &ck); err != nil || ck.ID != id || ck.Sandbox != doc.Sandbox || (ck.Kind != v1.KindFull && ck.Kind != v1.KindFS) {
			return nil, fmt.Errorf("store: checkpoint %s: its record does not match (%v): %w", id, err, errdefs.ErrFailedPrecondition)
		}
		if ck.DataKey != "" {
			continue
		}
		out = append(out, fromStore(ck))
	}
	return out, nil
}

// fromStore is ck, adopted from the store: its local copy is to be fetched.
func fromStore(ck checkpointRec) checkpointRec {
	ck.InStore, ck.Offloaded, ck.Keep, ck.Pending, ck.Failed = true, true, false, false, false
	return ck
}

// storedRecord is sandbox rec's record as the store's document holds
// it: without the private key of its egress proxy's CA, which goes to
// another host only with a migration's resume (v1.Handover).
func storedRecord(rec sandboxRec) ([]byte, error) {
	if rec.Egress != nil {
		e := *rec.Egress
		e.CAKey = ""
		rec.Egress = &e
	}
	return json.Marshal(rec)
}

// dropMovedOn removes this daemon's record of sandbox id, offloaded
// from here, once the store's document has moved past it: another host
// resumed the sandbox since, ran it and offloaded it again, so the
// document's head is not the record's. Resuming the record would
// restore an older state; the caller adopts the sandbox afresh from the
// document instead. What the store holds stays, and so do the turn log
// and ledger kept here (as after a migration). A document claimed by
// another host is left to claim to refuse.
func (m *Manager) dropMovedOn(ctx context.Context, id string) (bool, error) {
	rec, unlock, err := m.lockHibernated(id, "resume")
	if err != nil {
		return false, err
	}
	defer unlock()
	if !rec.Offloaded {
		return false, nil
	}
	doc, err := m.store.Sandbox(ctx, id)
	if err != nil {
		return false, err
	}
	if doc.Owner != "" || doc.Head == rec.Head {
		return false, nil
	}
	m.log.Info("resume: the store's sandbox moved on since it was offloaded here; adopting it afresh", "sandbox", id, "here", rec.Head, "store", doc.Head)
	if err := m.removeHere(ctx, rec, true); err != nil {
		return false, err
	}
	return true, nil
}

// claim records in the store that this host runs sandbox rec now.
func (m *Manager) claim(ctx context.Context, rec sandboxRec) error {
	doc, version, err := m.store.SandboxVersion(ctx, rec.ID)
	if err != nil {
		return err
	}
	me := m.cks.Keyring().KeyID()
	if doc.Owner == me {
		return nil // an earlier resume here claimed it, and failed
	}
	if doc.Owner != "" {
		return fmt.Errorf("sandbox %s was resumed by host %s: %w", rec.ID, doc.Owner, errdefs.ErrConflict)
	}
	doc.Owner, doc.Epoch = me, doc.Epoch+1
	// Written over the version read: of two hosts that resume it at
	// once, one gets it.
	if err := m.store.PutSandbox(ctx, doc, version); errors.Is(err, objstore.ErrChanged) {
		return fmt.Errorf("sandbox %s: another host claimed it at the same moment: %w", rec.ID, errdefs.ErrConflict)
	} else if err != nil {
		return err
	}
	return nil
}

// unclaim gives back this host's claim on sandbox id, which a resume
// here made and which failed: another host may resume it.
func (m *Manager) unclaim(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	doc, version, err := m.store.SandboxVersion(ctx, id)
	if err == nil && doc.Owner == m.cks.Keyring().KeyID() {
		doc.Owner, doc.Epoch = "", doc.Epoch+1
		err = m.store.PutSandbox(ctx, doc, version)
	}
	if err != nil {
		m.log.Warn("store: a failed resume's claim stays", "sandbox", id, "err", err)
	}
}

// putOwnDoc writes doc, the document of a sandbox this host runs (an
// offload, a migration's hand-over), over the one in the store: with
// the epoch after its, unless another host owns it (the sandbox must
// not run in two places), or changed it meanwhile.
func (m *Manager) putOwnDoc(ctx context.Context, doc *remote.SandboxDoc) error {
	old, version, err := m.store.SandboxVersion(ctx, doc.Sandbox)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		version = ""
	case err != nil:
		return err
	case old.Owner != "" && old.Owner != m.cks.Keyring().KeyID():
		return fmt.Errorf("the store says host %s runs sandbox %s: %w", old.Owner, doc.Sandbox, errdefs.ErrConflict)
	default:
		doc.Epoch = old.Epoch + 1
	}
	return m.store.PutSandbox(ctx, *doc, version)
}

// setCheckpoint changes checkpoint id's record in one transaction.
func (m *Manager) setCheckpoint(id string, fn func(*checkpointRec)) error {
	return m.db.Update(func(tx *meta.Tx) error {
		var c checkpointRec
		if err := tx.Get(meta.Checkpoints, id, &c); err != nil {
			return err
		}
		fn(&c)
		return tx.Put(meta.Checkpoints, id, c)
	})
}

// strictRecord decodes a record read from the store.
func strictRecord(b []byte, v any) error {
	if len(b) == 0 {
		return errors.New("no record")
	}
	return json.Unmarshal(b, v)
}

// freeLocal frees the local copy of checkpoint id, which is in the
// store, under its sandbox's lock: its standbys and decrypted views go
// first. It reports whether the copy went.
func (m *Manager) freeLocal(id string) bool {
	var ck checkpointRec
	if err := m.db.Get(meta.Checkpoints, id, &ck); err != nil {
		return false
	}
	unlock := m.lock(ck.Sandbox)
	defer unlock()
	if err := m.db.Get(meta.Checkpoints, id, &ck); err != nil || !ck.InStore || ck.Offloaded {
		return false
	}
	m.dropStandbyOf(ck.Sandbox, id, true)
	m.dropViews(func(v, _ string) bool { return v == id })
	if err := m.setCheckpoint(id, func(r *checkpointRec) { r.Offloaded = true }); err != nil {
		return false
	}
	m.removeLocal(id)
	return true
}

// removeLocal deletes checkpoint id's local artifact. A restore that
// read it a moment ago may still be finishing (CRIU's log): the delete
// is retried briefly; what stays is deleted by the next fetch.
func (m *Manager) removeLocal(id string) {
	var err error
	for i := 0; i < 5; i++ {
		if err = m.cks.Delete(id); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	ents, _ := os.ReadDir(m.ckDir(id))
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	m.log.Warn("store: a freed checkpoint's local copy stays", "checkpoint", id, "left", left, "err", err)
}

// ensureLocal fetches checkpoint ck from the store if its local copy was
// freed (ck is updated), one fetch at a time, and notes its use for the
// local cache's eviction order.
func (m *Manager) ensureLocal(ctx context.Context, ck *checkpointRec) error {
	m.touch(ck.ID)
	defer m.touch(ck.ID)
	if !ck.Offloaded {
		return nil
	}
	if err := m.fetchLocked(ctx, ck); err != nil {
		return err
	}
	// Not under fetchMu: eviction takes sandboxes' locks, and a sandbox's
	// lock may be held by one waiting for fetchMu.
	m.evict()
	return nil
}

func (m *Manager) fetchLocked(ctx context.Context, ck *checkpointRec) error {
	m.fetchMu.Lock()
	defer m.fetchMu.Unlock()
	var cur checkpointRec
	if err := m.db.Get(meta.Checkpoints, ck.ID, &cur); err == nil && !cur.Offloaded {
		*ck = cur
		return nil
	}
	return m.fetchCheckpoint(ctx, ck)
}

// touch notes a use of checkpoint id.
func (m *Manager) touch(id string) {
	if m.store == nil {
		return
	}
	m.usedMu.Lock()
	if m.used == nil {
		m.used = map[string]time.Time{}
	}
	m.used[id] = time.Now()
	m.usedMu.Unlock()
}

// evictGrace is how recently used a checkpoint may be and still be
// evicted: not at all within it (a rollback may be about to read it).
var evictGrace = time.Minute

// evict frees the local copies of checkpoints in the store, least
// recently used first, until the local copies of such checkpoints take
// at most Config.StoreCache bytes (each counted by what it added to the
// pool). Heads of sandboxes, kept checkpoints (standbys) and those used
// within evictGrace stay.
func (m *Manager) evict() {
	if m.store == nil || m.cfg.StoreCache <= 0 {
		return
	}
	cks, err := meta.List[checkpointRec](m.db, meta.Checkpoints)
	if err != nil {
		return
	}
	sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return
	}
	heads := map[string]bool{}
	for _, s := range sbs {
		heads[s.Head] = true
	}
	type cand struct {
		id   string
		used time.Time
		size int64
	}
	var cands []cand
	var total int64
	grace := evictGrace
	m.usedMu.Lock()
	for _, c := range cks {
		if !c.InStore || c.Offloaded || c.Pending || c.Failed {
			continue
		}
		total += c.BytesWritten
		used, ok := m.used[c.ID]
		if !ok {
			used = c.Created
		}
		if !heads[c.ID] && !c.Keep && time.Since(used) > grace {
			cands = append(cands, cand{c.ID, used, c.BytesWritten})
		}
	}
	m.usedMu.Unlock()
	slices.SortFunc(cands, func(a, b cand) int { return a.used.Compare(b.used) })
	for _, c := range cands {
		if total <= m.cfg.StoreCache {
			return
		}
		if m.freeLocal(c.id) {
			total -= c.size
			m.metrics.evictions.Inc()
		}
	}
}

// StoreGC runs one garbage collection over the object store (see
// remote.Store.GC): packs and history objects nothing names go, a grace
// period after a run first found them so.
func (m *Manager) StoreGC(ctx context.Context, o remote.GCOptions) (remote.GCReport, error) {
	if err := m.storeReady(); err != nil {
		return remote.GCReport{}, fmt.Errorf("store gc: %w", err)
	}
	rep, err := m.store.GC(ctx, o)
	if err == nil && !o.DryRun {
		m.log.Info("store gc", "recipes", rep.Recipes, "packs", rep.Packs, "condemned", rep.Condemned, "waiting", rep.Waiting,
			"deleted_packs", rep.DeletedPacks, "deleted_history", rep.DeletedHistory, "deleted_bytes", rep.DeletedBytes)
	}
	return rep, err
}

// TrustKey trusts another host's public key (its host.pub) from now on:
// its checkpoints and store documents are accepted here. Kept in
// Root/keys/trusted across restarts; trust is never taken back (what
// that host signed stays).
func (m *Manager) TrustKey(pemKey []byte) (string, bool, error) {
	id, added, err := m.cks.Keyring().Trust(pemKey)
	if err == nil && added {
		m.log.Info("host key trusted", "key", id)
	}
	return id, added, err
}
