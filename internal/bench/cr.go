package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/daemon"
	"golang.org/x/sys/unix"
)

// CRConfig configures the process checkpoint benchmark.
type CRConfig struct {
	Image      string
	CriuPath   string // for the plain-CRIU baseline
	Iterations int
	HeapMiB    int
	Progress   io.Writer
}

// CRRow is one workload's result.
type CRRow struct {
	Workload string `json:"workload"`
	// molt full checkpoints and rollbacks
	Stall      Stats `json:"stall"`
	Checkpoint Stats `json:"checkpoint"`
	Rollback   Stats `json:"rollback"`
	// FirstBytes is what the first full checkpoint wrote; SecondBytes
	// what the next one wrote after a small change; ImageBytes the size
	// of the images CRIU produced (a plain full dump).
	FirstBytes  int64 `json:"first_bytes"`
	SecondBytes int64 `json:"second_bytes"`
	ImageBytes  int64 `json:"image_bytes"`
	// Baseline: plain criu dump (full images, leave running) plus a full
	// copy of the root; restore = criu restore from them.
	BaseStall   Stats `json:"baseline_stall"`
	BaseDump    Stats `json:"baseline_checkpoint"`
	BaseRestore Stats `json:"baseline_rollback"`
	BaseBytes   int64 `json:"baseline_bytes"`
}

// CRResult is the outcome of RunCR.
type CRResult struct {
	Rows []CRRow `json:"rows"`
}

// heapScript holds HeapMiB of random data and, whenever /tmp/poke
// appears, rewrites 64 KiB of it (a small change).
const heapScript = `
import os, sys, time
heap = bytearray(os.urandom(%d << 20))
open('/tmp/heap-ready', 'w').close()
i = 0
while True:
    if os.path.exists('/tmp/poke'):
        os.remove('/tmp/poke')
        off = (i * 65536) %% len(heap)
        heap[off:off + 65536] = os.urandom(65536)
        i += 1
    time.sleep(0.02)
`

// workload is a sandbox with a bash session and, optionally, more.
type workload struct {
	name  string
	start func(ctx context.Context, image string) (v1.Sandbox, error)
}

// processWorkloads are the two process-checkpoint workloads: an idle bash
// session, and a Python process holding heapMiB of random data next to
// it (pokeable: see heapScript).
func processWorkloads(ctx context.Context, c *client.Client, heapMiB int) []workload {
	session := func(ctx context.Context, image string) (v1.Sandbox, error) {
		sb, err := c.Create(ctx, v1.SandboxCreateRequest{Image: image})
		if err != nil {
			return sb, err
		}
		_, err = c.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: "export X=42; cd /tmp"})
		return sb, err
	}
	return []workload{
		{"idle bash session", session},
		{fmt.Sprintf("python, %d MiB heap", heapMiB), func(ctx context.Context, image string) (v1.Sandbox, error) {
			sb, err := session(ctx, image)
			if err != nil {
				return sb, err
			}
			if _, err := c.ExecDetached(ctx, sb.ID, v1.ExecRequest{Args: []string{"python3", "-c", fmt.Sprintf(heapScript, heapMiB)}}); err != nil {
				return sb, err
			}
			deadline := time.Now().Add(60 * time.Second)
			for time.Now().Before(deadline) {
				// In the session already there: a session of its own
				// would leave a second shell in every tree measured.
				r, err := c.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: "test -e /tmp/heap-ready"})
				if err != nil {
					return sb, err
				}
				if r.ExitCode == 0 {
					return sb, nil
				}
				time.Sleep(100 * time.Millisecond)
			}
			return sb, fmt.Errorf("heap not filled within a minute")
		}},
	}
}

// RunCR measures molt's full checkpoint and rollback for an idle bash
// session and a Python process holding a heap, next to a plain CRIU dump
// and restore of the same tree with full images and a full root copy.
func RunCR(ctx context.Context, e *daemon.Ephemeral, cfg CRConfig) (CRResult, error) {
	c := e.Client
	progress := progressf(cfg.Progress)
	h, err := c.Host(ctx)
	if err != nil {
		return CRResult{}, err
	}
	var res CRResult
	for _, w := range processWorkloads(ctx, c, cfg.HeapMiB) {
		progress("cr: %s", w.name)
		sb, err := w.start(ctx, cfg.Image)
		if err != nil {
			return res, err
		}
		row := CRRow{Workload: w.name}
		var stall, ckS, rbS Sample
		var first string
		for i := 0; i < cfg.Iterations; i++ {
			if i > 0 {
				// A small change: a session command and, for the heap
				// workload, 64 KiB of rewritten heap.
				if _, err := c.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: fmt.Sprintf("export N=%d; touch /tmp/poke", i)}); err != nil {
					return res, err
				}
				time.Sleep(100 * time.Millisecond)
			}
			t0 := time.Now()
			ck, err := c.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
			if err != nil {
				return res, err
			}
			ckS = append(ckS, time.Since(t0))
			stall = append(stall, msDur(ck.StallMS))
			switch i {
			case 0:
				row.FirstBytes, row.ImageBytes, first = ck.BytesWritten, ck.ImageBytes, ck.ID
			case 1:
				row.SecondBytes = ck.BytesWritten
			}
		}
		for i := 0; i < cfg.Iterations; i++ {
			t0 := time.Now()
			if _, err := c.Rollback(ctx, sb.ID, first); err != nil {
				return res, err
			}
			rbS = append(rbS, time.Since(t0))
		}
		row.Stall, row.Checkpoint, row.Rollback = stall.Stats(), ckS.Stats(), rbS.Stats()

		progress("cr: %s: baseline plain criu dump/restore + cp -a", w.name)
		s, err := c.Sandbox(ctx, sb.ID)
		if err != nil {
			return res, err
		}
		root := filepath.Join(h.Pool.Dir, "sandboxes", sb.ID, "root")
		var bStall, bDump, bRest Sample
		for i := 0; i < max(1, cfg.Iterations/2); i++ {
			dir := filepath.Join(h.Pool.Dir, "tmp", fmt.Sprintf("bench-cr-%s-%d", sb.ID, i))
			if err := os.MkdirAll(filepath.Join(dir, "images"), 0o700); err != nil {
				return res, err
			}
			t0 := time.Now()
			if err := plainDump(cfg.CriuPath, s.Pid, filepath.Join(dir, "images")); err != nil {
				return res, err
			}
			if out, err := exec.Command("cp", "-a", "--reflink=never", root, filepath.Join(dir, "root")).CombinedOutput(); err != nil {
				return res, fmt.Errorf("cp: %v: %s", err, out)
			}
			bDump = append(bDump, time.Since(t0))
			if st, err := criu.ReadDumpStats(filepath.Join(dir, "images")); err == nil {
				bStall = append(bStall, msDur(st.FreezingMS+st.FrozenMS))
			}
			if i == 0 {
				row.BaseBytes = dirSize(filepath.Join(dir, "images")) + dirSize(filepath.Join(dir, "root"))
			}
			// Restore a copy of the tree next to the sandbox, then kill it.
			t0 = time.Now()
			pid, err := plainRestore(cfg.CriuPath, filepath.Join(dir, "images"), dir, filepath.Join(dir, "root"))
			if err != nil {
				return res, err
			}
			bRest = append(bRest, time.Since(t0))
			killTree(pid)
			_ = os.RemoveAll(dir)
		}
		row.BaseStall, row.BaseDump, row.BaseRestore = bStall.Stats(), bDump.Stats(), bRest.Stats()
		res.Rows = append(res.Rows, row)
		if err := c.Remove(ctx, sb.ID); err != nil {
			return res, err
		}
	}
	return res, nil
}

func msDur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// PrintCR writes the result as a table with the targets checked.
func PrintCR(w io.Writer, r CRResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tmethod\tstall p50\tcheckpoint p50\tp95\trollback p50\tp95\tbytes (2nd checkpoint)\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\tmolt full\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%s (first %s)\t\n", row.Workload,
			row.Stall.P50, row.Checkpoint.P50, row.Checkpoint.P95, row.Rollback.P50, row.Rollback.P95, human(row.SecondBytes), human(row.FirstBytes))
		fmt.Fprintf(tw, "%s\tcriu dump + cp -a\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%.1f ms\t%s\t\n", row.Workload,
			row.BaseStall.P50, row.BaseDump.P50, row.BaseDump.P95, row.BaseRestore.P50, row.BaseRestore.P95, human(row.BaseBytes))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		pct := 100 * float64(row.SecondBytes) / float64(max(row.ImageBytes, 1))
		ok := "met"
		if pct > 13 {
			ok = "MISSED"
		}
		fmt.Fprintf(w, "%s: second checkpoint wrote %s = %.1f%% of a full dump (%s); target <= 13%%: %s\n", row.Workload, human(row.SecondBytes), pct, human(row.ImageBytes), ok)
		ok = "met"
		if row.Stall.P50 > row.BaseStall.P50 {
			ok = "MISSED"
		}
		fmt.Fprintf(w, "%s: stall p50 %.1f ms vs CRIU's own dump %.1f ms; target no longer: %s\n", row.Workload, row.Stall.P50, row.BaseStall.P50, ok)
	}
}

// plainDump is the baseline's checkpoint: CRIU's own dump of the tree
// with full images, leaving it running.
func plainDump(criuPath string, pid int, images string) error {
	if err := os.MkdirAll(images, 0o700); err != nil {
		return err
	}
	out, err := exec.Command(criuPath, "dump", "-t", strconv.Itoa(pid), "-D", images, "-o", "dump.log",
		"--leave-running", "--tcp-established", "--file-locks", "--network-lock", "nftables").CombinedOutput()
	if err != nil {
		return fmt.Errorf("criu dump: %v: %s", err, out)
	}
	return nil
}

// plainRestore is the baseline's restore: CRIU's own restore of images
// onto root, detached; it returns the restored root's PID.
func plainRestore(criuPath, images, work, root string) (int, error) {
	pidfile := filepath.Join(work, "pid")
	_ = os.Remove(pidfile)
	out, err := exec.Command(criuPath, "restore", "-D", images, "-W", work, "-o", "restore.log",
		"--root", root, "--restore-detached", "--pidfile", pidfile,
		"--tcp-established", "--file-locks", "--network-lock", "nftables").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("criu restore: %v: %s", err, out)
	}
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// killTree kills a restored tree's root (a PID namespace's init: all of
// it dies) and waits for it to go.
func killTree(pid int) {
	_ = unix.Kill(pid, unix.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); unix.Kill(pid, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}
