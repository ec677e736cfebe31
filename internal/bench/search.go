package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sbinit"
)

// SearchConfig configures the tree-search benchmark.
type SearchConfig struct {
	Image    string
	CriuPath string
	Budget   time.Duration // per method
	Seed     int64
	Progress io.Writer
}

// SearchRow is one method's result.
type SearchRow struct {
	Method        string  `json:"method"`
	Nodes         int     `json:"nodes"`
	Seconds       float64 `json:"seconds"`
	NodesPerMin   float64 `json:"nodes_per_minute"`
	MeanDepth     float64 `json:"mean_depth"`
	GotoP50MS     float64 `json:"goto_p50_ms"`
	CheckpointP50 float64 `json:"checkpoint_p50_ms"`
}

// SearchResult is the outcome of RunSearch.
type SearchResult struct {
	Rows []SearchRow `json:"rows"`
}

// An expansion changes files and the session's state; it prints the
// node's depth, which checks that the state a method went back to is
// the parent's.
const expandCmd = `export DEPTH=$((DEPTH+1)); echo %d >> /work/trace; head -c 65536 /dev/urandom > /work/blob-%d; echo $DEPTH`

const setupCmd = `export DEPTH=0; mkdir -p /work`

// searchMethod is how one method captures a node and goes back to one.
type searchMethod struct {
	name string
	// start prepares the sandbox after setup.
	start func(sb string) error
	// capture returns a handle for the state just reached.
	capture func(sb string, node int) (string, error)
	// restore goes back to a captured state; it returns how to run a
	// session command there.
	restore func(sb string, handle string) (run func(cmd string) (string, error), err error)
}

type node struct {
	parent, depth int
	handle        string
}

// RunSearch runs the same random tree search (seeded) with each method
// for the time budget: pick a random node, go back to it, expand it with
// a command, capture the child.
func RunSearch(ctx context.Context, e *daemon.Ephemeral, cfg SearchConfig) (SearchResult, error) {
	c := e.Client
	progress := progressf(cfg.Progress)
	h, err := c.Host(ctx)
	if err != nil {
		return SearchResult{}, err
	}
	sessionRun := func(sb string) func(string) (string, error) {
		return func(cmd string) (string, error) {
			r, err := c.SessionRun(ctx, sb, "main", v1.SessionRunRequest{Command: cmd})
			if err != nil {
				return "", err
			}
			if r.ExitCode != 0 {
				return "", fmt.Errorf("%q: exit %d: %s", cmd, r.ExitCode, r.Stderr)
			}
			return r.Stdout, nil
		}
	}
	rootOf := func(sb string) string { return filepath.Join(h.Pool.Dir, "sandboxes", sb, "root") }
	work := filepath.Join(h.Pool.Dir, "tmp", "bench-search")

	// copytree+replay: a node is the list of commands from the root of
	// the tree; going back copies the pristine root and replays them.
	paths := map[string][]string{}
	var pristine string
	replay := searchMethod{
		name: "copytree + replay",
		start: func(sb string) error {
			if _, err := c.Stop(ctx, sb); err != nil {
				return err
			}
			pristine = filepath.Join(work, "pristine")
			if err := cp(rootOf(sb), pristine); err != nil {
				return err
			}
			_, err := c.Start(ctx, sb)
			return err
		},
	}
	var cur []string
	replay.capture = func(sb string, n int) (string, error) {
		k := strconv.Itoa(n)
		paths[k] = append([]string(nil), cur...)
		return k, nil
	}
	replay.restore = func(sb, handle string) (func(string) (string, error), error) {
		if _, err := c.Stop(ctx, sb); err != nil {
			return nil, err
		}
		root := rootOf(sb)
		if out, err := exec.Command("find", root, "-mindepth", "1", "-delete").CombinedOutput(); err != nil {
			return nil, fmt.Errorf("empty root: %v: %s", err, out)
		}
		if out, err := exec.Command("cp", "-a", "--reflink=never", pristine+"/.", root).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("copy root: %v: %s", err, out)
		}
		if _, err := c.Start(ctx, sb); err != nil {
			return nil, err
		}
		run := sessionRun(sb)
		cur = append([]string(nil), paths[handle]...)
		for _, cmd := range append([]string{setupCmd}, cur...) {
			if _, err := run(cmd); err != nil {
				return nil, err
			}
		}
		return func(cmd string) (string, error) {
			cur = append(cur, cmd)
			return run(cmd)
		}, nil
	}

	// Plain CRIU with full root copies: a node is a full dump and a copy
	// of the root; going back copies the root again and restores.
	var live int // PID of the tree the baseline restored, 0 while molt's init runs
	plain := searchMethod{name: "criu dump/restore + full root copies", start: func(string) error { return nil }}
	plain.capture = func(sb string, n int) (string, error) {
		pid := live
		if pid == 0 {
			s, err := c.Sandbox(ctx, sb)
			if err != nil {
				return "", err
			}
			pid = s.Pid
		}
		dir := filepath.Join(work, "plain-"+strconv.Itoa(n))
		if err := plainDump(cfg.CriuPath, pid, filepath.Join(dir, "images")); err != nil {
			return "", err
		}
		src := rootOf(sb)
		if live != 0 {
			src = filepath.Join(work, "plain-root")
		}
		return dir, cp(src, filepath.Join(dir, "root"))
	}
	plain.restore = func(sb, dir string) (func(string) (string, error), error) {
		if live != 0 {
			killTree(live)
		} else if _, err := c.Stop(ctx, sb); err != nil {
			return nil, err
		}
		root := filepath.Join(work, "plain-root")
		_ = os.RemoveAll(root)
		if err := cp(filepath.Join(dir, "root"), root); err != nil {
			return nil, err
		}
		pid, err := plainRestore(cfg.CriuPath, filepath.Join(dir, "images"), work, root)
		if err != nil {
			return nil, err
		}
		live = pid
		init, err := sandbox.InitOf(pid)
		if err != nil {
			return nil, err
		}
		return func(cmd string) (string, error) {
			r, err := init.Call(ctx, sbinit.Request{Op: "session-run", Session: "main", Command: cmd})
			if err != nil {
				return "", err
			}
			if r.ExitCode != 0 {
				return "", fmt.Errorf("%q: exit %d: %s", cmd, r.ExitCode, r.Stderr)
			}
			return r.Stdout, nil
		}, nil
	}

	// molt: full checkpoints, rollbacks (hot when a standby is ready).
	molt := searchMethod{
		name:  "molt (full checkpoints, rollback)",
		start: func(string) error { return nil },
		capture: func(sb string, n int) (string, error) {
			ck, err := c.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull})
			return ck.ID, err
		},
		restore: func(sb, ck string) (func(string) (string, error), error) {
			if _, err := c.Rollback(ctx, sb, ck); err != nil {
				return nil, err
			}
			return sessionRun(sb), nil
		},
	}

	var res SearchResult
	for _, m := range []searchMethod{molt, replay, plain} {
		progress("search: %s, %v", m.name, cfg.Budget)
		live = 0
		_ = os.RemoveAll(work)
		if err := os.MkdirAll(work, 0o700); err != nil {
			return res, err
		}
		row, err := runSearch(ctx, c, m, cfg, setupCmd)
		if live != 0 {
			killTree(live)
		}
		if err != nil {
			return res, fmt.Errorf("%s: %w", m.name, err)
		}
		res.Rows = append(res.Rows, row)
	}
	_ = os.RemoveAll(work)
	return res, nil
}

func runSearch(ctx context.Context, c *client.Client, m searchMethod, cfg SearchConfig, setup string) (SearchRow, error) {
	sb, err := c.Create(ctx, v1.SandboxCreateRequest{Image: cfg.Image})
	if err != nil {
		return SearchRow{}, err
	}
	defer c.Remove(context.Background(), sb.ID)
	if _, err := c.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: setup}); err != nil {
		return SearchRow{}, err
	}
	if err := m.start(sb.ID); err != nil {
		return SearchRow{}, err
	}
	root, err := m.capture(sb.ID, 0)
	if err != nil {
		return SearchRow{}, err
	}
	nodes := []node{{parent: -1, depth: 0, handle: root}}
	rng := rand.New(rand.NewSource(cfg.Seed))
	var gotoS, ckS Sample
	depths := 0
	start := time.Now()
	for time.Since(start) < cfg.Budget {
		p := rng.Intn(len(nodes))
		t0 := time.Now()
		run, err := m.restore(sb.ID, nodes[p].handle)
		if err != nil {
			return SearchRow{}, err
		}
		gotoS = append(gotoS, time.Since(t0))
		n := len(nodes)
		out, err := run(fmt.Sprintf(expandCmd, n, n))
		if err != nil {
			return SearchRow{}, err
		}
		if got := strings.TrimSpace(out); got != strconv.Itoa(nodes[p].depth+1) {
			return SearchRow{}, fmt.Errorf("node %d: depth %q after going back to node %d (depth %d): the state was not the parent's", n, got, p, nodes[p].depth)
		}
		t0 = time.Now()
		h, err := m.capture(sb.ID, n)
		if err != nil {
			return SearchRow{}, err
		}
		ckS = append(ckS, time.Since(t0))
		nodes = append(nodes, node{parent: p, depth: nodes[p].depth + 1, handle: h})
		depths += nodes[p].depth + 1
	}
	el := time.Since(start)
	exp := len(nodes) - 1
	return SearchRow{
		Method: m.name, Nodes: exp, Seconds: el.Seconds(), NodesPerMin: float64(exp) / el.Minutes(),
		MeanDepth: float64(depths) / float64(max(exp, 1)), GotoP50MS: gotoS.Stats().P50, CheckpointP50: ckS.Stats().P50,
	}, nil
}

func cp(src, dst string) error {
	if out, err := exec.Command("cp", "-a", "--reflink=never", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp %s: %v: %s", src, err, out)
	}
	return nil
}

// PrintSearch writes the result with the target checked.
func PrintSearch(w io.Writer, r SearchResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tnodes\tnodes/min\tmean depth\tgo-back p50\tcapture p50\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.1f\t%.1f ms\t%.1f ms\t\n", row.Method, row.Nodes, row.NodesPerMin, row.MeanDepth, row.GotoP50MS, row.CheckpointP50)
	}
	tw.Flush()
	if len(r.Rows) >= 2 && r.Rows[1].NodesPerMin > 0 {
		x := r.Rows[0].NodesPerMin / r.Rows[1].NodesPerMin
		ok := "met"
		if x < 10 {
			ok = "MISSED"
		}
		fmt.Fprintf(w, "\nmolt expands %.1fx the nodes of copytree + replay (target >= 10x: %s)\n", x, ok)
	}
}
