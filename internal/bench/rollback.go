package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/daemon"
)

// RollbackConfig configures the rollback benchmark.
type RollbackConfig struct {
	Image      string
	CriuPath   string
	Iterations int // per tier; the cold baseline runs a third as many
	HeapMiB    int
	Progress   io.Writer
}

// RollbackRow is one workload's result.
type RollbackRow struct {
	Workload string `json:"workload"`
	Stall    Stats  `json:"checkpoint_stall"`
	// StallParts are the p50s of the stall's parts (v1.StallParts)
	// over the same checkpoints.
	StallParts v1.StallParts `json:"checkpoint_stall_parts_p50"`
	// Captures counts those checkpoints by capture (v1.CaptureCOW...).
	Captures map[string]int `json:"captures"`
	Hot      Stats          `json:"hot"`
	Warm     Stats          `json:"warm"`
	Cold     Stats          `json:"cold_copy_and_restore"`
}

// RollbackResult is the outcome of RunRollback.
type RollbackResult struct {
	Rows []RollbackRow `json:"rows"`
}

// stallSamples is how many full checkpoints per workload give the stall.
const stallSamples = 15

// RunRollback measures rollback latency to one full checkpoint: hot
// (promoting a standby), warm (a CRIU restore from molt's images), and a
// cold baseline (a full copy of the root plus a plain CRIU restore of
// full images), for the process workloads.
func RunRollback(ctx context.Context, e *daemon.Ephemeral, cfg RollbackConfig) (RollbackResult, error) {
	c := e.Client
	progress := progressf(cfg.Progress)
	h, err := c.Host(ctx)
	if err != nil {
		return RollbackResult{}, err
	}
	var res RollbackResult
	for _, w := range processWorkloads(ctx, c, cfg.HeapMiB) {
		progress("rollback: %s", w.name)
		sb, err := w.start(ctx, cfg.Image)
		if err != nil {
			return res, err
		}
		row := RollbackRow{Workload: w.name}
		var stall, protect, criu, snap, copying Sample
		var ck v1.Checkpoint
		row.Captures = map[string]int{}
		for i := 0; i < stallSamples; i++ {
			if ck, err = c.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}); err != nil {
				return res, err
			}
			stall = append(stall, msDur(ck.StallMS))
			if p := ck.StallParts; p != nil {
				protect = append(protect, msDur(p.ProtectMS))
				criu = append(criu, msDur(p.CRIUMS))
				snap = append(snap, msDur(p.SnapshotMS))
				copying = append(copying, msDur(p.CopyMS))
			}
			row.Captures[ck.Capture]++
		}
		row.Stall = stall.Stats()
		row.StallParts = v1.StallParts{ProtectMS: protect.Stats().P50, CRIUMS: criu.Stats().P50, SnapshotMS: snap.Stats().P50, CopyMS: copying.Stats().P50}

		var hot, warm Sample
		for i := 0; i < cfg.Iterations; i++ {
			if err := waitStandby(ctx, e, sb.ID, ck.ID); err != nil {
				return res, err
			}
			t0 := time.Now()
			r, err := c.Rollback(ctx, sb.ID, ck.ID)
			if err != nil {
				return res, err
			}
			if r.Tier != v1.TierHot {
				return res, fmt.Errorf("rollback with a standby ready took tier %s", r.Tier)
			}
			hot = append(hot, time.Since(t0))
		}
		for i := 0; i < cfg.Iterations; i++ {
			t0 := time.Now()
			if _, err := c.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
				return res, err
			}
			warm = append(warm, time.Since(t0))
		}
		row.Hot, row.Warm = hot.Stats(), warm.Stats()

		progress("rollback: %s: cold baseline (cp -a of the root + criu restore)", w.name)
		src, err := newColdSource(ctx, c, cfg.CriuPath, h.Pool.Dir, sb.ID)
		if err != nil {
			return res, err
		}
		var cold Sample
		for i := 0; i < max(2, cfg.Iterations/3); i++ {
			took, err := src.copy()
			if err != nil {
				src.remove()
				return res, err
			}
			cold = append(cold, took)
		}
		row.Cold = cold.Stats()
		src.remove()
		res.Rows = append(res.Rows, row)
		if err := c.Remove(ctx, sb.ID); err != nil {
			return res, err
		}
	}
	return res, nil
}

// waitStandby waits until the sandbox's standby for ck is ready.
func waitStandby(ctx context.Context, e *daemon.Ephemeral, sb, ck string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s, err := e.Client.Sandbox(ctx, sb)
		if err != nil {
			return err
		}
		if s.Standby == ck {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("no standby for %s within 30 s", ck)
}

// PrintRollback writes the result with the targets checked.
func PrintRollback(w io.Writer, r RollbackResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\ttier\tp50\tp95\tp99\tn\t")
	for _, row := range r.Rows {
		for _, t := range []struct {
			name string
			s    Stats
		}{{"hot (standby)", row.Hot}, {"warm (CRIU restore)", row.Warm}, {"cold baseline (cp -a + criu restore)", row.Cold}} {
			fmt.Fprintf(tw, "%s\t%s\t%.1f ms\t%.1f ms\t%.1f ms\t%d\t\n", row.Workload, t.name, t.s.P50, t.s.P95, t.s.P99, t.s.N)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		check := func(ok bool) string {
			if ok {
				return "met"
			}
			return "MISSED"
		}
		fmt.Fprintf(w, "%s: hot p50 %.1f ms (target <= 5: %s), p99 %.1f ms (target <= 20: %s); checkpoint stall p50 %.1f ms (target <= 15: %s)\n",
			row.Workload, row.Hot.P50, check(row.Hot.P50 <= 5), row.Hot.P99, check(row.Hot.P99 <= 20), row.Stall.P50, check(row.Stall.P50 <= 15))
	}
	for _, row := range r.Rows {
		var caps []string
		for _, k := range slices.Sorted(maps.Keys(row.Captures)) {
			caps = append(caps, fmt.Sprintf("%s %d", k, row.Captures[k]))
		}
		p := row.StallParts
		fmt.Fprintf(w, "%s: stall parts p50: copying the tree %.1f ms, write protection %.1f ms, CRIU %.1f ms, root snapshot %.1f ms beside them; captures: %s\n",
			row.Workload, p.CopyMS, p.ProtectMS, p.CRIUMS, p.SnapshotMS, strings.Join(caps, ", "))
	}
}

// coldSource is what the cold baselines copy from: a plain CRIU dump of
// a sandbox's tree (full images) and a full copy of its root.
type coldSource struct {
	criuPath, dir string
}

func newColdSource(ctx context.Context, c *client.Client, criuPath, poolDir, sb string) (*coldSource, error) {
	s, err := c.Sandbox(ctx, sb)
	if err != nil {
		return nil, err
	}
	src := &coldSource{criuPath: criuPath, dir: filepath.Join(poolDir, "tmp", "bench-cold-"+sb)}
	if err := plainDump(criuPath, s.Pid, filepath.Join(src.dir, "images")); err != nil {
		src.remove()
		return nil, err
	}
	root := filepath.Join(poolDir, "sandboxes", sb, "root")
	if out, err := exec.Command("cp", "-a", "--reflink=never", root, filepath.Join(src.dir, "saved")).CombinedOutput(); err != nil {
		src.remove()
		return nil, fmt.Errorf("cp: %v: %s", err, out)
	}
	return src, nil
}

// copy makes one copy the baseline's way, a full copy of the saved root
// and a plain criu restore onto it, and returns how long that took; the
// copy is then killed and removed (untimed): copies cannot run side by
// side (same PIDs).
func (s *coldSource) copy() (time.Duration, error) {
	root := filepath.Join(s.dir, "root")
	t0 := time.Now()
	if out, err := exec.Command("cp", "-a", "--reflink=never", filepath.Join(s.dir, "saved"), root).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("cp: %v: %s", err, out)
	}
	pid, err := plainRestore(s.criuPath, filepath.Join(s.dir, "images"), s.dir, root)
	if err != nil {
		return 0, err
	}
	took := time.Since(t0)
	killTree(pid)
	_ = os.RemoveAll(root)
	return took, nil
}

func (s *coldSource) remove() { _ = os.RemoveAll(s.dir) }
