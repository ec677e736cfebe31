package core

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/store"
	"golang.org/x/sys/unix"
)

// A takeoverRec records a switch of a sandbox's live tree that may be
// under way: a rollback that promotes a standby (hot) or restores a tree
// next to the live one (warm), or an fs rollback's switch to the
// checkpoint's files (no tree). The switch is the exchange of the new
// root with the sandbox's (replaceRoot), then the kill of the old tree;
// the sandbox's record names the new init only once that is done.
// A daemon that dies in between left a sandbox whose record names a dead
// init, or a live one about to be killed, next to a new tree that runs on
// unreachable.
//
// The record is written before the switch can start: for a standby as
// soon as it is ready, off the rollback's path (a rollback adds no write
// of its own), for a warm restore just before the exchange. It is deleted
// in the same transaction that writes the sandbox's new record, so it
// outlives the switch exactly when that record was never written. At
// start-up (finishTakeovers) a record whose root is the sandbox's root
// is a switch that happened: the daemon completes it. Any other record
// is a switch that never started, and goes.
type takeoverRec struct {
	Init sandbox.Init `json:"init"` // the new tree's init; none for an fs rollback
	// Root is the UUID of the new tree's root subvolume (a UUID, not a
	// path: after the exchange the paths name each other's roots).
	Root string `json:"root"`
	Path string `json:"path"` // where that root waits to be switched in
	Head string `json:"head"` // the checkpoint the sandbox goes back to
	// Restart: an fs rollback that starts a fresh init once its files
	// are in place (the sandbox was running).
	Restart bool `json:"restart,omitempty"`
}

// recordTakeover writes the takeover t of sandbox id (t.Root is filled
// in from t.Path) under the key id/name, unique to the new tree, and
// returns the key.
func (m *Manager) recordTakeover(id, name string, t takeoverRec) (string, error) {
	uuid, err := fsnap.SubvolumeUUID(t.Path)
	if err != nil {
		return "", err
	}
	t.Root = uuid
	key := id + "/" + name
	if err := m.db.Put(store.Takeovers, key, t); err != nil {
		return "", err
	}
	return key, nil
}

// commitTakeover writes the sandbox's record after a switch and deletes
// the switch's takeover record, in one transaction.
func (m *Manager) commitTakeover(rec sandboxRec, key string) error {
	return m.db.Update(func(tx *store.Tx) error {
		if err := tx.Put(store.Sandboxes, rec.ID, rec); err != nil {
			return err
		}
		return tx.Delete(store.Takeovers, key)
	})
}

// forgetTakeover deletes a takeover record that can no longer happen (a
// standby dropped or adopted by a fork). A record left behind is
// harmless (its root never becomes the sandbox's), and start-up deletes
// it; this only keeps the database from collecting them meanwhile.
func (m *Manager) forgetTakeover(key string) {
	if key == "" {
		return
	}
	if err := m.db.Delete(store.Takeovers, key); err != nil {
		m.log.Warn("cannot delete takeover record", "key", key, "err", err)
	}
}

// finishTakeovers completes, at start-up, the switches of sandboxes'
// live trees a crashed daemon left half done (see takeoverRec), and
// deletes every takeover record. sbs are the sandboxes' records, updated
// in place.
func (m *Manager) finishTakeovers(ctx context.Context, sbs []sandboxRec) error {
	var restart []*sandboxRec
	pending := map[string][]takeoverRec{}
	var stale []string
	err := m.db.ForEachPrefix(store.Takeovers, "", func(key string, b []byte) error {
		var t takeoverRec
		if err := store.Unmarshal(b, &t); err != nil {
			m.log.Warn("dropping unreadable takeover record", "key", key, "err", err)
		} else if id, _, ok := strings.Cut(key, "/"); ok {
			pending[id] = append(pending[id], t)
		}
		stale = append(stale, key)
		return nil
	})
	if err != nil {
		return err
	}
	for i := range sbs {
		s := &sbs[i]
		ts := pending[s.ID]
		// A restart a crash interrupted (after its kill, before its new
		// init's record) is done again.
		if s.Restarting {
			m.log.Warn("completing a restart a crash interrupted", "sandbox", s.ID)
			restart = append(restart, s)
		}
		if len(ts) == 0 {
			continue
		}
		root, err := fsnap.SubvolumeUUID(m.sbRoot(s.ID))
		if err != nil {
			m.log.Warn("cannot tell whether a rollback switched the sandbox's root", "sandbox", s.ID, "err", err)
			continue
		}
		for _, t := range ts {
			if t.Root != root {
				continue
			}
			m.log.Warn("completing a rollback a crash interrupted", "sandbox", s.ID, "checkpoint", t.Head, "init", t.Init.Pid)
			if old := s.Init; old != t.Init && old.Signal(unix.SIGKILL) == nil {
				waitGone(old, 5*time.Second)
			}
			s.Head = t.Head
			// An fs rollback's switch has no tree of its own: the
			// sandbox's processes were killed before it. It starts a
			// fresh init below if the rollback would have, else it is
			// reported lost until started.
			if t.Restart && !slices.Contains(restart, s) {
				restart = append(restart, s)
			}
			if t.Init != (sandbox.Init{}) {
				s.Init, s.State, s.Reason = t.Init, v1.StateRunning, ""
				if t.Init.Alive() {
					if err := continueTree(*s, t.Init, m.headImages(t.Head)); err != nil {
						m.log.Warn("cannot continue the sandbox's new tree", "sandbox", s.ID, "err", err)
					}
				}
			}
			// After the exchange t.Path holds the old root, unless it
			// was already moved aside (root.old-*, removed with the
			// other leftovers).
			if err := removeTree(t.Path); err != nil {
				m.log.Warn("cannot remove the sandbox's old root", "sandbox", s.ID, "path", t.Path, "err", err)
			}
			if err := m.db.Put(store.Sandboxes, s.ID, *s); err != nil {
				return fmt.Errorf("complete the rollback of %s: %w", s.ID, err)
			}
		}
	}
	err = m.db.Update(func(tx *store.Tx) error {
		for _, key := range stale {
			if err := tx.Delete(store.Takeovers, key); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, s := range restart {
		if err := m.restart(ctx, s); err != nil {
			m.log.Warn("cannot restart the sandbox after its interrupted rollback or restart; start it by hand", "sandbox", s.ID, "err", err)
		}
	}
	return nil
}
