package bench

import (
	"context"
	"fmt"
	"io"
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
	// Baseline: per fork a copy of the checkpoint's root and a plain
	// CRIU restore of full images (crBaselines' main one), one after the
	// other.
	Baseline       float64 `json:"baseline_forks_per_second"`
	BaselineMethod string  `json:"baseline_method"`
}

// ForkResult is the outcome of RunFork.
type ForkResult struct {
	Host HostFacts `json:"host"`
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
	res := ForkResult{Host: GatherHost(ctx, c, cfg.CriuPath)}
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

		bm := crBaselines(cfg.CriuPath)[0]
		row.BaselineMethod = bm.name
		progress("fork: %s: baseline (%s + criu restore, %d times)", w.name, bm.name, cfg.N)
		src, err := newColdSource(ctx, c, bm, h.Pool.Dir, sb.ID)
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
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\t%.1f\t%s\t\n", row.Workload, row.N, m, rounds, row.Baseline, RatioString(m, row.Baseline))
	}
	tw.Flush()
	if len(r.Rows) > 0 {
		fmt.Fprintf(w, "\nbaseline: %s + criu restore per fork\n", r.Rows[0].BaselineMethod)
	}
}
