package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	Iterations int // per tier; the cold baselines run a third as many
	// Restarts is how many daemon restarts, each followed by one
	// rollback, measure a rollback right after a restart.
	Restarts int
	// FaultRounds is how many heap rewrites, with and without a full
	// checkpoint just before, measure the write-fault cost.
	FaultRounds int
	HeapMiB     int
	Seed        int64
	Progress    io.Writer
	// NoCold skips the cold baselines: a plain criu restore cannot
	// restore a sandbox with a user namespace (its root must be mounted
	// idmapped, its images readable to the namespace), so a --userns run
	// compares with an earlier run's baselines.
	NoCold bool
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
	// Hot waits for the standby before every rollback; BackToBack does
	// not (each takes the tier molt picks); Random8 goes to a random one
	// of the last 8 checkpoints, back to back; AfterRestart is the first
	// rollback after a daemon restart.
	Hot          Stats          `json:"hot"`
	BackToBack   Stats          `json:"back_to_back"`
	BackTiers    map[string]int `json:"back_to_back_tiers"`
	Random8      Stats          `json:"random_of_8"`
	Random8Tiers map[string]int `json:"random_of_8_tiers"`
	Warm         Stats          `json:"warm"`
	AfterRestart Stats          `json:"after_restart"`
	RestartTiers map[string]int `json:"after_restart_tiers"`
	// Cold are the baselines (crBaselines): a copy of the root plus a
	// plain CRIU restore of full images; the first is the main one.
	Cold []ColdRow `json:"cold"`

	lastCk string
	// Rewrite is the time the workload takes to write one byte in every
	// page of its heap with no checkpoint since its last rewrite, and
	// RewriteAfter right after a full checkpoint (the write faults of a
	// capture that write-protects memory); nil for workloads without a
	// heap.
	Rewrite      *Stats         `json:"heap_rewrite,omitempty"`
	RewriteAfter *Stats         `json:"heap_rewrite_after_checkpoint,omitempty"`
	RewriteCaps  map[string]int `json:"heap_rewrite_captures,omitempty"`
}

// ColdRow is one cold baseline's rollbacks.
type ColdRow struct {
	Method string `json:"method"`
	Stats  Stats  `json:"stats"`
}

// RollbackResult is the outcome of RunRollback.
type RollbackResult struct {
	Host HostFacts     `json:"host"`
	Rows []RollbackRow `json:"rows"`
}

// stallSamples is how many full checkpoints per workload give the stall.
const stallSamples = 15

// randomOf is how many of the newest checkpoints Random8 picks from.
const randomOf = 8

// RunRollback measures rollback latency to full checkpoints: hot
// (promoting a standby), hot back to back, to a random one of the last
// 8, warm (a CRIU restore from molt's images), right after a daemon
// restart, and cold baselines (a copy of the root plus a plain CRIU
// restore of full images), for the process workloads; and, for the heap
// workload, what a checkpoint costs it in write faults.
func RunRollback(ctx context.Context, e *daemon.Ephemeral, cfg RollbackConfig) (RollbackResult, error) {
	progress := progressf(cfg.Progress)
	h, err := e.Client.Host(ctx)
	if err != nil {
		return RollbackResult{}, err
	}
	res := RollbackResult{Host: GatherHost(ctx, e.Client, cfg.CriuPath)}
	rng := rand.New(rand.NewSource(cfg.Seed))
	for wi, w := range processWorkloads(ctx, e.Client, cfg.HeapMiB) {
		progress("rollback: %s", w.name)
		sb, err := w.start(ctx, cfg.Image)
		if err != nil {
			return res, err
		}
		row := RollbackRow{Workload: w.name}
		ck, cks, err := measureStall(ctx, e.Client, sb.ID, &row)
		if err != nil {
			return res, err
		}
		if wi == 1 && cfg.FaultRounds > 0 {
			progress("rollback: %s: heap rewrite with and without a checkpoint before", w.name)
			if err := measureRewrite(ctx, e.Client, sb.ID, cfg.FaultRounds, &row); err != nil {
				return res, err
			}
			// The head moved: the tiers below roll back to it.
			cks = append(cks, row.lastCk)
			ck = row.lastCk
		}
		if err := measureTiers(ctx, e, sb.ID, ck, cks, cfg.Iterations, rng, &row); err != nil {
			return res, err
		}
		if cfg.Restarts > 0 {
			progress("rollback: %s: %d daemon restarts, each followed by a rollback", w.name, cfg.Restarts)
			if err := measureRestarts(ctx, e, sb.ID, ck, cfg.Restarts, &row); err != nil {
				return res, err
			}
		}
		if !cfg.NoCold {
			if err := measureCold(ctx, e.Client, cfg, h.Pool.Dir, sb.ID, w.name, progress, &row); err != nil {
				return res, err
			}
		}
		res.Rows = append(res.Rows, row)
		if err := e.Client.Remove(ctx, sb.ID); err != nil {
			return res, err
		}
	}
	return res, nil
}

// measureStall takes stallSamples full checkpoints of the sandbox and
// records their stall, its parts and their capture modes in row. It
// returns the last checkpoint and all of them, in order.
func measureStall(ctx context.Context, c *client.Client, sb string, row *RollbackRow) (last string, cks []string, err error) {
	var stall, protect, criu, snap, copying Sample
	row.Captures = map[string]int{}
	for i := 0; i < stallSamples; i++ {
		ck, err := c.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			return "", nil, err
		}
		last = ck.ID
		cks = append(cks, ck.ID)
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
	return last, cks, nil
}

// measureTiers times iterations rollbacks to ck in each way the row
// reports: hot (a standby ready before each), back to back, to a random
// one of the last randomOf checkpoints, and warm (CRIU restore forced).
func measureTiers(ctx context.Context, e *daemon.Ephemeral, sb, ck string, cks []string, iterations int, rng *rand.Rand, row *RollbackRow) error {
	c := e.Client
	var hot, warm, b2b, rnd Sample
	for i := 0; i < iterations; i++ {
		if err := waitStandby(ctx, e, sb, ck); err != nil {
			return err
		}
		t0 := time.Now()
		r, err := c.Rollback(ctx, sb, ck)
		if err != nil {
			return err
		}
		if r.Tier != v1.TierHot {
			return fmt.Errorf("rollback with a standby ready took tier %s", r.Tier)
		}
		hot = append(hot, time.Since(t0))
	}
	row.BackTiers, row.Random8Tiers, row.RestartTiers = map[string]int{}, map[string]int{}, map[string]int{}
	if err := waitStandby(ctx, e, sb, ck); err != nil {
		return err
	}
	for i := 0; i < iterations; i++ {
		t0 := time.Now()
		r, err := c.Rollback(ctx, sb, ck)
		if err != nil {
			return err
		}
		b2b = append(b2b, time.Since(t0))
		row.BackTiers[r.Tier]++
	}
	last := cks[max(0, len(cks)-randomOf):]
	for i := 0; i < iterations; i++ {
		to := last[rng.Intn(len(last))]
		t0 := time.Now()
		r, err := c.Rollback(ctx, sb, to)
		if err != nil {
			return err
		}
		rnd = append(rnd, time.Since(t0))
		row.Random8Tiers[r.Tier]++
	}
	for i := 0; i < iterations; i++ {
		t0 := time.Now()
		if _, err := c.RollbackWith(ctx, sb, v1.RollbackRequest{Checkpoint: ck, Tier: v1.TierWarm}); err != nil {
			return err
		}
		warm = append(warm, time.Since(t0))
	}
	row.Hot, row.Warm, row.BackToBack, row.Random8 = hot.Stats(), warm.Stats(), b2b.Stats(), rnd.Stats()
	return nil
}

// measureRestarts restarts the daemon restarts times and times the
// rollback to ck right after each. e.Client is the restarted daemon's
// afterwards.
func measureRestarts(ctx context.Context, e *daemon.Ephemeral, sb, ck string, restarts int, row *RollbackRow) error {
	var after Sample
	for i := 0; i < restarts; i++ {
		// The standby, if any, is ready: a restart is what drops
		// it. (A daemon that does not refill one after its
		// first rollback still gets measured.)
		if err := waitStandby(ctx, e, sb, ck); err != nil && ctx.Err() != nil {
			return err
		}
		if err := e.Restart(ctx); err != nil {
			return fmt.Errorf("daemon restart: %w", err)
		}
		t0 := time.Now()
		r, err := e.Client.Rollback(ctx, sb, ck)
		if err != nil {
			return fmt.Errorf("rollback after a restart: %w", err)
		}
		after = append(after, time.Since(t0))
		row.RestartTiers[r.Tier]++
	}
	row.AfterRestart = after.Stats()
	return nil
}

// measureCold times each cold baseline (a root copy and a criu restore
// of the sandbox's process tree) and adds a ColdRow per baseline to row.
func measureCold(ctx context.Context, c *client.Client, cfg RollbackConfig, poolDir, sb, workload string, progress func(string, ...any), row *RollbackRow) error {
	for _, bm := range crBaselines(cfg.CriuPath) {
		progress("rollback: %s: cold baseline %s", workload, bm.name)
		src, err := newColdSource(ctx, c, bm, poolDir, sb)
		if err != nil {
			return err
		}
		var cold Sample
		for i := 0; i < max(2, cfg.Iterations/3); i++ {
			took, err := src.copy()
			if err != nil {
				src.remove()
				return err
			}
			cold = append(cold, took)
		}
		row.Cold = append(row.Cold, ColdRow{Method: bm.name, Stats: cold.Stats()})
		src.remove()
	}
	return nil
}

// measureRewrite times heap rewrites of the heap workload: rounds times
// a rewrite with no checkpoint since the last one, then a full
// checkpoint and a rewrite right after it. row.lastCk is the last
// checkpoint taken.
func measureRewrite(ctx context.Context, c *client.Client, sb string, rounds int, row *RollbackRow) error {
	rewrite := func() (time.Duration, error) {
		r, err := c.SessionRun(ctx, sb, "main", v1.SessionRunRequest{Command: rewriteCmd})
		if err != nil {
			return 0, err
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(r.Stdout), 64)
		if r.ExitCode != 0 || err != nil {
			return 0, fmt.Errorf("heap rewrite: exit %d, %q: %s", r.ExitCode, r.Stdout, r.Stderr)
		}
		return msDur(v), nil
	}
	// The first rewrite pays whatever the stall samples' captures left.
	if _, err := rewrite(); err != nil {
		return err
	}
	var plain, after Sample
	row.RewriteCaps = map[string]int{}
	for i := 0; i < rounds; i++ {
		d, err := rewrite()
		if err != nil {
			return err
		}
		plain = append(plain, d)
		ck, err := c.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			return err
		}
		row.lastCk = ck.ID
		row.RewriteCaps[ck.Capture]++
		if d, err = rewrite(); err != nil {
			return err
		}
		after = append(after, d)
	}
	p, a := plain.Stats(), after.Stats()
	row.Rewrite, row.RewriteAfter = &p, &a
	return nil
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

// PrintRollback writes the result with the targets checked and each
// tier as a ratio to the main cold baseline of the same run.
func PrintRollback(w io.Writer, r RollbackResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\ttier\tp50\tp95\ttail\tn\tbaseline / tier\ttiers taken\t")
	for _, row := range r.Rows {
		var base float64
		if len(row.Cold) > 0 {
			base = row.Cold[0].Stats.P50
		}
		for _, t := range []struct {
			name  string
			s     Stats
			tiers map[string]int
		}{
			{"hot (standby ready)", row.Hot, nil},
			{"back to back (no wait for the standby)", row.BackToBack, row.BackTiers},
			{fmt.Sprintf("random of the last %d, back to back", randomOf), row.Random8, row.Random8Tiers},
			{"warm (CRIU restore)", row.Warm, nil},
			{"first after a daemon restart", row.AfterRestart, row.RestartTiers},
		} {
			if t.s.N == 0 {
				continue
			}
			ratio := "-"
			if base > 0 {
				ratio = RatioString(base, t.s.P50)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f ms\t%.1f ms\t%s\t%d\t%s\t%s\t\n", row.Workload, t.name, t.s.P50, t.s.P95, t.s.TailString(), t.s.N,
				ratio, tierCounts(t.tiers))
		}
		for _, c := range row.Cold {
			fmt.Fprintf(tw, "%s\tcold baseline: %s + criu restore\t%.1f ms\t%.1f ms\t%s\t%d\t%s\t\t\n", row.Workload, c.Method, c.Stats.P50, c.Stats.P95, c.Stats.TailString(), c.Stats.N,
				RatioString(base, c.Stats.P50))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		tl, tv := row.Hot.Tail()
		fmt.Fprintf(w, "%s: hot p50 %.1f ms (target <= 5: %s), %s %.1f ms (target p99 <= 20: %s); checkpoint stall p50 %.1f ms (target <= 15: %s)\n",
			row.Workload, row.Hot.P50, verdict(row.Hot.P50 <= 5), tl, tv, verdict(tv <= 20), row.Stall.P50, verdict(row.Stall.P50 <= 15))
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
	for _, row := range r.Rows {
		if row.Rewrite == nil || row.RewriteAfter == nil {
			continue
		}
		fmt.Fprintf(w, "%s: writing every heap page takes %.1f ms p50 right after a full checkpoint (%s) vs %.1f ms without one: %s, %.1f ms of write faults\n",
			row.Workload, row.RewriteAfter.P50, tierCounts(row.RewriteCaps), row.Rewrite.P50, RatioString(row.RewriteAfter.P50, row.Rewrite.P50),
			row.RewriteAfter.P50-row.Rewrite.P50)
	}
}

// tierCounts formats counts by name ("hot 3, warm 1"), sorted.
func tierCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// coldSource is what the cold baselines copy from: a plain CRIU dump of
// a sandbox's tree (full images) and a copy of its root.
type coldSource struct {
	m   coldMethod
	dir string
}

func newColdSource(ctx context.Context, c *client.Client, m coldMethod, poolDir, sb string) (*coldSource, error) {
	s, err := c.Sandbox(ctx, sb)
	if err != nil {
		return nil, err
	}
	src := &coldSource{m: m, dir: filepath.Join(poolDir, "tmp", "bench-cold-"+sb)}
	if err := m.criu.dump(s.Pid, filepath.Join(src.dir, "images")); err != nil {
		src.remove()
		return nil, err
	}
	root := filepath.Join(poolDir, "sandboxes", sb, "root")
	if err := m.copyRoot(root, filepath.Join(src.dir, "saved")); err != nil {
		src.remove()
		return nil, err
	}
	return src, nil
}

// copy makes one copy the baseline's way, a copy of the saved root and a
// plain criu restore onto it, and returns how long that took; the copy
// is then killed and removed (untimed): copies cannot run side by side
// (same PIDs).
func (s *coldSource) copy() (time.Duration, error) {
	root := filepath.Join(s.dir, "root")
	t0 := time.Now()
	if err := s.m.copyRoot(filepath.Join(s.dir, "saved"), root); err != nil {
		return 0, err
	}
	pid, err := s.m.criu.restore(filepath.Join(s.dir, "images"), s.dir, root)
	if err != nil {
		return 0, err
	}
	took := time.Since(t0)
	killTree(pid)
	_ = os.RemoveAll(root)
	return took, nil
}

func (s *coldSource) remove() { _ = os.RemoveAll(s.dir) }
