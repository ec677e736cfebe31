package core

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/hot"
)

// Roots left by rollbacks wait while the sandbox keeps rolling back and
// are deleted once it has been quiet for hot.RetireQuiet; stopping the
// sandbox deletes them at once.
func TestRetiredRootsCollected(t *testing.T) {
	m, sb := warmOnly(t)
	ctx := context.Background()
	ck, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	retired := func() []string {
		t.Helper()
		r, err := filepath.Glob(filepath.Join(m.sbDir(sb), "root.old-*"))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	waitRetired := func(n int, limit time.Duration) []string {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			r := retired()
			if len(r) == n || time.Now().After(deadline) {
				return r
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for round := 0; round < 2; round++ {
		start := time.Now()
		for i := 0; i < 3; i++ {
			if _, err := m.Rollback(ctx, sb, ck.ID); err != nil {
				t.Fatal(err)
			}
		}
		if round == 0 {
			// Within the quiet period all three are still there (each
			// once its old tree is gone).
			if r := waitRetired(3, hot.RetireQuiet/2); len(r) != 3 && time.Since(start) < hot.RetireQuiet {
				t.Fatalf("retired roots while rolling back: %v, want 3", r)
			}
			if r := waitRetired(0, hot.RetireQuiet+5*time.Second); len(r) != 0 {
				t.Fatalf("retired roots %v still there %v after the last rollback", r, time.Since(start))
			}
			continue
		}
		// Stopping does not wait for the quiet period.
		if _, err := m.Stop(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if r := retired(); len(r) != 0 {
			t.Fatalf("retired roots after stop: %v", r)
		}
	}
}
