package fsnap_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pool"
	"github.com/molt-sh/molt/internal/testutil"
)

// BenchmarkSnapshotLineage takes b.N read-only snapshots of one live
// subvolume holding a copy of /usr/include (9,000 files and 130 MB here,
// about what a sandbox's Debian root holds), each after a small change
// and a syncfs, each into a directory of its own: the way a sandbox that
// checkpoints again and again (a tree search, an agent's turns)
// snapshots its root in the frozen window. It does so side by side in two
// fresh pools, one with the pool's default metadata node size and one
// with mkfs.btrfs's (16 KiB), a snapshot in each in turn, and prints the
// median snapshot of each 50 for both, so that the cost of a long
// lineage shows against a fresh one and against the baseline from one
// run:
//
//	go test -run XXX -bench SnapshotLineage -benchtime 500x ./internal/fsnap
func BenchmarkSnapshotLineage(b *testing.B) {
	testutil.RequireRoot(b)
	src := "/usr/include"
	if _, err := os.Stat(src); err != nil {
		b.Skipf("nothing to fill the subvolume with: %v", err)
	}
	type lineage struct {
		name string
		unit string // of the reported metrics
		dir  string
		live string
		took []time.Duration
	}
	var lines []*lineage
	for _, ns := range []int{pool.DefaultNodeSize, 16 << 10} {
		root := b.TempDir()
		p, err := pool.Open(b.Context(), pool.Config{Root: root, Size: 4 << 30, NodeSize: ns})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := p.Unmount(); err != nil {
				b.Error(err)
			}
		})
		if p.NodeSize != ns {
			b.Fatalf("pool made with node size %d has %d", ns, p.NodeSize)
		}
		l := &lineage{name: fmt.Sprintf("%d KiB nodes", ns>>10), unit: fmt.Sprintf("%dK", ns>>10), dir: p.Dir, live: filepath.Join(p.Dir, "live")}
		if err := fsnap.CreateSubvolume(l.live); err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", "--reflink=never", src, filepath.Join(l.live, "tree")).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v: %s", err, out)
		}
		if err := fsnap.SyncFS(l.live); err != nil {
			b.Fatal(err)
		}
		lines = append(lines, l)
	}
	page := make([]byte, 64<<10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, l := range lines {
			b.StopTimer()
			if err := os.WriteFile(filepath.Join(l.live, "f"+strconv.Itoa(i)), page, 0o644); err != nil {
				b.Fatal(err)
			}
			if err := fsnap.SyncFS(l.live); err != nil {
				b.Fatal(err)
			}
			ck := filepath.Join(l.dir, "ck"+strconv.Itoa(i))
			if err := os.Mkdir(ck, 0o755); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			t0 := time.Now()
			if err := fsnap.Snapshot(l.live, filepath.Join(ck, "fs"), true); err != nil {
				b.Fatal(err)
			}
			l.took = append(l.took, time.Since(t0))
		}
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		d = slices.Clone(d)
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	k := min(50, b.N)
	for _, l := range lines {
		first, last := median(l.took[:k]), median(l.took[len(l.took)-k:])
		b.ReportMetric(first, "ms/snap-first50-"+l.unit)
		b.ReportMetric(last, "ms/snap-last50-"+l.unit)
		if b.N >= 100 {
			fmt.Printf("%-14s median of each 50 snapshots (ms):", l.name)
			for i := 0; i+50 <= len(l.took); i += 50 {
				fmt.Printf(" %5.1f", median(l.took[i:i+50]))
			}
			fmt.Printf("\n%-14s after %d snapshots: %.1f ms against %.1f ms for the first 50 (%.1fx)\n", l.name, len(l.took), last, first, last/first)
		}
	}
	for _, l := range lines {
		for i := 0; i < b.N; i++ {
			_ = fsnap.DeleteSubvolume(filepath.Join(l.dir, "ck"+strconv.Itoa(i), "fs"))
		}
		_ = fsnap.DeleteSubvolume(l.live)
	}
}
