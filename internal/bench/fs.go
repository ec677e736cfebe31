package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/daemon"
)

// FSConfig configures the filesystem checkpoint benchmark.
type FSConfig struct {
	Image    string
	CriuPath string // for the host facts
	// Sizes are the total data sizes, each spread over Files files.
	Sizes []int64
	Files int
	// Iterations of molt's checkpoint and rollback per size; baselines
	// run BaselineIterations times (they are slow for large sizes).
	Iterations, BaselineIterations int
	Progress                       io.Writer
}

// FSRow is one line of the result.
type FSRow struct {
	DataBytes  int64  `json:"data_bytes"`
	Files      int    `json:"files"`
	Method     string `json:"method"`
	Checkpoint Stats  `json:"checkpoint"`
	Rollback   Stats  `json:"rollback"`
	// Stall is the frozen time of molt's checkpoints.
	Stall *Stats `json:"stall,omitempty"`
	// RollbackFilesOnly is molt's rollback of a stopped sandbox: the
	// file switch without starting processes.
	RollbackFilesOnly *Stats `json:"rollback_files_only,omitempty"`
}

// FSResult is the outcome of RunFS.
type FSResult struct {
	Rows   []FSRow   `json:"rows"`
	Kernel string    `json:"kernel"`
	Host   HostFacts `json:"host"`
	Pool   string    `json:"pool"`
}

// RunFS measures molt's fs checkpoint and rollback next to a reflinked
// copy (the fastest copy btrfs offers), a full copy (cp -a
// --reflink=never) and a tar archive of the same root, for each
// data size, changing one file between iterations.
func RunFS(ctx context.Context, e *daemon.Ephemeral, cfg FSConfig) (FSResult, error) {
	c := e.Client
	progress := progressf(cfg.Progress)
	h, err := c.Host(ctx)
	if err != nil {
		return FSResult{}, err
	}
	res := FSResult{Kernel: h.Kernel, Pool: h.Pool.Dir, Host: GatherHost(ctx, c, cfg.CriuPath)}
	for _, size := range cfg.Sizes {
		progress("fs: %s in %d files: filling a sandbox", human(size), cfg.Files)
		sb, err := c.Create(ctx, v1.SandboxCreateRequest{Image: cfg.Image})
		if err != nil {
			return res, err
		}
		if err := fillFS(ctx, c, sb.ID, cfg.Files, size); err != nil {
			return res, err
		}
		root := filepath.Join(h.Pool.Dir, "sandboxes", sb.ID, "root")
		if err := measureFS(ctx, c, sb.ID, cfg, size, progress, &res); err != nil {
			return res, err
		}
		// Baselines on the same root (the sandbox is stopped, so the tree
		// is quiescent), written to the same filesystem.
		work := filepath.Join(h.Pool.Dir, "tmp", "bench-"+sb.ID)
		if err := os.MkdirAll(work, 0o700); err != nil {
			return res, err
		}
		if err := measureFSBaselines(root, work, cfg, size, progress, &res); err != nil {
			return res, err
		}
		_ = os.RemoveAll(work)
		if err := c.Remove(ctx, sb.ID); err != nil {
			return res, err
		}
	}
	return res, nil
}

// fillFS writes size bytes of random data in files files under /data of
// the sandbox.
func fillFS(ctx context.Context, c *client.Client, sb string, files int, size int64) error {
	fill := fmt.Sprintf(`import os
n, size = %d, %d
per = size // n
buf = os.urandom(1 << 20)
os.makedirs('/data', exist_ok=True)
for i in range(n):
    d = '/data/%%03d' %% (i %% 100)
    os.makedirs(d, exist_ok=True)
    with open('%%s/f%%05d' %% (d, i), 'wb') as f:
        left = per
        while left > 0:
            k = min(left, len(buf))
            f.write(buf[(i * 4096) %% (len(buf) - k + 1):][:k])
            left -= k
`, files, size)
	if err := run(ctx, c, sb, "python3", "-c", fill); err != nil {
		return fmt.Errorf("fill: %w", err)
	}
	return nil
}

// measureFS times molt's fs checkpoints (one file changed before each),
// then rollbacks of the running sandbox and of the stopped one (files
// only), and adds the row to res. It leaves the sandbox stopped.
func measureFS(ctx context.Context, c *client.Client, sb string, cfg FSConfig, size int64, progress func(string, ...any), res *FSResult) error {
	var ckS, stallS, rbS, rbStopped Sample
	var first string
	for i := 0; i < cfg.Iterations; i++ {
		if err := run(ctx, c, sb, "bash", "-c", fmt.Sprintf("echo %d >> /data/000/f00000", i)); err != nil {
			return err
		}
		t0 := time.Now()
		ck, err := c.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFS})
		if err != nil {
			return err
		}
		ckS = append(ckS, time.Since(t0))
		stallS = append(stallS, time.Duration(ck.StallMS*float64(time.Millisecond)))
		if first == "" {
			first = ck.ID
		}
	}
	progress("fs: %s: %d checkpoints taken; rolling back", human(size), cfg.Iterations)
	cks, err := c.Checkpoints(ctx, sb)
	if err != nil {
		return err
	}
	for i := 0; i < cfg.Iterations; i++ {
		t0 := time.Now()
		if _, err := c.Rollback(ctx, sb, cks[i%len(cks)].ID); err != nil {
			return err
		}
		rbS = append(rbS, time.Since(t0))
	}
	if _, err := c.Stop(ctx, sb); err != nil {
		return err
	}
	for i := 0; i < cfg.Iterations; i++ {
		t0 := time.Now()
		if _, err := c.Rollback(ctx, sb, cks[i%len(cks)].ID); err != nil {
			return err
		}
		rbStopped = append(rbStopped, time.Since(t0))
	}
	st, rs, rfs := stallS.Stats(), rbS.Stats(), rbStopped.Stats()
	res.Rows = append(res.Rows, FSRow{DataBytes: size, Files: cfg.Files, Method: "molt fs checkpoint (btrfs snapshot)",
		Checkpoint: ckS.Stats(), Rollback: rs, Stall: &st, RollbackFilesOnly: &rfs})
	return nil
}

// measureFSBaselines times saving root and restoring it with each
// baseline (reflinked copy, full copy, tar) in work, and adds a row per
// baseline to res.
func measureFSBaselines(root, work string, cfg FSConfig, size int64, progress func(string, ...any), res *FSResult) error {
	for _, b := range []struct {
		name          string
		save, restore func(dst string) *exec.Cmd
	}{
		{"reflinked copy (cp -a --reflink=always)",
			func(dst string) *exec.Cmd { return exec.Command("cp", "-a", "--reflink=always", root, dst) },
			func(dst string) *exec.Cmd { return exec.Command("cp", "-a", "--reflink=always", dst, dst+".restored") }},
		{"full copy (cp -a --reflink=never)",
			func(dst string) *exec.Cmd { return exec.Command("cp", "-a", "--reflink=never", root, dst) },
			func(dst string) *exec.Cmd { return exec.Command("cp", "-a", "--reflink=never", dst, dst+".restored") }},
		{"tar archive (tar -cf)",
			func(dst string) *exec.Cmd { return exec.Command("tar", "-cf", dst, "-C", root, ".") },
			func(dst string) *exec.Cmd {
				return exec.Command("bash", "-c", fmt.Sprintf("mkdir %s.restored && tar -xf %s -C %s.restored", dst, dst, dst))
			}},
	} {
		progress("fs: %s: baseline %s", human(size), b.name)
		var saveS, restS Sample
		for i := 0; i < cfg.BaselineIterations; i++ {
			dst := filepath.Join(work, fmt.Sprintf("copy-%d", i))
			t0 := time.Now()
			if out, err := b.save(dst).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %s", b.name, err, out)
			}
			saveS = append(saveS, time.Since(t0))
			t0 = time.Now()
			if out, err := b.restore(dst).CombinedOutput(); err != nil {
				return fmt.Errorf("%s restore: %v: %s", b.name, err, out)
			}
			restS = append(restS, time.Since(t0))
			_ = os.RemoveAll(dst)
			_ = os.RemoveAll(dst + ".restored")
		}
		res.Rows = append(res.Rows, FSRow{DataBytes: size, Files: cfg.Files, Method: b.name, Checkpoint: saveS.Stats(), Rollback: restS.Stats()})
	}
	return nil
}

func run(ctx context.Context, c *client.Client, sb string, args ...string) error {
	var stderr strings.Builder
	st, err := c.Exec(ctx, sb, v1.ExecRequest{Args: args}, client.ExecIO{Stderr: &stderr})
	if err != nil {
		return err
	}
	if st.ExitCode != 0 {
		return fmt.Errorf("%v: exit %d: %s", args, st.ExitCode, stderr.String())
	}
	return nil
}

func human(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
}

// PrintFS writes the result as a table with the targets checked.
func PrintFS(w io.Writer, r FSResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "data\tmethod\tcheckpoint p50\tp95\trollback p50\tp95\tn\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%.2f ms\t%.2f ms\t%.2f ms\t%.2f ms\t%d\t\n", human(row.DataBytes), row.Method,
			row.Checkpoint.P50, row.Checkpoint.P95, row.Rollback.P50, row.Rollback.P95, row.Checkpoint.N)
	}
	tw.Flush()
	fmt.Fprintln(w)
	var molt []FSRow
	for _, row := range r.Rows {
		if row.Stall != nil {
			molt = append(molt, row)
			fmt.Fprintf(w, "molt %s: stall (frozen) p50 %.2f ms p95 %.2f ms; rollback of a stopped sandbox (files only) p50 %.2f ms p95 %.2f ms; rollback of a running sandbox includes restarting its init\n",
				human(row.DataBytes), row.Stall.P50, row.Stall.P95, row.RollbackFilesOnly.P50, row.RollbackFilesOnly.P95)
		}
	}
	// Each baseline as a multiple of molt's time at the same size.
	for _, m := range molt {
		for _, row := range r.Rows {
			if row.Stall == nil && row.DataBytes == m.DataBytes {
				fmt.Fprintf(w, "%s: %s takes %s molt's checkpoint time and %s its rollback time (p50s)\n", human(row.DataBytes), row.Method,
					RatioString(row.Checkpoint.P50, m.Checkpoint.P50), RatioString(row.Rollback.P50, m.Rollback.P50))
			}
		}
	}
	for _, row := range molt {
		ok := "met"
		if row.Checkpoint.P50 > 5 {
			ok = "MISSED"
		}
		fmt.Fprintf(w, "target checkpoint p50 <= 5 ms at %s: %.2f ms (%s)\n", human(row.DataBytes), row.Checkpoint.P50, ok)
	}
	if len(molt) >= 2 {
		a, b := molt[0], molt[len(molt)-1]
		ratio := b.Checkpoint.P50 / a.Checkpoint.P50
		ok := "met"
		if ratio > 2 {
			ok = "MISSED"
		}
		fmt.Fprintf(w, "target checkpoint p50 %s vs %s within 2x: %.2fx (%s)\n", human(b.DataBytes), human(a.DataBytes), ratio, ok)
	}
}
