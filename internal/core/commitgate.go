package core

import (
	"context"
	"sync"
)

// commitGate orders the pool's btrfs transaction commits. A snapshot
// commits the whole pool, so one taken in a capture's frozen window waits
// for any commit already running, such as the snapshot and syncfs with
// which persist ends: in a tree search (one sandbox capturing, storing the
// previous capture and rolling back in turn) that made the capture's
// snapshot the long pole of its stall (25-43 ms against 10-19 ms for
// CRIU). Foreground holders (captures, from their syncfs to the thaw; a
// rollback's snapshot of the checkpoint's files) go first: a background
// commit (persist's closing snapshot and syncfs; a standby's snapshot)
// does not start while one holds or waits, and a foreground holder waits
// for background commits already running before it begins, outside its
// frozen window.
type commitGate struct {
	mu sync.Mutex
	fg int // +checklocks:mu
	bg int // +checklocks:mu
	// Closed and replaced on every release.
	changed chan struct{} // +checklocks:mu
}

// +checklocks:g.mu
func (g *commitGate) wake() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// +checklocks:g.mu
func (g *commitGate) waitChange() <-chan struct{} {
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.changed
}

// foreground waits until no background commit runs and holds the gate
// for foreground work; release ends the hold.
func (g *commitGate) foreground(ctx context.Context) (release func(), err error) {
	g.mu.Lock()
	g.fg++ // waiting counts: no new background commit starts meanwhile
	err = g.waitWhile(ctx, &g.bg)
	release = g.releaser(&g.fg)
	g.mu.Unlock()
	if err != nil {
		release()
		return nil, err
	}
	return release, nil
}

// background waits until no foreground work holds or waits for the gate
// and holds it for a background commit.
func (g *commitGate) background(ctx context.Context) (release func(), err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.waitWhile(ctx, &g.fg); err != nil {
		return nil, err
	}
	g.bg++
	return g.releaser(&g.bg), nil
}

// waitWhile waits, with g.mu held on entry and on return, until the
// count busy (g.fg or g.bg) is 0 or ctx is done.
//
// +checklocks:g.mu
func (g *commitGate) waitWhile(ctx context.Context, busy *int) error {
	for *busy > 0 {
		ch := g.waitChange()
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			g.mu.Lock()
			return ctx.Err()
		}
		g.mu.Lock()
	}
	return nil
}

// releaser returns the release of one hold counted in n; it may be
// called more than once.
func (g *commitGate) releaser(n *int) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			*n--
			g.wake()
			g.mu.Unlock()
		})
	}
}
