package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/daemon"
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
	// Baselines: plain criu dump (full images, leave running) plus a
	// copy of the root; restore = criu restore from them. The first is
	// the main one (molt's CRIU options, reflinked root copies), the
	// second CRIU's defaults with a full data copy of the root.
	Baselines []CRBaseline `json:"baselines"`
}

// CRBaseline is one baseline's result for a workload.
type CRBaseline struct {
	Method  string `json:"method"`
	Stall   Stats  `json:"stall"`
	Dump    Stats  `json:"checkpoint"`
	Restore Stats  `json:"rollback"`
	Bytes   int64  `json:"bytes"`
}

// CRResult is the outcome of RunCR.
type CRResult struct {
	Host HostFacts `json:"host"`
	Rows []CRRow   `json:"rows"`
}

// crBaselines are the CRIU baselines of bench cr and rollback: the main
// one runs CRIU as molt does and copies the root the fastest way the
// pool offers; the second is plain CRIU and cp as a user would run them.
func crBaselines(criuPath string) []coldMethod {
	return []coldMethod{
		{name: "criu, molt's options + cp --reflink=always", criu: criuBaseline{path: criuPath, moltOpts: true}, reflink: true},
		{name: "criu defaults + cp -a --reflink=never", criu: criuBaseline{path: criuPath}},
	}
}

// coldMethod is a baseline's CRIU and root copy.
type coldMethod struct {
	name    string
	criu    criuBaseline
	reflink bool
}

func (m coldMethod) copyRoot(src, dst string) error {
	if m.reflink {
		return reflinkCopy(src, dst)
	}
	if out, err := exec.Command("cp", "-a", "--reflink=never", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v: %s", err, out)
	}
	return nil
}

// heapScript holds HeapMiB of random data and, whenever /tmp/poke
// appears, rewrites 64 KiB of it (a small change); whenever
// /tmp/rewrite appears, it writes one byte in every page of the heap
// and leaves the milliseconds that took in /tmp/rewrite-ms (the write
// faults a capture that write-protects the heap costs the workload).
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
    if os.path.exists('/tmp/rewrite'):
        os.remove('/tmp/rewrite')
        t = time.perf_counter()
        for off in range(0, len(heap), 4096):
            heap[off] ^= 1
        with open('/tmp/rewrite-ms.tmp', 'w') as f:
            f.write('%%.3f' %% ((time.perf_counter() - t) * 1000))
        os.rename('/tmp/rewrite-ms.tmp', '/tmp/rewrite-ms')
    time.sleep(0.02)
`

// rewriteCmd asks heapScript to rewrite its heap and prints the time.
const rewriteCmd = `rm -f /tmp/rewrite-ms; touch /tmp/rewrite; for i in $(seq 1000); do [ -e /tmp/rewrite-ms ] && break; sleep 0.01; done; cat /tmp/rewrite-ms`

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
	res := CRResult{Host: GatherHost(ctx, c, cfg.CriuPath)}
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

		s, err := c.Sandbox(ctx, sb.ID)
		if err != nil {
			return res, err
		}
		root := filepath.Join(h.Pool.Dir, "sandboxes", sb.ID, "root")
		for _, bm := range crBaselines(cfg.CriuPath) {
			progress("cr: %s: baseline %s", w.name, bm.name)
			base := CRBaseline{Method: bm.name}
			var bStall, bDump, bRest Sample
			for i := 0; i < max(1, cfg.Iterations/2); i++ {
				dir := filepath.Join(h.Pool.Dir, "tmp", fmt.Sprintf("bench-cr-%s-%d", sb.ID, i))
				if err := os.MkdirAll(filepath.Join(dir, "images"), 0o700); err != nil {
					return res, err
				}
				t0 := time.Now()
				if err := bm.criu.dump(s.Pid, filepath.Join(dir, "images")); err != nil {
					return res, err
				}
				if err := bm.copyRoot(root, filepath.Join(dir, "root")); err != nil {
					return res, err
				}
				bDump = append(bDump, time.Since(t0))
				if st, err := criu.ReadDumpStats(filepath.Join(dir, "images")); err == nil {
					bStall = append(bStall, msDur(st.FreezingMS+st.FrozenMS))
				}
				if i == 0 {
					base.Bytes = dirSize(filepath.Join(dir, "images"))
					if !bm.reflink {
						base.Bytes += dirSize(filepath.Join(dir, "root"))
					}
				}
				// Restore a copy of the tree next to the sandbox, then kill it.
				t0 = time.Now()
				pid, err := bm.criu.restore(filepath.Join(dir, "images"), dir, filepath.Join(dir, "root"))
				if err != nil {
					return res, err
				}
				bRest = append(bRest, time.Since(t0))
				killTree(pid)
				_ = os.RemoveAll(dir)
			}
			base.Stall, base.Dump, base.Restore = bStall.Stats(), bDump.Stats(), bRest.Stats()
			row.Baselines = append(row.Baselines, base)
		}
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

// PrintCR writes the result as a table with the targets checked, each
// stated against the main baseline (molt's CRIU options) of the same run.
func PrintCR(w io.Writer, r CRResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tmethod\tstall p50\tcheckpoint p50\ttail\trollback p50\ttail\tn\tbytes (2nd checkpoint)\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\tmolt full\t%.1f ms\t%.1f ms\t%s\t%.1f ms\t%s\t%d\t%s (first %s)\t\n", row.Workload,
			row.Stall.P50, row.Checkpoint.P50, row.Checkpoint.TailString(), row.Rollback.P50, row.Rollback.TailString(), row.Checkpoint.N,
			human(row.SecondBytes), human(row.FirstBytes))
		for _, b := range row.Baselines {
			fmt.Fprintf(tw, "%s\t%s\t%.1f ms\t%.1f ms\t%s\t%.1f ms\t%s\t%d\t%s\t\n", row.Workload, b.Method,
				b.Stall.P50, b.Dump.P50, b.Dump.TailString(), b.Restore.P50, b.Restore.TailString(), b.Dump.N, human(b.Bytes))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, row := range r.Rows {
		pct := 100 * float64(row.SecondBytes) / float64(max(row.ImageBytes, 1))
		fmt.Fprintf(w, "%s: second checkpoint wrote %s = %.1f%% of a full dump (%s); target <= 13%%: %s\n", row.Workload, human(row.SecondBytes), pct, human(row.ImageBytes), verdict(pct <= 13))
		for i, b := range row.Baselines {
			fmt.Fprintf(w, "%s: vs %s: stall %s, checkpoint %s, rollback %s (molt / baseline, p50s)", row.Workload, b.Method,
				RatioString(row.Stall.P50, b.Stall.P50), RatioString(row.Checkpoint.P50, b.Dump.P50), RatioString(row.Rollback.P50, b.Restore.P50))
			if i == 0 {
				fmt.Fprintf(w, "; target stall no longer than CRIU's own dump: %s", verdict(row.Stall.P50 <= b.Stall.P50))
			}
			fmt.Fprintln(w)
		}
	}
}
