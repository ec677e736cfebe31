package core

import (
	"fmt"
	"sort"
	"strings"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// Failed checkpoints. A full checkpoint is reported pending once its
// instant is captured; if storing it fails (a full disk, a failed dump of
// the copies), it is not dropped silently: its record moves to the
// FailedCheckpoints bucket with the reason, where `molt checkpoints`
// lists it as failed until it is deleted or its sandbox removed. It
// holds nothing (its directory is gone, it is out of the tree), so a
// rollback or fork to it is refused as a failed precondition. A pending
// checkpoint lost with a daemon that died before its commit is recorded
// the same way at start-up (the head that named it says so).

func failedKey(sandbox, id string) string { return sandbox + "/" + id }

// recordFailed keeps ck as failed, with the reason.
func (m *Manager) recordFailed(ck checkpointRec, reason error) {
	ck.Pending, ck.Failed = false, true
	ck.FailedReason = reason.Error()
	ck.Objects = nil
	if err := m.db.Put(meta.FailedCheckpoints, failedKey(ck.Sandbox, ck.ID), ck); err != nil {
		m.log.Warn("cannot record a failed checkpoint", "checkpoint", ck.ID, "err", err)
	}
}

// failedOf lists the failed checkpoints of a sandbox.
func (m *Manager) failedOf(sandbox string) []checkpointRec {
	var out []checkpointRec
	_ = m.db.ForEachPrefix(meta.FailedCheckpoints, sandbox+"/", func(_ string, b []byte) error {
		var c checkpointRec
		if meta.Unmarshal(b, &c) == nil {
			out = append(out, c)
		}
		return nil
	})
	return out
}

// findFailed finds a failed checkpoint by ID, ID prefix or label (the
// newest of that label; those of sandboxID first).
func (m *Manager) findFailed(ref, sandboxID string) (checkpointRec, bool) {
	var own, all []checkpointRec
	_ = m.db.ForEachPrefix(meta.FailedCheckpoints, "", func(_ string, b []byte) error {
		var c checkpointRec
		if meta.Unmarshal(b, &c) != nil {
			return nil
		}
		if c.ID == ref || c.Label == ref || (len(ref) >= 4 && strings.HasPrefix(c.ID, ref)) {
			all = append(all, c)
			if c.Sandbox == sandboxID {
				own = append(own, c)
			}
		}
		return nil
	})
	for _, set := range [][]checkpointRec{own, all} {
		if len(set) > 0 {
			sort.Slice(set, func(i, j int) bool { return set[i].Created.After(set[j].Created) })
			return set[0], true
		}
	}
	return checkpointRec{}, false
}

// failedError refuses to use a failed checkpoint.
func failedError(c checkpointRec) error {
	return fmt.Errorf("checkpoint %s failed and holds nothing to restore (%s); delete it: %w", c.ID, c.FailedReason, errdefs.ErrFailedPrecondition)
}

func (m *Manager) deleteFailed(c checkpointRec) error {
	return m.db.Delete(meta.FailedCheckpoints, failedKey(c.Sandbox, c.ID))
}
