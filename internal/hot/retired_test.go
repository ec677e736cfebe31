package hot

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

// collector hands retired roots straight to Remove, as core's GC job
// does, and records the batches.
type collector struct {
	mu sync.Mutex
	// +checklocks:mu
	batches [][]RetiredRoot
	p       *Retired
}

func (c *collector) collect(id string, roots []RetiredRoot) {
	_ = c.p.Remove(roots, func(RetiredRoot, error) {})
	c.mu.Lock()
	c.batches = append(c.batches, roots)
	c.mu.Unlock()
}

func (c *collector) count() int { return len(c.all()) }

func (c *collector) all() [][]RetiredRoot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.batches)
}

func mkroots(t *testing.T, n int) []string {
	dir := t.TempDir()
	var out []string
	for i := range n {
		p := filepath.Join(dir, "root.old-"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// Roots wait while the sandbox keeps rolling back and go together once
// it has been quiet for RetireQuiet.
func TestRetiredQuiet(t *testing.T) {
	c := &collector{}
	c.p = NewRetired(c.collect, os.Remove)
	defer c.p.Close()
	roots := mkroots(t, 3)
	start := time.Now()
	for _, r := range roots {
		c.p.Retire("sb", r, zeroInit)
		time.Sleep(RetireQuiet / 10)
	}
	if c.count() != 0 && time.Since(start) < RetireQuiet {
		t.Fatalf("collected while rolling back")
	}
	for deadline := time.Now().Add(RetireQuiet + 10*time.Second); c.count() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if b := c.all(); len(b) != 1 || len(b[0]) != 3 {
		t.Fatalf("batches %v, want one of 3", b)
	}
	for _, r := range roots {
		if exists(r) {
			t.Errorf("%s still there", r)
		}
	}
}

// A backlog of RetireBacklog is collected at once.
func TestRetiredBacklog(t *testing.T) {
	c := &collector{}
	c.p = NewRetired(c.collect, os.Remove)
	defer c.p.Close()
	roots := mkroots(t, RetireBacklog)
	for _, r := range roots {
		c.p.Retire("sb", r, zeroInit)
	}
	if b := c.all(); len(b) != 1 || len(b[0]) != RetireBacklog {
		t.Fatalf("%d batches, want one of %d at once", c.count(), RetireBacklog)
	}
}

// Take cancels the pending collection; Close cancels them all and
// collects nothing more; Remove reports what it could not delete.
func TestRetiredTakeAndClose(t *testing.T) {
	c := &collector{}
	c.p = NewRetired(c.collect, os.Remove)
	roots := mkroots(t, 2)
	c.p.Retire("a", roots[0], zeroInit)
	c.p.Retire("b", roots[1], zeroInit)
	if got := c.p.Take("a"); len(got) != 1 || got[0].Path != roots[0] {
		t.Fatalf("take %v", got)
	}
	c.p.Close()
	c.p.Retire("b", roots[0], zeroInit) // after Close: held, never collected
	time.Sleep(RetireQuiet + RetireQuiet/2)
	if c.count() != 0 || !exists(roots[0]) || !exists(roots[1]) {
		t.Fatalf("collected after Take or Close: %v", c.all())
	}
	var failed []string
	boom := errors.New("boom")
	p := NewRetired(c.collect, func(string) error { return boom })
	if err := p.Remove([]RetiredRoot{{Path: "x"}, {Path: "y"}}, func(r RetiredRoot, err error) { failed = append(failed, r.Path) }); !errors.Is(err, boom) || len(failed) != 2 {
		t.Fatalf("remove: %v, failed %v", err, failed)
	}
	p.Close()
}
