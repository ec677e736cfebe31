package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/units"
	"github.com/spf13/cobra"
)

func demoCmd(g *globals) *cobra.Command {
	var dir, cacheDir string
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run a scripted agent session on a temporary root, with timings, and clean up",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return runDemo(ctx, g, dir, cacheDir)
		},
	}
	c.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	c.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return c
}

// demo is the scripted session: the daemon's client and the IDs one
// step hands to later ones.
type demo struct {
	ctx context.Context
	c   *client.Client

	sb, ck1, ck2, ckFull string
}

// demoStep is one line of the demo's report.
type demoStep struct {
	Step   string  `json:"step"`
	MS     float64 `json:"ms"`
	Output string  `json:"output,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// say prints human text unless --json asked for one JSON document.
func say(g *globals, format string, a ...any) {
	if !g.json {
		fmt.Printf(format, a...)
	}
}

// turn ends the sandbox's turn and says what the inspector decided.
func (d *demo) turn(sb string) (string, error) {
	r, err := d.c.EndTurn(d.ctx, sb, v1.TurnRequest{})
	if err != nil {
		if errors.Is(err, client.ErrNotSupported) {
			return "skipped: " + err.Error(), nil
		}
		return "", err
	}
	ck := "no checkpoint"
	if r.Checkpoint != nil {
		ck = "checkpoint " + *r.Checkpoint
	}
	why := strings.Join(r.Reasons, "; ")
	if why == "" {
		why = "nothing changed"
	}
	if len(why) > 60 {
		why = why[:57] + "..."
	}
	return fmt.Sprintf("turn %d: %s, %s (%s)", r.Turn, r.Decision, ck, why), nil
}

func (d *demo) session(sb, text string) (string, error) {
	r, err := d.c.SessionRun(d.ctx, sb, "agent", v1.SessionRunRequest{Command: text})
	if err != nil {
		return "", err
	}
	out := strings.TrimSpace(r.Stdout + r.Stderr)
	if r.ExitCode != 0 {
		return "", fmt.Errorf("exit %d: %s", r.ExitCode, out)
	}
	return strings.ReplaceAll(out, "\n", " | "), nil
}

func runDemo(ctx context.Context, g *globals, dir, cacheDir string) (err error) {
	say(g, "molt demo: a daemon on a temporary root, a Debian sandbox, an agent's shell session,\n")
	say(g, "filesystem and full (process) checkpoints, rollback and fork. Everything is removed at the end.\n\n")
	e, err := daemon.StartEphemeral(ctx, dir, cacheDir, version)
	if err != nil {
		return err
	}
	var report []demoStep
	defer func() {
		t0 := time.Now()
		cerr := e.Close()
		if cerr != nil {
			fmt.Fprintln(os.Stderr, "molt: cleanup:", cerr)
		} else {
			say(g, "\ncleaned up (sandboxes, checkpoints, pool and loop device) in %v\n", time.Since(t0).Round(time.Millisecond))
		}
		if g.json {
			_ = g.print(report, nil)
		}
		if err == nil {
			err = cerr
		}
	}()
	h, err := e.Client.Host(ctx)
	if err != nil {
		return err
	}
	say(g, "daemon on %s, pool %s (loop file: %v), cgroup %s\n\n", e.Root, h.Pool.Dir, h.Pool.Loop, h.Cgroup)
	d := &demo{ctx: ctx, c: e.Client}
	var script []demoAction
	script = append(script, d.filesScript()...)
	script = append(script, d.turnsScript()...)
	script = append(script, d.processesScript()...)
	report, err = runDemoScript(g, script)
	return err
}

// demoAction is one step of the demo's script: what the report calls it
// and what it does.
type demoAction struct {
	what string
	f    func() (string, error)
}

// filesScript is the filesystem part of the demo: an image, a sandbox,
// fs checkpoints, a rollback and a fork.
func (d *demo) filesScript() []demoAction {
	return []demoAction{
		{"image build default (debootstrap, cached)", func() (string, error) {
			// debootstrap's minutes are shown as they go, not sat
			// through in silence.
			ctx, stop := withProgress(d.ctx, "  image build default")
			img, err := d.c.BuildImage(ctx, v1.ImageBuildRequest{Name: "default"}, nil)
			stop()
			return img.Source, err
		}},
		{"create sandbox", func() (string, error) {
			s, err := d.c.Create(d.ctx, v1.SandboxCreateRequest{Image: "default", Name: "agent"})
			d.sb = s.ID
			return "id " + s.ID + ", hostname " + s.Hostname, err
		}},
		{"agent: set up a project", func() (string, error) {
			return d.session(d.sb, `mkdir -p /work/app && cd /work/app && export STAGE=setup && printf 'print("v1")\n' > main.py && python3 main.py`)
		}},
		{"checkpoint --kind fs (label: v1)", func() (string, error) {
			ck, err := d.c.Checkpoint(d.ctx, d.sb, v1.CheckpointRequest{Kind: v1.KindFS, Label: "v1"})
			d.ck1 = ck.ID
			return fmt.Sprintf("%s, stall %.2f ms", ck.ID, ck.StallMS), err
		}},
		{"agent: session state persists", func() (string, error) { return d.session(d.sb, `echo "cwd=$(pwd) STAGE=$STAGE"`) }},
		{"agent: edit, delete, install (a bad turn)", func() (string, error) {
			return d.session(d.sb, `printf 'print("v2: broken")\n' > main.py && rm -rf /usr/share/doc && touch junk && python3 main.py`)
		}},
		{"checkpoint --kind fs (label: v2)", func() (string, error) {
			ck, err := d.c.Checkpoint(d.ctx, d.sb, v1.CheckpointRequest{Kind: v1.KindFS, Label: "v2"})
			d.ck2 = ck.ID
			return fmt.Sprintf("%s, stall %.2f ms", ck.ID, ck.StallMS), err
		}},
		{"rollback to v1", func() (string, error) {
			r, err := d.c.Rollback(d.ctx, d.sb, d.ck1)
			return fmt.Sprintf("tier %s, processes restarted: %v", r.Tier, r.ProcessesRestarted), err
		}},
		{"agent: files are back", func() (string, error) {
			return d.session(d.sb, `cd /work/app && python3 main.py && ls && ls /usr/share/doc | wc -l`)
		}},
		{"fork v2 -n 3", func() (string, error) {
			r, err := d.c.ForkCheckpoint(d.ctx, d.ck2, 3)
			var ids []string
			for _, s := range r.Sandboxes {
				ids = append(ids, s.ID)
			}
			return fmt.Sprintf("%s (%.0f forks/s)", strings.Join(ids, " "), r.ForksPerSecond), err
		}},
		{"forks are independent", func() (string, error) {
			l, err := d.c.Sandboxes(d.ctx)
			if err != nil {
				return "", err
			}
			var outs []string
			for i, s := range l {
				if s.ID == d.sb {
					continue
				}
				o, err := d.session(s.ID, fmt.Sprintf(`echo fork%d > /work/app/who; hostname; cat /work/app/who`, i))
				if err != nil {
					return "", err
				}
				outs = append(outs, o)
			}
			return strings.Join(outs, "; "), nil
		}},
	}
}

// turnsScript is the demo's turn ends: the inspector deciding after a
// read-only turn and after an editing one.
func (d *demo) turnsScript() []demoAction {
	return []demoAction{
		{"turn (auto): end the agent's turn", func() (string, error) { return d.turn(d.sb) }},
		{"agent: a read-only turn (cat, ls, grep)", func() (string, error) {
			return d.session(d.sb, `cat /work/app/main.py >/dev/null; ls /work/app; grep -c print /work/app/main.py`)
		}},
		{"turn (auto)", func() (string, error) { return d.turn(d.sb) }},
		{"agent: an editing turn", func() (string, error) {
			return d.session(d.sb, `printf 'print("v3")\n' > /work/app/main.py && python3 -B /work/app/main.py`)
		}},
		{"turn (auto)", func() (string, error) { return d.turn(d.sb) }},
	}
}

// processesScript is the full (process) part of the demo: a running
// counter and a shell captured, changed and rolled back, then the tree.
func (d *demo) processesScript() []demoAction {
	return []demoAction{
		{"agent: start a counter in the background", func() (string, error) {
			_, err := d.c.ExecDetached(d.ctx, d.sb, v1.ExecRequest{Args: []string{"python3", "-c",
				"import time\nn = 0\nwhile True:\n    n += 1\n    open('/tmp/count', 'w').write(str(n))\n    time.sleep(0.1)"}})
			if err != nil {
				return "", err
			}
			time.Sleep(500 * time.Millisecond)
			return d.session(d.sb, `export MOOD=calm; echo "count $(cat /tmp/count)"`)
		}},
		{"checkpoint --kind full (label: live)", func() (string, error) {
			ck, err := d.c.Checkpoint(d.ctx, d.sb, v1.CheckpointRequest{Kind: v1.KindFull, Label: "live", Wait: true})
			if err != nil {
				if errors.Is(err, client.ErrNotSupported) {
					return "skipped: " + err.Error(), nil
				}
				return "", err
			}
			d.ckFull = ck.ID
			return fmt.Sprintf("%s, stall %.1f ms, %s written", ck.ID, ck.StallMS, units.Bytes(ck.BytesWritten)), nil
		}},
		{"agent: 1 s later, kill the counter, change the shell", func() (string, error) {
			time.Sleep(time.Second)
			return d.session(d.sb, `pkill -f count; export MOOD=angry; echo "count $(cat /tmp/count), MOOD=$MOOD"`)
		}},
		{"rollback to live (files and processes)", func() (string, error) {
			if d.ckFull == "" {
				return "skipped", nil
			}
			r, err := d.c.Rollback(d.ctx, d.sb, d.ckFull)
			return fmt.Sprintf("tier %s in %.1f ms", r.Tier, r.DurationMS), err
		}},
		{"agent: counter and shell are back", func() (string, error) {
			if d.ckFull == "" {
				return "skipped", nil
			}
			time.Sleep(300 * time.Millisecond)
			return d.session(d.sb, `echo "count $(cat /tmp/count) and counting, MOOD=$MOOD"`)
		}},
		{"checkpoint tree of the sandbox", func() (string, error) {
			l, err := d.c.Checkpoints(d.ctx, d.sb)
			var s []string
			for _, c := range l {
				s = append(s, fmt.Sprintf("%s[%s]<-%s", c.ID, c.Label, dash(c.Parent)))
			}
			return strings.Join(s, " "), err
		}},
	}
}

// runDemoScript runs the steps in order, printing a line for each, and
// stops at the first that fails; the report holds every step run.
func runDemoScript(g *globals, script []demoAction) ([]demoStep, error) {
	var report []demoStep
	for _, s := range script {
		t0 := time.Now()
		out, err := s.f()
		st := demoStep{Step: s.what, MS: float64(time.Since(t0).Microseconds()) / 1000, Output: out}
		if err != nil {
			st.Error = err.Error()
			report = append(report, st)
			say(g, "  %-52s FAILED after %.2f ms: %v\n", st.Step, st.MS, err)
			return report, err
		}
		report = append(report, st)
		say(g, "  %-52s %9.2f ms  %s\n", st.Step, st.MS, out)
	}
	return report, nil
}
