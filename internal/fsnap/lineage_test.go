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
)

// BenchmarkSnapshotLineage takes b.N read-only snapshots of one live
// subvolume holding a copy of /usr/include (9,000 files and 130 MB here,
// about what a sandbox's Debian root holds), each after a small change and a syncfs, each into
// a directory of its own: the way a sandbox that checkpoints again and
// again (a tree search, an agent's turns) snapshots its root in the
// frozen window. It reports the median snapshot of the first 50 next to
// that of the last 50, so the cost of a long lineage shows against a
// fresh one from one run:
//
//	go test -run XXX -bench SnapshotLineage -benchtime 300x ./internal/fsnap
func BenchmarkSnapshotLineage(b *testing.B) {
	src := "/usr/include"
	if _, err := os.Stat(src); err != nil {
		b.Skipf("nothing to fill the subvolume with: %v", err)
	}
	dir := btrfsDir(b)
	live := filepath.Join(dir, "live")
	if err := fsnap.CreateSubvolume(live); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--reflink=never", src, filepath.Join(live, "tree")).CombinedOutput(); err != nil {
		b.Fatalf("cp: %v: %s", err, out)
	}
	if err := fsnap.SyncFS(live); err != nil {
		b.Fatal(err)
	}
	page := make([]byte, 64<<10)
	took := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := os.WriteFile(filepath.Join(live, "f"+strconv.Itoa(i)), page, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := fsnap.SyncFS(live); err != nil {
			b.Fatal(err)
		}
		ck := filepath.Join(dir, "ck"+strconv.Itoa(i))
		if err := os.Mkdir(ck, 0o755); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		t0 := time.Now()
		if err := fsnap.Snapshot(live, filepath.Join(ck, "fs"), true); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
	}
	b.StopTimer()
	median := func(d []time.Duration) float64 {
		d = slices.Clone(d)
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	k := min(50, len(took))
	first, last := median(took[:k]), median(took[len(took)-k:])
	b.ReportMetric(first, "ms/snapshot-first50")
	b.ReportMetric(last, "ms/snapshot-last50")
	if b.N >= 100 {
		fmt.Printf("snapshots of one live subvolume, median of each 50 (ms):")
		for i := 0; i+50 <= len(took); i += 50 {
			fmt.Printf(" %.1f", median(took[i:i+50]))
		}
		fmt.Printf("\nafter %d snapshots: %.1f ms against %.1f ms for the first 50 (%.1fx)\n", len(took), last, first, last/first)
	}
	for i := 0; i < b.N; i++ {
		_ = fsnap.DeleteSubvolume(filepath.Join(dir, "ck"+strconv.Itoa(i), "fs"))
	}
	_ = fsnap.DeleteSubvolume(live)
}
