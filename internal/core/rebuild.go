package core

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/meta"
)

// The on-disk copies of the records, their writer and the rebuild of a
// lost database from them are internal/meta's (copies.go, rebuild.go).
// What meta cannot know is the engine's, and given to it here
// (metaDisk): where each record's copy lives in the pool, what a
// checkpoint's manifest holds beyond its record (ckstore), how an
// artifact is checked complete, and quarantine.

// Names of the on-disk records.
const (
	sandboxFile  = "sandbox.json"
	manifestFile = ckstore.ManifestFile
)

// imageFile is the on-disk record of image name (hidden: an image may
// be named like another's record).
func (m *Manager) imageFile(name string) string { return m.path("images", "."+name+".json") }

// metaDisk tells meta where the records' copies are and what the pool
// holds.
func (m *Manager) metaDisk() *meta.Disk {
	return &meta.Disk{
		Log:               m.log,
		SandboxCopy:       func(id string) string { return filepath.Join(m.sbDir(id), sandboxFile) },
		ImageCopy:         m.imageFile,
		ManifestCopy:      func(id string) string { return filepath.Join(m.ckDir(id), manifestFile) },
		CommittedManifest: m.committedManifest,
		ManifestCurrent: func(c checkpointRec) bool {
			mf, err := m.cks.ReadManifest(c.ID)
			return err == nil && mf.Committed && mf.ID == c.ID && mf.Parent == c.Parent && mf.Label == c.Label
		},
		Background: func() (func(), error) { return m.commits.background(context.Background()) },
		List: func(kind string) []fs.DirEntry {
			ents, _ := os.ReadDir(m.path(kind))
			return ents
		},
		ValidName:   validName,
		Checkpoint:  m.checkpointOnDisk,
		SandboxRoot: m.sbRoot,
		Quarantine:  m.quarantine,
	}
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
	if k := m.cks.Keyring(); k != nil {
		k.Sign(&mf)
	}
	mb, _ := json.MarshalIndent(mf, "", "  ")
	return mb
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
		BytesWritten: mf.BytesWritten, ImageBytes: ckstore.ImageBytes(mf.Objects), Keep: mf.Keep, DataKey: mf.DataKey,
		ImportedFrom: mf.ImportedFrom, ImportSigner: mf.ImportSigner,
	}, Image: mf.Image, KeyTenant: mf.KeyTenant, Tenant: mf.Tenant, Objects: mf.Objects, CRIU: mf.CRIU,
		ExternalNet: mf.ExternalNet, ExternalUTS: mf.ExternalUTS, ExternalIPC: mf.ExternalIPC, IDs: mf.IDs, LedgerHead: mf.LedgerHead, EgressAddr: mf.EgressAddr, Turn: mf.Turn}
	if !mf.Committed {
		m.log.Warn("rebuilding a complete checkpoint whose manifest was not marked committed", "checkpoint", id)
	}
	return ck, ""
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
		if cg, err := cgroup.Load(m.cgroupName(id)); err == nil {
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
