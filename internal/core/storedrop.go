package core

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/atomicfile"
	"github.com/molt-sh/molt/internal/errdefs"
)

// Deletions from the object store of what a removed checkpoint or
// sandbox had there: the recipes and documents its GC keeps packs for
// (docs/storage.md, "Garbage collection"). Each is a file in
// pool/store-drops until done, so a daemon that stops first does it at
// its next start; one worker does them in order, and Close ends it.

// storeDrop is one such deletion: the recipes of checkpoints Recipes of
// sandbox Sandbox, and with Whole its document, but only if this host
// holds the sandbox: no document, one this host claimed, or one it
// offloaded that nobody resumed since (at Head). A sandbox another host
// resumed keeps all of it there.
type storeDrop struct {
	Sandbox string   `json:"sandbox"`
	Head    string   `json:"head,omitempty"`
	Recipes []string `json:"recipes,omitempty"`
	Whole   bool     `json:"whole,omitempty"`
}

// dropRetry is how long the worker waits before it tries again what the
// store failed (tests raise it).
var dropRetry = time.Minute

func (m *Manager) dropDir() string { return m.path("store-drops") }

// dropStored queues a deletion (see storeDrop).
func (m *Manager) dropStored(sandboxID, head string, ids []string, whole bool) {
	if m.store == nil || (len(ids) == 0 && !whole) {
		return
	}
	b, err := json.Marshal(storeDrop{Sandbox: sandboxID, Head: head, Recipes: ids, Whole: whole})
	if err == nil {
		err = os.MkdirAll(m.dropDir(), 0o700)
	}
	if err == nil {
		// Named by time, so the worker keeps their order.
		err = atomicfile.Write(filepath.Join(m.dropDir(), time.Now().UTC().Format("20060102T150405.000000000")+"-"+newID()+".json"), b, 0o600)
	}
	if err != nil {
		m.log.Warn("store: cannot queue the deletion of what a removed checkpoint or sandbox has there; it stays (its packs are kept for it)", "sandbox", sandboxID, "err", err)
		return
	}
	select {
	case m.dropWake <- struct{}{}:
	default:
	}
}

// startDrops starts the worker, which first does what a previous daemon
// left queued.
func (m *Manager) startDrops() {
	if m.store == nil {
		return
	}
	m.goStoreWorker(func(ctx context.Context) {
		for {
			m.doDrops(ctx)
			select {
			case <-ctx.Done():
				return
			case <-m.dropWake:
			case <-time.After(dropRetry): // retry what failed
			}
		}
	})
}

// goStoreWorker runs work on a goroutine of the store's workers (Close
// waits for them), with a context that ends as the manager closes.
func (m *Manager) goStoreWorker(work func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	m.dropWG.Add(2)
	go func() {
		defer m.dropWG.Done()
		<-m.closing
		cancel()
	}()
	go func() {
		defer m.dropWG.Done()
		work(ctx)
	}()
}

// doDrops does the queued deletions in order; one that fails stays
// queued, and the rest wait for it.
func (m *Manager) doDrops(ctx context.Context) {
	ents, err := os.ReadDir(m.dropDir())
	if err != nil {
		return
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".json") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, name := range names {
		path := filepath.Join(m.dropDir(), name)
		b, err := os.ReadFile(path)
		var d storeDrop
		if err == nil {
			err = json.Unmarshal(b, &d)
		}
		if err != nil {
			m.log.Warn("store: an unreadable queued deletion is dropped", "file", path, "err", err)
			_ = os.Remove(path)
			continue
		}
		if err := m.doDrop(ctx, d); err != nil {
			if ctx.Err() == nil {
				m.log.Warn("store: deleting what a removed checkpoint or sandbox has there failed; retried", "sandbox", d.Sandbox, "err", err)
			}
			return
		}
		_ = os.Remove(path)
	}
}

func (m *Manager) doDrop(ctx context.Context, d storeDrop) error {
	doc := false
	if d.Whole {
		sd, err := m.store.Sandbox(ctx, d.Sandbox)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
		case err != nil:
			return err
		case sd.Owner == m.cks.Keyring().KeyID() || (sd.Owner == "" && sd.Head == d.Head):
			doc = true
		default:
			return nil // another host's now
		}
	}
	for _, id := range d.Recipes {
		if err := m.store.Delete(ctx, id); err != nil {
			return err
		}
	}
	if doc {
		return m.store.DeleteSandbox(ctx, d.Sandbox)
	}
	return nil
}
