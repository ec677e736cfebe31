package hot

import (
	"strings"

	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
)

// A Record records a switch of a sandbox's live tree that may be under
// way: a rollback that promotes a standby (hot) or restores a tree next
// to the live one (warm), or an fs rollback's switch to the checkpoint's
// files (no tree). The switch is the exchange of the new root with the
// sandbox's, then the kill of the old tree; the sandbox's record names
// the new init only once that is done. A daemon that dies in between
// left a sandbox whose record names a dead init, or a live one about to
// be killed, next to a new tree that runs on unreachable.
//
// The record is written before the switch can start: for a standby as
// soon as it is ready, off the rollback's path (a rollback adds no write
// of its own), for a warm restore just before the exchange. It is
// deleted in the same transaction that writes the sandbox's new record
// (Commit), so it outlives the switch exactly when that record was never
// written. At start-up a record whose root is the sandbox's root is a
// switch that happened (Switched): the daemon completes it. Any other
// record is a switch that never started, and goes.
type Record struct {
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

// Takeovers keeps the takeover records in the metadata store.
type Takeovers struct{ db *meta.DB }

// NewTakeovers returns the takeover records of db.
func NewTakeovers(db *meta.DB) *Takeovers { return &Takeovers{db: db} }

// Record writes the takeover r of sandbox id (r.Root is filled in from
// r.Path) under the key id/name, unique to the new tree, and returns the
// key.
func (t *Takeovers) Record(id, name string, r Record) (string, error) {
	uuid, err := fsnap.SubvolumeUUID(r.Path)
	if err != nil {
		return "", err
	}
	r.Root = uuid
	key := id + "/" + name
	if err := t.db.Put(meta.Takeovers, key, r); err != nil {
		return "", err
	}
	return key, nil
}

// Commit runs write (which writes the sandbox's record after a switch)
// and deletes the switch's takeover record key, in one transaction.
func (t *Takeovers) Commit(key string, write func(*meta.Tx) error) error {
	return t.db.Update(func(tx *meta.Tx) error {
		if err := write(tx); err != nil {
			return err
		}
		return tx.Delete(meta.Takeovers, key)
	})
}

// Forget deletes a takeover record that can no longer happen (a standby
// dropped or adopted by a fork). A record left behind is harmless (its
// root never becomes the sandbox's), and start-up deletes it; this only
// keeps the database from collecting them meanwhile.
func (t *Takeovers) Forget(key string) error {
	if key == "" {
		return nil
	}
	return t.db.Delete(meta.Takeovers, key)
}

// Pending reads every takeover record at start-up, by sandbox, and
// returns the keys of all of them, unreadable ones included (unreadable
// hears of those).
func (t *Takeovers) Pending(unreadable func(key string, err error)) (map[string][]Record, []string, error) {
	pending := map[string][]Record{}
	var keys []string
	err := t.db.ForEachPrefix(meta.Takeovers, "", func(key string, b []byte) error {
		var r Record
		if err := meta.Unmarshal(b, &r); err != nil {
			unreadable(key, err)
		} else if id, _, ok := strings.Cut(key, "/"); ok {
			pending[id] = append(pending[id], r)
		}
		keys = append(keys, key)
		return nil
	})
	return pending, keys, err
}

// Switched returns the records of rs whose root is now the sandbox's
// (root, its root's UUID): the switches that happened.
func Switched(rs []Record, root string) []Record {
	var out []Record
	for _, r := range rs {
		if r.Root == root {
			out = append(out, r)
		}
	}
	return out
}

// Clear deletes the takeover records keys, in one transaction.
func (t *Takeovers) Clear(keys []string) error {
	return t.db.Update(func(tx *meta.Tx) error {
		for _, key := range keys {
			if err := tx.Delete(meta.Takeovers, key); err != nil {
				return err
			}
		}
		return nil
	})
}
