package core

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestCommitGate: a foreground holder waits for a background commit
// already running; while it waits or holds, no new background commit
// starts; a foreground wait that gives up leaves the gate open.
func TestCommitGate(t *testing.T) {
	var g commitGate
	ctx := context.Background()
	// Every wait is bounded: a broken gate fails the test, not hangs it.
	recv := func(ch chan func(), what string) func() {
		t.Helper()
		select {
		case rel := <-ch:
			return rel
		case <-time.After(time.Second):
			t.Fatalf("%s within a second", what)
			return nil
		}
	}
	bgDone, err := g.background(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fgIn := make(chan func(), 1)
	go func() {
		rel, err := g.foreground(ctx)
		if err != nil {
			t.Error(err)
		}
		fgIn <- rel
	}()
	select {
	case <-fgIn:
		t.Fatal("the foreground holder did not wait for the running background commit")
	case <-time.After(50 * time.Millisecond):
	}
	// A second background commit must not start while the foreground
	// waits.
	bg2 := make(chan func(), 1)
	go func() {
		rel, err := g.background(ctx)
		if err != nil {
			t.Error(err)
		}
		bg2 <- rel
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case <-bg2:
		t.Fatal("a background commit started while a foreground holder waited")
	default:
	}
	bgDone()
	fgRelease := recv(fgIn, "the foreground holder did not get the gate after the background commit ended")
	select {
	case <-bg2:
		t.Fatal("a background commit started while the foreground held the gate")
	case <-time.After(50 * time.Millisecond):
	}
	fgRelease()
	fgRelease() // idempotent
	recv(bg2, "the background commit did not start after the foreground released")()

	// A foreground wait that is cancelled does not keep background out.
	bgDone, _ = g.background(ctx)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := g.foreground(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled foreground wait: %v", err)
	}
	bgDone()
	done := make(chan struct{})
	go func() {
		rel, err := g.background(ctx)
		if err == nil {
			rel()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("a cancelled foreground wait kept background commits out")
	}
}
