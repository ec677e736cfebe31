package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/core"
)

// benchRecoveryCmd is molt bench recovery: crashed agents recovered by
// chat-history replay, by files plus chat replay, and by molt's
// fast-forward, each compared with a fault-free run.
func benchRecoveryCmd(g *globals) *cobra.Command {
	var (
		data, dir, cacheDir            string
		runs, crashes, maxTurns, every int
		seed                           uint64
		strategies                     []string
		cmdTimeout                     time.Duration
	)
	c := &cobra.Command{
		Use:   "recovery",
		Short: "Crash recovery of scripted agents replaying recorded trajectories: chat-only vs chat + files vs molt recover, against fault-free runs",
		Long: "Starts a test internet holding a payment service, molt's daemon as a process of its own (egress through\n" +
			"that internet) and a fake LLM. Scripted agents (separate processes) replay recorded trajectories (--data)\n" +
			"through molt's LLM endpoint and exec API, one command per turn, with a payment (an effect, its\n" +
			"Idempotency-Key new on every execution) after every --effect-every turns. Each trajectory runs twice\n" +
			"fault-free (what differs between the two is volatile), then crashes at --crashes seeded turns (kill -9 of\n" +
			"the agent, of every process in the sandbox, of the daemon) and recovers with each strategy: chat (a new\n" +
			"sandbox, every command of the chat re-run), chat+files (the files of the latest turn checkpoint, fresh\n" +
			"processes, the commands after it re-run) and molt (recover, the agent restarted from scratch and\n" +
			"fast-forwarded). Prints, per strategy and agent, correct recoveries (files, session state, processes and\n" +
			"payments equal to the fault-free run's), duplicated effects, time to recover and bytes replayed. Needs root.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return errors.New("molt bench recovery needs root: it runs a daemon and network namespaces")
			}
			for _, s := range strategies {
				if !strings.Contains(","+strings.Join(bench.Strategies, ",")+",", ","+s+",") {
					return fmt.Errorf("--strategies: unknown strategy %q (want %s)", s, strings.Join(bench.Strategies, ", "))
				}
			}
			if crashes < 1 || runs < 1 {
				return errors.New("--trajectories and --crashes must be at least 1")
			}
			ctx, cancel := ctx()
			defer cancel()
			sel, err := selectTrajectories(data, runs, false)
			if err != nil {
				return err
			}
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			res, err := bench.RunRecovery(ctx, bench.RecoveryConfig{
				Bin: bin, Dir: dir, CacheDir: cacheDir, CriuPath: core.DefaultCriuPath, Trajectories: sel,
				Crashes: crashes, MaxTurns: maxTurns, EffectEvery: every, Seed: seed, Strategies: strategies,
				CmdTimeout: cmdTimeout, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			return g.print(res, func() {
				fmt.Printf("molt bench recovery: %d trajectories, %d crashes each, at most %d turns each, a payment every %d turns, seed %d, %.0f s\n",
					len(res.Refs), crashes, maxTurns, every, seed, res.Seconds)
				bench.PrintHost(os.Stdout, res.Host)
				bench.PrintRecovery(os.Stdout, res)
			})
		},
	}
	f := c.Flags()
	f.StringVar(&data, "data", "", "trajectories, JSON lines (default: "+bench.DefaultTrajectories+" relative to the repository root, found above the binary or the working directory)")
	f.IntVar(&runs, "trajectories", 30, "trajectories: the first of each agent in file order, split evenly across agents")
	f.IntVar(&crashes, "crashes", 3, "crash points per trajectory (their kinds go round agent, sandbox, daemon)")
	f.IntVar(&maxTurns, "max-turns", 10, "trajectory turns per run (0: all)")
	f.IntVar(&every, "effect-every", 3, "a payment turn after every N trajectory turns (0: none)")
	f.Uint64Var(&seed, "seed", 1, "seed of the crash points")
	f.StringSliceVar(&strategies, "strategies", bench.Strategies, "recovery strategies: chat, chat+files, molt")
	f.DurationVar(&cmdTimeout, "cmd-timeout", 10*time.Second, "per-command timeout")
	f.StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	f.StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return c
}

// recoveryAgentCmd is the benchmark's scripted agent, a process of its
// own so that a crash can kill -9 it.
func recoveryAgentCmd() *cobra.Command {
	var specFile string
	c := &cobra.Command{
		Use:    "recovery-agent",
		Short:  "The recovery benchmark's scripted agent (run by molt bench recovery)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(specFile)
			if err != nil {
				return err
			}
			var spec bench.AgentSpec
			if err := json.Unmarshal(b, &spec); err != nil {
				return fmt.Errorf("%s: %w", specFile, err)
			}
			ctx, cancel := ctx()
			defer cancel()
			return bench.RunRecoveryAgent(ctx, spec, os.Stdout)
		},
	}
	c.Flags().StringVar(&specFile, "spec", "", "the agent's spec (JSON)")
	return c
}
