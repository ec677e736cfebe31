package core

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/remote"
)

// sandboxHistory is what moves with a sandbox between hosts beside its
// checkpoints and its record: its turn log and its effect ledger. An
// offload and a migration put it in the store (remote.Store.PutHistory)
// and name it in the sandbox's signed document; an adoption installs it
// in place of anything the host had of them.
type sandboxHistory struct {
	Turns  []meta.TurnRecord `json:"turns,omitempty"`
	Ledger []byte            `json:"ledger,omitempty"`
}

// exportHistory is sandbox id's history as the store keeps it, or nil
// when it has none. What this host seals with its tenants' data keys
// does not move (another host could not open it): such a sandbox is
// refused with errdefs.ErrNotSupported.
func (m *Manager) exportHistory(id string) ([]byte, error) {
	var h sandboxHistory
	err := m.db.ForEachPrefix(meta.Turns, id+"/", func(_ string, b []byte) error {
		var tr meta.TurnRecord
		if err := json.Unmarshal(b, &tr); err != nil {
			return err
		}
		if len(tr.SealedCommands) > 0 || len(tr.SealedLLM) > 0 {
			return fmt.Errorf("turn %d of sandbox %s is recorded sealed with this host's data keys; moving it to another host is not supported yet: %w", tr.Turn, id, errdefs.ErrNotSupported)
		}
		h.Turns = append(h.Turns, tr)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("the turn log of %s: %w", id, err)
	}
	if m.ledger != nil {
		if h.Ledger, err = m.ledger.Export(id); err != nil {
			return nil, err
		}
	}
	if len(h.Turns) == 0 && h.Ledger == nil {
		return nil, nil
	}
	return json.Marshal(h)
}

// putHistory puts sandbox id's history into the store and names it in
// doc.
func (m *Manager) putHistory(ctx context.Context, id string, doc *remote.SandboxDoc) error {
	b, err := m.exportHistory(id)
	if err != nil || b == nil {
		return err
	}
	h, err := m.store.PutHistory(ctx, id, b)
	if err != nil {
		return err
	}
	doc.History = &h
	return nil
}

// storedHistory reads and checks the history doc names, or nil.
func (m *Manager) storedHistory(ctx context.Context, doc remote.SandboxDoc) (*sandboxHistory, error) {
	if doc.History == nil {
		return nil, nil
	}
	b, err := m.store.History(ctx, doc.Sandbox, *doc.History)
	if err != nil {
		return nil, err
	}
	var h sandboxHistory
	if err := strictRecord(b, &h); err != nil {
		return nil, fmt.Errorf("store: the history of %s: %v: %w", doc.Sandbox, err, errdefs.ErrFailedPrecondition)
	}
	prev := 0
	for _, tr := range h.Turns {
		if tr.Sandbox != doc.Sandbox || tr.Turn <= prev || len(tr.SealedCommands) > 0 || len(tr.SealedLLM) > 0 {
			return nil, fmt.Errorf("store: the history of %s: turn %d of sandbox %q out of order, or sealed: %w", doc.Sandbox, tr.Turn, tr.Sandbox, errdefs.ErrFailedPrecondition)
		}
		prev = tr.Turn
	}
	return &h, nil
}

// installHistory makes h sandbox id's turn log and ledger here, in
// place of what this host had of them (an older copy, from when the
// sandbox last ran here). The ledger is checked whole before it
// replaces anything.
func (m *Manager) installHistory(id string, h *sandboxHistory) error {
	if h == nil {
		return nil
	}
	if h.Ledger != nil {
		if m.ledger == nil {
			return fmt.Errorf("sandbox %s has an effect ledger and this daemon keeps none: %w", id, errdefs.ErrNotSupported)
		}
		if err := m.ledger.Import(id, h.Ledger); err != nil {
			return err
		}
	}
	return m.db.Update(func(tx *meta.Tx) error {
		if err := tx.DeletePrefix(meta.Turns, id+"/"); err != nil {
			return err
		}
		for _, tr := range h.Turns {
			if err := tx.Put(meta.Turns, meta.TurnKey(id, tr.Turn), tr); err != nil {
				return err
			}
		}
		return nil
	})
}
