package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/daemon"
)

// ForkConfig configures the fan-out benchmark.
type ForkConfig struct {
	Image    string
	CriuPath string
	N        int // forks per round
	Rounds   int // molt rounds; the baseline runs one
	HeapMiB  int
	Progress io.Writer
}

// ForkRow is one workload's result: forks per second per round.
type ForkRow struct {
	Workload string    `json:"workload"`
	N        int       `json:"n"`
	Molt     []float64 `json:"molt_forks_per_second"`
	// Baseline: per fork a full copy of the checkpoint's root and a plain
	// CRIU restore of full images, one after the other.
	Baseline float64 `json:"baseline_forks_per_second"`
}

// ForkResult is the outcome of RunFork.
type ForkResult struct {
	Rows []ForkRow `json:"rows"`
}

// RunFork measures `fork CK -n N` (the checkpoint's standby, if ready,
// becomes the first fork; the others are restored in parallel) against
// making N copies with cp -a and criu restore.
func RunFork(ctx context.Context, e *daemon.Ephemeral, cfg ForkConfig) (ForkResult, error) {
	c := e.Client
	progress := progressf(cfg.Progress)
	h, err := c.Host(ctx)
	if err != nil {
		return ForkResult{}, err
	}
	var res ForkResult
	for _, w := range processWorkloads(ctx, c, cfg.HeapMiB) {
		progress("fork: %s", w.name)
		sb, err := w.start(ctx, cfg.Image)
		if err != nil {
			return res, err
		}
		ck, err := c.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			return res, err
		}
		row := ForkRow{Workload: w.name, N: cfg.N}
		for i := 0; i < cfg.Rounds; i++ {
			if err := waitStandby(ctx, e, sb.ID, ck.ID); err != nil {
				return res, err
			}
			r, err := c.ForkCheckpoint(ctx, ck.ID, cfg.N)
			if err != nil {
				return res, err
			}
			row.Molt = append(row.Molt, r.ForksPerSecond)
			for _, f := range r.Sandboxes {
				if err := c.Remove(ctx, f.ID); err != nil {
					return res, err
				}
			}
		}

		progress("fork: %s: baseline (cp -a of the root + criu restore, %d times)", w.name, cfg.N)
		src, err := newColdSource(ctx, c, cfg.CriuPath, h.Pool.Dir, sb.ID)
		if err != nil {
			return res, err
		}
		var took time.Duration
		for i := 0; i < cfg.N; i++ {
			d, err := src.copy()
			if err != nil {
				src.remove()
				return res, err
			}
			took += d
		}
		row.Baseline = float64(cfg.N) / took.Seconds()
		src.remove()
		res.Rows = append(res.Rows, row)
		if err := c.Remove(ctx, sb.ID); err != nil {
			return res, err
		}
	}
	return res, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// PrintFork writes the result as a table.
func PrintFork(w io.Writer, r ForkResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tforks\tmolt forks/s (median)\tmolt rounds\tbaseline forks/s\tmolt / baseline\t")
	for _, row := range r.Rows {
		rounds := ""
		for i, v := range row.Molt {
			if i > 0 {
				rounds += " "
			}
			rounds += fmt.Sprintf("%.1f", v)
		}
		m := median(row.Molt)
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\t%.1f\t%.1fx\t\n", row.Workload, row.N, m, rounds, row.Baseline, m/max(row.Baseline, 1e-9))
	}
	tw.Flush()
}
