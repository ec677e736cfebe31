package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/spf13/cobra"
)

func turnsBenchCmd(g *globals) *cobra.Command {
	var (
		data, dir, cacheDir        string
		runs, maxTurns             int
		all, fullWaits             bool
		modes, ignore              []string
		scale                      float64
		wait, waitMax, cmdTimeout  time.Duration
		parallel, parallelMaxTurns int
		parallelRuns               int
	)
	c := &cobra.Command{
		Use:   "turns",
		Short: "Replay recorded agent trajectories: turn decisions, checkpoint traffic and time vs none and full-every-turn",
		Long: "Replays recorded coding-agent trajectories (--data) turn by turn, each in a fresh sandbox per mode\n" +
			"(the modes' order rotated per trajectory): none (no checkpoint, no inspector), auto (molt ends each turn with the checkpoint the turn needs) and full (a full\n" +
			"checkpoint after every turn). A turn is the LLM call that produced it, simulated as a wait (recorded\n" +
			"where the data has timestamps, scaled by --llm-scale; --llm-wait elsewhere) during which the previous\n" +
			"turn ends, then its command. Mode full replays without the waits, four trajectories at once (only its\n" +
			"bytes count; --full-waits times it like the others). Prints the decisions per agent, the bytes the checkpoints wrote (auto vs\n" +
			"full every turn vs plain CRIU dumps), the time overhead of auto over none, what made turns full, and\n" +
			"the checkpoint stall of --parallel sandboxes replaying at once with and without the host scheduler.\n" +
			"Sandboxes get the directories the commands expect, empty: commands that need the repository fail.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			for _, m := range modes {
				switch m {
				case bench.ModeNone, bench.ModeAuto, bench.ModeFull:
				default:
					return fmt.Errorf("--modes: unknown mode %q (want none, auto, full)", m)
				}
			}
			sel, err := selectTrajectories(data, runs, all)
			if err != nil {
				return err
			}
			cfg := bench.TurnsConfig{
				Image: "default", Trajectories: sel, Modes: modes, MaxTurns: maxTurns, CriuPath: core.DefaultCriuPath,
				Waits:      bench.WaitConfig{Scale: scale, Default: wait, Max: waitMax},
				CmdTimeout: cmdTimeout, Ignore: ignore, FullWaits: fullWaits,
				Parallel: parallel, ParallelMaxTurns: parallelMaxTurns, ParallelRuns: parallelRuns,
				StartDaemon: func(ctx context.Context, noScheduler bool) (*daemon.Ephemeral, error) {
					var opts []core.Option
					if noScheduler {
						opts = append(opts, core.WithoutScheduler())
					}
					return startBenchDaemon(ctx, dir, cacheDir, opts...)
				},
				Progress: os.Stderr,
			}
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunTurns(ctx, e, cfg)
				if err != nil {
					return err
				}
				return g.print(res, func() {
					var per []string
					for _, a := range []string{bench.AgentMini, bench.AgentOpenHands, bench.AgentSWE} {
						if n := res.PerAgent[a]; n > 0 {
							per = append(per, fmt.Sprintf("%d %s", n, a))
						}
					}
					mt := "all turns"
					if maxTurns > 0 {
						mt = fmt.Sprintf("at most %d turns each", maxTurns)
					}
					fmt.Printf("molt bench turns: %d trajectories (%s), %s, modes %s (none without the inspector; order rotated per trajectory)\n", res.Trajectories, strings.Join(per, ", "), mt, strings.Join(modes, ","))
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintTurns(os.Stdout, res)
				})
			})
		},
	}
	f := c.Flags()
	f.StringVar(&data, "data", "", "trajectories, JSON lines (default: "+bench.DefaultTrajectories+" relative to the repository root, found above the binary or the working directory)")
	f.IntVar(&runs, "runs", 30, "trajectories to replay: the first of each agent in file order, split evenly across agents")
	f.BoolVar(&all, "all", false, "replay every trajectory")
	f.IntVar(&maxTurns, "max-turns", 0, "turns per trajectory (0: all)")
	f.StringSliceVar(&modes, "modes", []string{bench.ModeNone, bench.ModeAuto, bench.ModeFull}, "modes to replay each trajectory in: none, auto, full")
	f.Float64Var(&scale, "llm-scale", 0.05, "scale of the simulated LLM waits")
	f.DurationVar(&wait, "llm-wait", 2*time.Second, "LLM wait of turns without a recorded one, before scaling")
	f.DurationVar(&waitMax, "llm-max", 60*time.Second, "cap of a recorded LLM wait, before scaling (0: none)")
	f.BoolVar(&fullWaits, "full-waits", false, "simulate the LLM waits in mode full too, to time it (default: back to back, only its bytes count)")
	f.DurationVar(&cmdTimeout, "cmd-timeout", 10*time.Second, "per-command timeout")
	f.StringArrayVar(&ignore, "ignore", nil, "path pattern whose changes do not matter for recovery, for auto's turn ends (repeatable)")
	f.IntVar(&parallel, "parallel", 8, "sandboxes replaying at once in auto mode, with and without the host scheduler (0: skip)")
	f.IntVar(&parallelMaxTurns, "parallel-max-turns", 40, "turns per sandbox in the parallel part (0: all)")
	f.IntVar(&parallelRuns, "parallel-runs", 1, "trajectories each sandbox slot replays in turn in the parallel part")
	f.StringVar(&dir, "dir", "/var/tmp", "where the temporary state roots go")
	f.StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return c
}

// startBenchDaemon starts an ephemeral daemon with extra options
// and the default image built; Close removes it.
func startBenchDaemon(ctx context.Context, dir, cacheDir string, opts ...core.Option) (*daemon.Ephemeral, error) {
	e, err := daemon.StartEphemeralWith(ctx, dir, cacheDir, version, benchTweak, benchOptions(opts...)...)
	if err != nil {
		return nil, err
	}
	if _, err := e.Client.BuildImage(ctx, v1.ImageBuildRequest{Name: "default"}, nil); err != nil {
		if cerr := e.Close(); cerr != nil {
			fmt.Fprintln(os.Stderr, "molt: cleanup:", cerr)
		}
		return nil, err
	}
	return e, nil
}

// selectTrajectories loads the trajectories of data (default: the
// repository's shared set, found from the binary, bin/molt, or the
// working directory) and selects runs of them (every one with all).
func selectTrajectories(data string, runs int, all bool) ([]bench.Trajectory, error) {
	if data == "" {
		var starts []string
		if exe, err := os.Executable(); err == nil {
			starts = append(starts, filepath.Dir(exe))
		}
		if wd, err := os.Getwd(); err == nil {
			starts = append(starts, wd)
		}
		p, err := bench.ResolveData(bench.DefaultTrajectories, starts...)
		if err != nil {
			return nil, err
		}
		data = p
	}
	ts, err := bench.LoadTrajectories(data)
	if err != nil {
		return nil, err
	}
	sel := bench.SelectTrajectories(ts, runs, all)
	if len(sel) == 0 {
		return nil, fmt.Errorf("no trajectories selected from %s", data)
	}
	return sel, nil
}
