package core

import (
	"context"
	"fmt"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/meta"
)

// verify checks every object the checkpoint's record lists (see
// ckstore.Reader.Verify). Nothing is restored from a checkpoint that
// fails; `molt checkpoint verify` is thorough.
func (m *Manager) verify(ck checkpointRec, thorough bool) error {
	// A checkpoint whose local copy was freed comes back from the
	// store first (offload.go), verified thoroughly there.
	if err := m.ensureLocal(context.Background(), &ck); err != nil {
		return err
	}
	// Through the store's Reader: the artifact must be complete (its
	// own manifest written) as well as intact, and a backend that
	// decrypts or fetches does it here.
	if _, err := m.cks.Reader(ck.ID).Open(ck.Objects, thorough); err != nil {
		return err
	}
	if thorough {
		// Every restore of processes validates the images it hands to
		// CRIU (restoreTree); `--tier cold` and `molt checkpoint
		// verify` do it here too, before anything else of the restore.
		return m.validateImages(ck)
	}
	return nil
}

// validateImages checks a full checkpoint's CRIU images as hostile input
// (criu.ValidateImages). A sealed checkpoint's images are validated
// decrypted (openImages), as CRIU reads them.
func (m *Manager) validateImages(ck checkpointRec) error {
	if ck.Kind != v1.KindFull {
		return nil
	}
	dir, done, err := m.openImages(ck)
	if err != nil {
		return err
	}
	defer done()
	return checkImages(ck, dir)
}

// checkImages runs criu.ValidateImages on dir, checkpoint ck's images.
func checkImages(ck checkpointRec, dir string) error {
	if err := criu.ValidateImages(dir, criu.DefaultLimits()); err != nil {
		return fmt.Errorf("checkpoint %s: %w", ck.ID, err)
	}
	return nil
}

// VerifyCheckpoint runs the verification a restore runs.
func (m *Manager) VerifyCheckpoint(ref string) (meta.Checkpoint, error) {
	if err := m.pipe.wait(context.Background(), ref, ""); err != nil {
		return meta.Checkpoint{}, err
	}
	ck, err := m.lookupCheckpoint(ref, "")
	if err != nil {
		return meta.Checkpoint{}, err
	}
	return ck.Checkpoint, m.verify(ck, true)
}

// VerifyChain verifies the lineage of checkpoint ref: every manifest
// from it to its root is signed by a trusted key and names its recorded
// parent and that parent's digest; the checkpoint's own objects are
// hashed too. A broken lineage is reported link by link, not as an
// error: the error is for a checkpoint that cannot be found.
func (m *Manager) VerifyChain(ref string) (meta.ChainVerification, error) {
	if err := m.pipe.wait(context.Background(), ref, ""); err != nil {
		return meta.ChainVerification{}, err
	}
	ck, err := m.lookupCheckpoint(ref, "")
	if err != nil {
		return meta.ChainVerification{}, err
	}
	k := m.cks.Keyring()
	links, cerr := m.cks.VerifyChain(k, ck.ID, func(id string) (string, bool) {
		var c checkpointRec
		if err := m.db.Get(meta.Checkpoints, id, &c); err != nil {
			return "", false
		}
		return c.Parent, true
	})
	out := meta.ChainVerification{Checkpoint: ck.ID, OK: cerr == nil, Key: k.KeyID(), Trusted: k.Trusted(), Links: []meta.ChainLink{}}
	for _, l := range links {
		out.Links = append(out.Links, meta.ChainLink(l))
	}
	if err := m.verify(ck, true); err != nil && ck.Kind == v1.KindFull {
		out.OK = false
		if len(out.Links) > 0 && out.Links[0].Problem == "" {
			out.Links[0].Problem = err.Error()
		}
	}
	return out, nil
}
