package core

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/bundle"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/progress"
	"github.com/molt-sh/molt/internal/revert"
	"github.com/molt-sh/molt/internal/sandbox"
)

// Portable checkpoints (docs/bundles.md).
//
// Export writes one checkpoint as a bundle (internal/bundle): verified
// first as a restore would (thorough: hashes, the signed manifest,
// CRIU's images), its images in plaintext (a sealed checkpoint's are
// decrypted with its tenant's key, as for a restore), its manifest
// flattened (no parent: each checkpoint's images are whole, its pages
// shared with its lineage's by reflink, never stored as deltas) and
// signed by this host.
//
// Import reads a bundle as hostile input into staging (the images into
// a directory, the file tree through the hardened extractor into a
// scratch subvolume), refusing one whose format, CRIU version,
// architecture or CPU features this host cannot restore, and one that
// fails verification or is signed by a key this host does not trust;
// then validates the images (criu.ValidateImages), stores them as a
// checkpoint taken here would be (sealed with the importing tenant's
// key when encryption is on), snapshots the tree read-only into the
// artifact and records the checkpoint: the record is the commit point.
// The checkpoint gets a fresh ID and belongs to no sandbox here (its
// Sandbox is a fresh ID naming none) but to the importing tenant; it
// has no parent, no ledger head and no turn. Forks of it start their
// own ledgers, with the daemon's default resources and seccomp filter.

// ExportCheckpoint writes checkpoint ref as a bundle to w.
func (m *Manager) ExportCheckpoint(ctx context.Context, ref string, w io.Writer) (bundle.Stats, error) {
	if err := m.pipe.wait(ctx, ref, ""); err != nil {
		return bundle.Stats{}, err
	}
	ck, err := m.lookupCheckpoint(ref, "")
	if err != nil {
		return bundle.Stats{}, err
	}
	if err := m.verify(ck, true); err != nil {
		return bundle.Stats{}, fmt.Errorf("export %s: %w", ck.ID, err)
	}
	src := bundle.Source{
		Header: bundle.Header{Molt: m.cfg.Version, Checkpoint: ck.ID, Kind: ck.Kind, CRIU: ck.CRIU,
			Host: bundle.LocalHost(), Image: bundle.Image{Name: ck.Image}},
		FS: m.ckFS(ck.ID),
	}
	if img, err := m.Image(ck.Image); err == nil {
		src.Header.Image.Source = img.Source
	}
	mf := m.manifestOf(ck, true)
	mf.DataKey, mf.KeyTenant, mf.Tenant, mf.LedgerHead, mf.Turn = "", "", "", "", 0
	mf.Keep, mf.Label = false, ""
	mf.Objects = nil
	for _, o := range ck.Objects {
		if strings.HasPrefix(o.Path, ckstore.ImagesDir+"/") {
			mf.Objects = append(mf.Objects, o)
		}
	}
	if ck.Kind == v1.KindFull {
		dir, done, err := m.openImages(ck)
		if err != nil {
			return bundle.Stats{}, fmt.Errorf("export %s: %w", ck.ID, err)
		}
		defer done()
		src.Images = dir
		if ck.DataKey != "" {
			// A sealed checkpoint's objects are hashed as stored; the
			// bundle carries the plaintext, each page of which the
			// decryption checked against its seal.
			if mf.Objects, err = plainObjects(dir, mf.Objects); err != nil {
				return bundle.Stats{}, fmt.Errorf("export %s: %w", ck.ID, err)
			}
		}
	}
	src.Manifest = mf
	st, err := bundle.Write(ctx, w, m.cks.Keyring(), src)
	if err != nil {
		return st, fmt.Errorf("export %s: %w", ck.ID, err)
	}
	return st, nil
}

// plainObjects returns objs (images) with the sizes and hashes of their
// plaintext in dir.
func plainObjects(dir string, objs []ckstore.Object) ([]ckstore.Object, error) {
	out := make([]ckstore.Object, 0, len(objs))
	for _, o := range objs {
		f, err := os.Open(filepath.Join(dir, filepath.Base(o.Path)))
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, ckstore.Object{Path: o.Path, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
	}
	return out, nil
}

// acceptBundle says whether this host can restore what a bundle's
// header says it holds.
func (m *Manager) acceptBundle(ctx context.Context, h bundle.Header) error {
	if h.Kind != v1.KindFull {
		return nil
	}
	host := bundle.LocalHost()
	if h.Host.Arch != host.Arch {
		return fmt.Errorf("the images are of architecture %s, this host is %s: %w", h.Host.Arch, host.Arch, errdefs.ErrNotSupported)
	}
	if miss := bundle.MissingCPUFlags(h.Host.CPUFlags, host.CPUFlags); len(miss) > 0 {
		if len(miss) > 10 {
			miss = append(miss[:10], fmt.Sprintf("and %d more", len(miss)-10))
		}
		return fmt.Errorf("the exporting host's CPU has features this one lacks (%s): its processes may use them: %w", strings.Join(miss, " "), errdefs.ErrNotSupported)
	}
	tool, err := m.criuReady(ctx)
	if err != nil {
		return fmt.Errorf("a full checkpoint: %w", err)
	}
	if err := bundle.CheckCRIU(h.CRIU, tool.Probe(ctx).Version); err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotSupported)
	}
	return nil
}

// ImportCheckpoint reads a bundle from r and makes its checkpoint one of
// tenant's here (see above).
func (m *Manager) ImportCheckpoint(ctx context.Context, r io.Reader, tenant string) (meta.CheckpointImport, error) {
	start := time.Now()
	if tenant != "" {
		var t meta.TenantRecord
		if err := m.db.Get(meta.Tenants, tenant, &t); err != nil {
			return meta.CheckpointImport{}, fmt.Errorf("import: tenant %q: no such tenant: %w", tenant, errdefs.ErrInvalidArgument)
		}
	}
	if err := m.room("import", 0); err != nil {
		return meta.CheckpointImport{}, err
	}
	lim := bundle.DefaultLimits()
	if s, err := m.pool.Space(); err == nil {
		lim.Bytes = max(0, s.Free-m.reserve())
	}
	rv := revert.Logged(m.log, "checkpoint import")
	defer rv.Fail()
	staging := m.path("tmp", "import-"+newID())
	images, tree := filepath.Join(staging, "images"), filepath.Join(staging, "fs")
	if err := os.Mkdir(staging, 0o700); err != nil {
		return meta.CheckpointImport{}, err
	}
	defer func() { _ = removeTree(staging) }()
	if err := os.Mkdir(images, 0o700); err != nil {
		return meta.CheckpointImport{}, err
	}
	if err := fsnap.CreateSubvolume(tree); err != nil {
		return meta.CheckpointImport{}, err
	}
	r = progress.Reader(ctx, r, "reading and verifying the bundle", 0)
	b, err := bundle.Read(ctx, r, images, tree, bundle.Options{Keys: m.cks.Keyring(), Limits: lim,
		Accept: func(h bundle.Header) error { return m.acceptBundle(ctx, h) }})
	if err != nil {
		return meta.CheckpointImport{}, fmt.Errorf("import: %w", m.exhausted(err))
	}
	// A bundle carries no device nodes: the tree gets molt's own, as a
	// sandbox's root has them.
	if err := sandbox.MakeDevNodes(tree); err != nil {
		return meta.CheckpointImport{}, fmt.Errorf("import: %w", err)
	}
	mf := b.Manifest
	if mf.Kind == v1.KindFull {
		progress.Report(ctx, progress.Step{Message: "validating the CRIU images"})
		if err := criu.ValidateImages(images, criu.DefaultLimits()); err != nil {
			return meta.CheckpointImport{}, fmt.Errorf("import: bundle refused: %w", err)
		}
		if err := m.idsFree(mf); err != nil {
			return meta.CheckpointImport{}, err
		}
	}
	ck := checkpointRec{Checkpoint: meta.Checkpoint{
		ID: newID(), Sandbox: newID(), Kind: mf.Kind, Created: mf.Created,
		ImportedFrom: mf.ID, ImportSigner: b.Signer,
	}, Image: mf.Image, CRIU: mf.CRIU, ExternalNet: mf.ExternalNet, ExternalUTS: mf.ExternalUTS,
		ExternalIPC: mf.ExternalIPC, IDs: mf.IDs, Tenant: tenant}
	progress.Report(ctx, progress.Step{Message: "storing the checkpoint"})
	if err := m.storeImport(ctx, rv, &ck, images, tree, mf.Objects); err != nil {
		return meta.CheckpointImport{}, fmt.Errorf("import: %w", m.exhausted(err))
	}
	rv.Success()
	return meta.CheckpointImport{Checkpoint: ck.Checkpoint, Objects: b.Stats.Objects, ObjectBytes: b.Stats.ObjectBytes,
		FSEntries: b.Stats.FSEntries, FSBytes: b.Stats.FSBytes, Molt: b.Header.Molt, CRIU: b.Header.CRIU,
		DurationMS: ms(time.Since(start))}, nil
}

// storeImport makes checkpoint ck's artifact from verified staging (the
// images and the tree, a subvolume) and records it.
func (m *Manager) storeImport(ctx context.Context, rv *revert.Reverter, ck *checkpointRec, images, tree string, objs []ckstore.Object) error {
	w, err := m.cks.Create(ck.ID)
	if err != nil {
		return err
	}
	id := ck.ID
	rv.Add(func() error { return m.cks.Delete(id) })
	if ck.Kind == v1.KindFull {
		k, err := m.dataKeyOf(sandboxRec{Sandbox: meta.Sandbox{Tenant: ck.Tenant}})
		if err != nil {
			return err
		}
		stored, written, err := w.StoreImages(ctx, images, nil, nil, k)
		if err != nil {
			return err
		}
		if !sameImages(stored, objs, k != nil) {
			return errors.New("the stored images are not the bundle's")
		}
		if k != nil {
			ck.DataKey, ck.KeyTenant = k.ID, k.Tenant
		}
		ck.Objects, ck.BytesWritten, ck.ImageBytes = stored, written, ckstore.ImageBytes(stored)
	}
	if _, err := m.writeManifest(*ck); err != nil {
		return err
	}
	if err := fsnap.SnapshotIn(tree, m.ckFS(ck.ID), true); err != nil {
		return err
	}
	if err := fsnap.SyncFS(m.ckDir(ck.ID)); err != nil {
		return err
	}
	if err := m.db.Put(meta.Checkpoints, ck.ID, *ck); err != nil {
		return err
	}
	m.cks.Remember(ck.ID, ck.Objects)
	return nil
}

// sameImages reports whether stored holds the images of want, of the
// same sizes and, unless sealed (stored objects are hashed as stored),
// the same hashes.
func sameImages(stored, want []ckstore.Object, sealed bool) bool {
	got := map[string]ckstore.Object{}
	for _, o := range stored {
		got[o.Path] = o
	}
	for _, o := range want {
		g, ok := got[o.Path]
		if !ok || g.Size != o.Size || (!sealed && g.SHA256 != o.SHA256) {
			return false
		}
	}
	return len(want) > 0
}

// idsFree refuses an imported full checkpoint whose images map a block
// of host ids a sandbox here has: its forks would share ids with a
// sandbox that is not of their lineage.
func (m *Manager) idsFree(mf ckstore.Manifest) error {
	if !mf.IDs.Enabled() {
		return nil
	}
	sbs, err := meta.List[sandboxRec](m.db, meta.Sandboxes)
	if err != nil {
		return err
	}
	for _, s := range sbs {
		if s.IDs.Enabled() && s.IDs.Base == mf.IDs.Base {
			return fmt.Errorf("import: the images map host ids %s, which sandbox %s has here: %w", mf.IDs, s.ID, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// ImportedCheckpoints lists the imported checkpoints of tenant.
func (m *Manager) ImportedCheckpoints(tenant string) ([]meta.Checkpoint, error) {
	cks, err := meta.List[checkpointRec](m.db, meta.Checkpoints)
	if err != nil {
		return nil, err
	}
	var out []meta.Checkpoint
	for _, c := range cks {
		if c.ImportedFrom != "" && c.Tenant == tenant {
			out = append(out, c.Checkpoint)
		}
	}
	return out, nil
}
