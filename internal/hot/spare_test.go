package hot

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// A refill that fails is reported and leaves no spare; Drop waits for a
// refill in flight and voids its result; no refill starts after Close,
// which waits for the ones in flight.
func TestSparesRefill(t *testing.T) {
	var mu sync.Mutex
	var failed, released []string
	p := NewSpares(func(key string) {
		mu.Lock()
		released = append(released, key)
		mu.Unlock()
	}, func(key string, err error) {
		mu.Lock()
		failed = append(failed, key)
		mu.Unlock()
	})
	boom := errors.New("boom")
	p.Refill("sb", func(context.Context) (*Spare, error) { return nil, boom })
	p.Wait()
	if p.Ready("sb") != nil || len(failed) != 1 {
		t.Fatalf("ready %v, failed %v", p.Ready("sb"), failed)
	}
	// A refill in flight: Drop waits for it.
	release := make(chan struct{})
	started := make(chan struct{})
	p.Refill("sb", func(context.Context) (*Spare, error) {
		close(started)
		<-release
		return nil, boom
	})
	p.Refill("sb", func(context.Context) (*Spare, error) { t.Error("a second refill of one key"); return nil, boom })
	<-started
	dropped := make(chan struct{})
	go func() { p.Drop("sb"); close(dropped) }()
	select {
	case <-dropped:
		t.Fatal("Drop did not wait for the refill in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-dropped
	mu.Lock()
	if len(released) != 2 || released[0] != "sb" || released[1] != DumpKey("sb") {
		t.Errorf("released %v", released)
	}
	mu.Unlock()
	// Close waits for refills in flight, then none starts.
	slow := make(chan struct{})
	var ctxDone bool
	p.Refill("x", func(ctx context.Context) (*Spare, error) {
		<-slow
		ctxDone = ctx.Err() != nil
		return nil, boom
	})
	closed := make(chan struct{})
	go func() { p.Close(); close(closed) }()
	time.Sleep(20 * time.Millisecond)
	close(slow)
	<-closed
	if !ctxDone {
		t.Error("a refill's context did not end at Close")
	}
	p.Refill("y", func(context.Context) (*Spare, error) { t.Error("refill after Close"); return nil, boom })
	p.Wait()
	if p.Take("y") != nil || p.TakeDump("sb", zeroInit, 0) != nil {
		t.Error("spares after Close")
	}
}
