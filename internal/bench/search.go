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
	Budget   time.Duration // per method and round
	// Rounds each method runs (in an order rotated every round); the
	// result is the median over them, with the spread.
	Rounds   int
	Seed     int64
	Progress io.Writer
}

// SearchRow is one method's result over all rounds.
type SearchRow struct {
	Method      string  `json:"method"`
	Baseline    bool    `json:"baseline"`
	Nodes       int     `json:"nodes"` // over all rounds
	Seconds     float64 `json:"seconds"`
	NodesPerMin Rounds  `json:"nodes_per_minute"`
	MeanDepth   float64 `json:"mean_depth"`
	// GotoP50MS and CheckpointP50 are over every round's samples.
	GotoP50MS     float64 `json:"goto_p50_ms"`
	CheckpointP50 float64 `json:"checkpoint_p50_ms"`
}

// SearchResult is the outcome of RunSearch.
type SearchResult struct {
	Host   HostFacts   `json:"host"`
	Rounds int         `json:"rounds"`
	Order  [][]string  `json:"order"` // the methods' order in each round
	Rows   []SearchRow `json:"rows"`
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
	// stop ends what the method runs outside the sandbox.
	stop func()
}

type node struct {
	parent, depth int
	handle        string
}

// Search methods, in their order in the first round.
const (
	searchMolt     = "molt (full checkpoints, rollback)"
	searchReflink  = "copytree + replay (cp -a --reflink=always)"
	searchPython   = "copytree + replay (Python shutil.copytree)"
	searchCRIU     = "criu dump/restore (molt's options) + reflink root copies"
	minSearchRound = 3
)

// RunSearch runs the same random tree search (seeded) with each method
// for the time budget, in Rounds rounds: pick a random node, go back to
// it, expand it with a command, capture the child. The pool settles
// before every method's window (its deleted subvolumes cleaned), and the
// methods' order rotates every round.
func RunSearch(ctx context.Context, e *daemon.Ephemeral, cfg SearchConfig) (SearchResult, error) {
	c := e.Client
	progress := progressf(cfg.Progress)
	h, err := c.Host(ctx)
	if err != nil {
		return SearchResult{}, err
	}
	res := SearchResult{Host: GatherHost(ctx, c, cfg.CriuPath), Rounds: max(cfg.Rounds, 1)}
	env := &searchEnv{ctx: ctx, c: c, poolDir: h.Pool.Dir, work: filepath.Join(h.Pool.Dir, "tmp", "bench-search"), criuPath: cfg.CriuPath}
	work := env.work
	methods := []func() searchMethod{env.molt, env.reflinkReplay, env.pythonReplay, env.plainCRIU}
	acc := make([]searchAcc, len(methods))
	for r := 0; r < res.Rounds; r++ {
		var order []string
		for k := range methods {
			i := (k + r) % len(methods)
			m := methods[i]()
			order = append(order, m.name)
			if err := settlePool(h.Pool.Dir, 2*time.Minute); err != nil {
				return res, err
			}
			progress("search: round %d/%d: %s, %v", r+1, res.Rounds, m.name, cfg.Budget)
			_ = os.RemoveAll(work)
			if err := os.MkdirAll(work, 0o700); err != nil {
				return res, err
			}
			w, err := runSearch(ctx, c, m, cfg, setupCmd)
			m.stop()
			if err != nil {
				return res, fmt.Errorf("%s: %w", m.name, err)
			}
			acc[i].add(m.name, w)
		}
		res.Order = append(res.Order, order)
	}
	_ = os.RemoveAll(work)
	for i, a := range acc {
		row := a.row()
		row.Baseline = i > 0
		res.Rows = append(res.Rows, row)
	}
	return res, nil
}

// searchEnv is what the search methods share: the daemon, the pool and
// the scratch directory of the baselines' copies.
type searchEnv struct {
	ctx      context.Context
	c        *client.Client
	poolDir  string
	work     string
	criuPath string
}

// sessionRun runs commands in the sandbox's session "main" through the
// daemon; a command that exits non-zero is an error.
func (e *searchEnv) sessionRun(sb string) func(string) (string, error) {
	return func(cmd string) (string, error) {
		r, err := e.c.SessionRun(e.ctx, sb, "main", v1.SessionRunRequest{Command: cmd})
		if err != nil {
			return "", err
		}
		if r.ExitCode != 0 {
			return "", fmt.Errorf("%q: exit %d: %s", cmd, r.ExitCode, r.Stderr)
		}
		return r.Stdout, nil
	}
}

// rootOf is the sandbox's root directory in the pool.
func (e *searchEnv) rootOf(sb string) string {
	return filepath.Join(e.poolDir, "sandboxes", sb, "root")
}

// replay is copytree+replay: a node is the list of commands from the
// root of the tree; going back replaces the root's contents with a copy
// of the pristine root and replays them. copyRoot is the copy.
func (e *searchEnv) replay(name string, copyRoot func(pristine, root string) error) searchMethod {
	paths := map[string][]string{}
	var cur []string
	pristine := filepath.Join(e.work, "pristine")
	m := searchMethod{name: name, stop: func() {}}
	m.start = func(sb string) error {
		if _, err := e.c.Stop(e.ctx, sb); err != nil {
			return err
		}
		if err := reflinkCopy(e.rootOf(sb), pristine); err != nil {
			return err
		}
		_, err := e.c.Start(e.ctx, sb)
		return err
	}
	m.capture = func(sb string, n int) (string, error) {
		k := strconv.Itoa(n)
		paths[k] = append([]string(nil), cur...)
		return k, nil
	}
	m.restore = func(sb, handle string) (func(string) (string, error), error) {
		if _, err := e.c.Stop(e.ctx, sb); err != nil {
			return nil, err
		}
		if err := copyRoot(pristine, e.rootOf(sb)); err != nil {
			return nil, err
		}
		if _, err := e.c.Start(e.ctx, sb); err != nil {
			return nil, err
		}
		run := e.sessionRun(sb)
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
	return m
}

// reflinkReplay is copytree+replay with cp -a --reflink=always.
func (e *searchEnv) reflinkReplay() searchMethod {
	return e.replay(searchReflink, func(pristine, root string) error {
		if out, err := exec.Command("find", root, "-mindepth", "1", "-delete").CombinedOutput(); err != nil {
			return fmt.Errorf("empty root: %v: %s", err, out)
		}
		if out, err := exec.Command("cp", "-a", "--reflink=always", pristine+"/.", root).CombinedOutput(); err != nil {
			return fmt.Errorf("copy root: %v: %s", err, out)
		}
		return nil
	})
}

// pythonReplay is copytree+replay with Python's shutil.copytree.
func (e *searchEnv) pythonReplay() searchMethod {
	return e.replay(searchPython, func(pristine, root string) error {
		if out, err := exec.Command(hostPython, "-c", pyCopytree, pristine, root).CombinedOutput(); err != nil {
			return fmt.Errorf("shutil.copytree: %v: %s", err, out)
		}
		return nil
	})
}

// plainCRIU is plain CRIU with molt's options and reflinked root copies:
// a node is a full dump and a copy of the root; going back copies the
// root again and restores.
func (e *searchEnv) plainCRIU() searchMethod {
	base := criuBaseline{path: e.criuPath, moltOpts: true}
	var live int // PID of the tree the baseline restored, 0 while molt's init runs
	m := searchMethod{name: searchCRIU, start: func(string) error { return nil }}
	m.stop = func() {
		if live != 0 {
			killTree(live)
			live = 0
		}
	}
	m.capture = func(sb string, n int) (string, error) {
		pid := live
		if pid == 0 {
			s, err := e.c.Sandbox(e.ctx, sb)
			if err != nil {
				return "", err
			}
			pid = s.Pid
		}
		dir := filepath.Join(e.work, "plain-"+strconv.Itoa(n))
		if err := base.dump(pid, filepath.Join(dir, "images")); err != nil {
			return "", err
		}
		src := e.rootOf(sb)
		if live != 0 {
			src = filepath.Join(e.work, "plain-root")
		}
		return dir, reflinkCopy(src, filepath.Join(dir, "root"))
	}
	m.restore = func(sb, dir string) (func(string) (string, error), error) {
		if live != 0 {
			killTree(live)
		} else if _, err := e.c.Stop(e.ctx, sb); err != nil {
			return nil, err
		}
		root := filepath.Join(e.work, "plain-root")
		_ = os.RemoveAll(root)
		if err := reflinkCopy(filepath.Join(dir, "root"), root); err != nil {
			return nil, err
		}
		pid, err := base.restore(filepath.Join(dir, "images"), e.work, root)
		if err != nil {
			return nil, err
		}
		live = pid
		init, err := sandbox.InitOf(pid)
		if err != nil {
			return nil, err
		}
		return func(cmd string) (string, error) {
			r, err := init.Call(e.ctx, sbinit.Request{Op: "session-run", Session: "main", Command: cmd})
			if err != nil {
				return "", err
			}
			if r.ExitCode != 0 {
				return "", fmt.Errorf("%q: exit %d: %s", cmd, r.ExitCode, r.Stderr)
			}
			return r.Stdout, nil
		}, nil
	}
	return m
}

// molt is molt itself: full checkpoints, rollbacks (hot when a standby
// is ready).
func (e *searchEnv) molt() searchMethod {
	return searchMethod{
		name:  searchMolt,
		start: func(string) error { return nil },
		stop:  func() {},
		capture: func(sb string, n int) (string, error) {
			ck, err := e.c.Checkpoint(e.ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull})
			return ck.ID, err
		},
		restore: func(sb, ck string) (func(string) (string, error), error) {
			if _, err := e.c.Rollback(e.ctx, sb, ck); err != nil {
				return nil, err
			}
			return e.sessionRun(sb), nil
		},
	}
}

// searchWindow is one method's window of one round.
type searchWindow struct {
	nodes, depths int
	seconds       float64
	gotoS, ckS    Sample
}

// searchAcc sums one method's windows.
type searchAcc struct {
	name    string
	windows []searchWindow
}

func (a *searchAcc) add(name string, w searchWindow) {
	a.name = name
	a.windows = append(a.windows, w)
}

func (a *searchAcc) row() SearchRow {
	row := SearchRow{Method: a.name}
	var rates []float64
	var gotoS, ckS Sample
	depths := 0
	for _, w := range a.windows {
		row.Nodes += w.nodes
		row.Seconds += w.seconds
		depths += w.depths
		gotoS = append(gotoS, w.gotoS...)
		ckS = append(ckS, w.ckS...)
		rates = append(rates, float64(w.nodes)/(w.seconds/60))
	}
	row.NodesPerMin = RoundsOf(rates)
	row.MeanDepth = float64(depths) / float64(max(row.Nodes, 1))
	row.GotoP50MS, row.CheckpointP50 = gotoS.Stats().P50, ckS.Stats().P50
	return row
}

func runSearch(ctx context.Context, c *client.Client, m searchMethod, cfg SearchConfig, setup string) (searchWindow, error) {
	sb, err := c.Create(ctx, v1.SandboxCreateRequest{Image: cfg.Image})
	if err != nil {
		return searchWindow{}, err
	}
	defer c.Remove(context.Background(), sb.ID)
	if _, err := c.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: setup}); err != nil {
		return searchWindow{}, err
	}
	if err := m.start(sb.ID); err != nil {
		return searchWindow{}, err
	}
	root, err := m.capture(sb.ID, 0)
	if err != nil {
		return searchWindow{}, err
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
			return searchWindow{}, err
		}
		gotoS = append(gotoS, time.Since(t0))
		n := len(nodes)
		out, err := run(fmt.Sprintf(expandCmd, n, n))
		if err != nil {
			return searchWindow{}, err
		}
		if got := strings.TrimSpace(out); got != strconv.Itoa(nodes[p].depth+1) {
			return searchWindow{}, fmt.Errorf("node %d: depth %q after going back to node %d (depth %d): the state was not the parent's", n, got, p, nodes[p].depth)
		}
		t0 = time.Now()
		h, err := m.capture(sb.ID, n)
		if err != nil {
			return searchWindow{}, err
		}
		ckS = append(ckS, time.Since(t0))
		nodes = append(nodes, node{parent: p, depth: nodes[p].depth + 1, handle: h})
		depths += nodes[p].depth + 1
	}
	return searchWindow{nodes: len(nodes) - 1, depths: depths, seconds: time.Since(start).Seconds(), gotoS: gotoS, ckS: ckS}, nil
}

// PrintSearch writes the result, molt's rate as a ratio to each
// baseline's (medians of the rounds), and the target checked against the
// main baseline (the fastest copy the filesystem offers).
func PrintSearch(w io.Writer, r SearchResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "method\tnodes/min median (min-max)\tmolt / method\tnodes\tmean depth\tgo-back p50\tcapture p50\t")
	var molt float64
	for i, row := range r.Rows {
		if i == 0 {
			molt = row.NodesPerMin.Median
		}
		ratio := "-"
		if row.Baseline {
			ratio = RatioString(molt, row.NodesPerMin.Median)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1f\t%.1f ms\t%.1f ms\t\n", row.Method, row.NodesPerMin.Format(0), ratio, row.Nodes, row.MeanDepth, row.GotoP50MS, row.CheckpointP50)
	}
	tw.Flush()
	if r.Rounds < minSearchRound {
		fmt.Fprintf(w, "\n(%d rounds: fewer than %d, the spread says little)\n", r.Rounds, minSearchRound)
	}
	if len(r.Rows) >= 2 {
		if x, ok := Ratio(r.Rows[0].NodesPerMin.Median, r.Rows[1].NodesPerMin.Median); ok {
			lo, _ := Ratio(r.Rows[0].NodesPerMin.Min, r.Rows[1].NodesPerMin.Max)
			fmt.Fprintf(w, "\nmolt expands %.1fx the nodes of %s (medians; %.1fx worst round against best; target >= 10x: %s)\n",
				x, r.Rows[1].Method, lo, verdict(x >= 10))
		}
	}
}
