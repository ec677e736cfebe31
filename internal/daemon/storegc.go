package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/remote"
)

// startStoreGC runs a garbage collection over m's object store every
// period (none if 0), the first a period after the start. Only one
// daemon sharing a store should (docs/storage.md, "Garbage
// collection"). The returned stop waits for a run under way.
func startStoreGC(m *core.Manager, every, grace time.Duration, log *slog.Logger) (stop func()) {
	if every <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := m.StoreGC(ctx, remote.GCOptions{Grace: grace}); err != nil && ctx.Err() == nil {
				log.Warn("store gc failed; the next run tries again", "err", err)
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}
