package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/spf13/cobra"
)

// benchCmd is molt bench: the flags of the benchmark daemon, shared by
// every benchmark, and one subcommand per benchmark.
func benchCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "bench", Short: "Benchmarks that print molt next to baselines from one run"}
	c.PersistentFlags().IntVar(&benchNodeSize, "pool-node-size", 0, "the benchmark daemon's pool node size in bytes (0: the default, 8192)")
	c.PersistentFlags().BoolVar(&benchCOW, "cow-capture", true, "the benchmark daemon's --cow-capture: false copies every page in the frozen window")
	c.PersistentFlags().BoolVar(&benchTemplate, "template-capture", true, "the benchmark daemon's --template-capture")
	c.PersistentFlags().BoolVar(&benchUserNS, "userns", false, "the benchmark daemon's --userns (a user namespace per sandbox)")
	c.PersistentFlags().StringVar(&benchSeccomp, "seccomp", v1.SeccompDefault, "the benchmark daemon's --seccomp-default: the system call filter of the sandboxes measured (default or unconfined)")
	c.PersistentFlags().BoolVar(&benchHardening, "hardening", true, "false switches off the hardening that can be switched off, to measure its cost: no seccomp filter, no default memory, pids or CPU limits, no disk quotas (masks, dropped capabilities, the device filter and the cgroup namespace stay)")
	c.PersistentFlags().BoolVar(&benchDynMods, "cgroup-favordynmods", true, "the benchmark daemon's --cgroup-favordynmods; false also clears the option on the host's cgroup2 mount first")
	c.PersistentFlags().BoolVar(&benchEncrypt, "encrypt", false, "give the benchmark daemon a random key-encryption key: encryption at rest on (bench encryption compares both side by side)")
	c.AddCommand(benchEncryptionCmd(g), benchFSCmd(g), benchCRCmd(g), benchRollbackCmd(g), benchSearchCmd(g), benchForkCmd(g), turnsBenchCmd(g), benchEgressCmd(g), benchRecoveryCmd(g), benchImagesCmd(g), benchFleetCmd(g), recoveryAgentCmd())
	return c
}

// benchFSCmd is molt bench fs: filesystem checkpoint and rollback
// next to copies and tar of the same root.
func benchFSCmd(g *globals) *cobra.Command {
	var iters, baseIters, files int
	var sizes []string
	var dir, cacheDir string
	fs := &cobra.Command{
		Use:   "fs",
		Short: "Filesystem checkpoint and rollback latency vs cp -a (reflinked and full) and tar",
		Long: "Starts a daemon on a temporary root (under --dir), builds the default image (cached), fills a sandbox\n" +
			"with each data size in --files files, and measures molt's fs checkpoint and rollback with one file\n" +
			"changed between iterations, next to a reflinked copy (cp -a --reflink=always), a full copy\n" +
			"(cp -a --reflink=never) and a tar archive of the same root.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			var bs []int64
			for _, s := range sizes {
				n, err := parseSize(s)
				if err != nil {
					return err
				}
				bs = append(bs, n)
			}
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunFS(ctx, e, bench.FSConfig{Image: "default", CriuPath: core.DefaultCriuPath, Sizes: bs, Files: files,
					Iterations: iters, BaselineIterations: baseIters, Progress: os.Stderr})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench fs: %d files per sandbox, one file changed between checkpoints\n", files)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintFS(os.Stdout, res)
				})
			})
		},
	}
	fs.Flags().IntVar(&iters, "iterations", 30, "checkpoints and rollbacks per size")
	fs.Flags().IntVar(&baseIters, "baseline-iterations", 3, "runs of each baseline per size")
	fs.Flags().IntVar(&files, "files", 10000, "files per sandbox")
	fs.Flags().StringSliceVar(&sizes, "sizes", []string{"10M", "1G"}, "data sizes")
	fs.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	fs.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return fs
}

// benchCRCmd is molt bench cr: full checkpoint and rollback next to
// plain criu dump and restore with a root copy.
func benchCRCmd(g *globals) *cobra.Command {
	var dir, cacheDir string
	var crIters, heap int
	var criuPath string
	cr := &cobra.Command{
		Use:   "cr",
		Short: "Full (process) checkpoint and rollback vs plain criu dump/restore with a full root copy",
		Long: "Starts a daemon on a temporary root and measures, for an idle bash session and a Python process\n" +
			"holding --heap MiB: stall, checkpoint and rollback latency, and the bytes a second checkpoint writes\n" +
			"after a small change, next to plain criu dump/restore of the same tree with full images and a copy\n" +
			"of the root: with molt's CRIU options (network, UTS and IPC namespaces left out, no network lock,\n" +
			"cgroups ignored, molt's log level) and a reflinked copy (the main baseline), and with CRIU's\n" +
			"defaults and a full data copy.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunCR(ctx, e, bench.CRConfig{Image: "default", CriuPath: criuPath, Iterations: crIters, HeapMiB: heap, Progress: os.Stderr})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench cr: %d checkpoints and rollbacks per workload (baselines: half as many each)\n", crIters)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintCR(os.Stdout, res)
				})
			})
		},
	}
	cr.Flags().IntVar(&crIters, "iterations", 10, "checkpoints and rollbacks per workload")
	cr.Flags().IntVar(&heap, "heap", 100, "heap of the Python workload, MiB")
	cr.Flags().StringVar(&criuPath, "criu", core.DefaultCriuPath, "criu for the baseline")
	cr.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	cr.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return cr
}

// benchRollbackCmd is molt bench rollback: the latency of each
// rollback tier next to the cold baselines.
func benchRollbackCmd(g *globals) *cobra.Command {
	var heap int
	var criuPath, dir, cacheDir string
	var rbIters, restarts, faultRounds int
	var seed int64
	rb := &cobra.Command{
		Use:   "rollback",
		Short: "Rollback latency: hot (standby), back to back, random of the last 8, warm (CRIU restore), after a daemon restart, cold baselines (root copy + criu restore)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunRollback(ctx, e, bench.RollbackConfig{Image: "default", CriuPath: criuPath, Iterations: rbIters, HeapMiB: heap,
					Restarts: restarts, FaultRounds: faultRounds, Seed: seed, Progress: os.Stderr, NoCold: benchUserNS})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench rollback: %d rollbacks per tier and workload, %d daemon restarts, %d heap rewrites each way\n", rbIters, restarts, faultRounds)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintRollback(os.Stdout, res)
				})
			})
		},
	}
	rb.Flags().IntVar(&rbIters, "iterations", 30, "rollbacks per tier and workload")
	rb.Flags().IntVar(&restarts, "restarts", 3, "daemon restarts per workload, each followed by one rollback")
	rb.Flags().IntVar(&faultRounds, "fault-rounds", 5, "heap rewrites with and without a full checkpoint just before (write-fault cost)")
	rb.Flags().Int64Var(&seed, "seed", 1, "random seed of the rollbacks to one of the last 8 checkpoints")
	rb.Flags().IntVar(&heap, "heap", 100, "heap of the Python workload, MiB")
	rb.Flags().StringVar(&criuPath, "criu", core.DefaultCriuPath, "criu for the baseline")
	rb.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	rb.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return rb
}

// benchSearchCmd is molt bench search: nodes a seeded tree search
// expands per minute with molt and with the baselines.
func benchSearchCmd(g *globals) *cobra.Command {
	var seed int64
	var criuPath, dir, cacheDir string
	var budget time.Duration
	var rounds int
	search := &cobra.Command{
		Use:   "search",
		Short: "Tree search: nodes expanded per minute for molt, copytree+replay and plain CRIU with root copies",
		Long: "The same seeded random tree search runs with each method for --budget, --rounds times: pick a random\n" +
			"node, go back to it, expand it with a command that changes files and the session's state (checked),\n" +
			"capture the child. Methods: molt; copytree + replay with cp -a --reflink=always (the main baseline)\n" +
			"and with Python's shutil.copytree (" + "/usr/bin/python3" + "); plain CRIU with molt's options and reflinked\n" +
			"root copies. The methods' order rotates every round and the pool settles (btrfs subvolume sync)\n" +
			"before every window; rates are the median of the rounds with the spread.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunSearch(ctx, e, bench.SearchConfig{Image: "default", CriuPath: criuPath, Budget: budget, Rounds: rounds, Seed: seed, Progress: os.Stderr})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench search: %v per method and round, %d rounds, seed %d\n", budget, rounds, seed)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintSearch(os.Stdout, res)
				})
			})
		},
	}
	search.Flags().DurationVar(&budget, "budget", 20*time.Second, "time per method and round")
	search.Flags().IntVar(&rounds, "rounds", 3, "rounds (each method once per round, the order rotated)")
	search.Flags().Int64Var(&seed, "seed", 1, "random seed (the same tree choices for every method)")
	search.Flags().StringVar(&criuPath, "criu", core.DefaultCriuPath, "criu for the baseline")
	search.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	search.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return search
}

// benchForkCmd is molt bench fork: forks per second of one full
// checkpoint next to root copies restored with criu.
func benchForkCmd(g *globals) *cobra.Command {
	var heap int
	var criuPath, dir, cacheDir string
	var forkN, forkRounds int
	fk := &cobra.Command{
		Use:   "fork",
		Short: "Fan-out: forks per second of fork CK -n N next to copying the root and restoring with criu N times",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunFork(ctx, e, bench.ForkConfig{Image: "default", CriuPath: criuPath, N: forkN, Rounds: forkRounds, HeapMiB: heap, Progress: os.Stderr})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench fork: %d forks of one full checkpoint, %d rounds (the baseline: one)\n", forkN, forkRounds)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintFork(os.Stdout, res)
				})
			})
		},
	}
	fk.Flags().IntVarP(&forkN, "n", "n", 8, "forks per round")
	fk.Flags().IntVar(&forkRounds, "rounds", 5, "molt rounds per workload")
	fk.Flags().IntVar(&heap, "heap", 100, "heap of the Python workload, MiB")
	fk.Flags().StringVar(&criuPath, "criu", core.DefaultCriuPath, "criu for the baseline")
	fk.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root goes")
	fk.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return fk
}

// withDaemon runs fn against an ephemeral daemon on a temporary root
// under dir, with the default image built (from the cache after the
// first build), and removes everything afterwards.
func withDaemon(ctx context.Context, dir, cacheDir string, fn func(*daemon.Ephemeral) error) error {
	return withDaemonConfig(ctx, dir, cacheDir, nil, fn)
}

// withDaemonConfig is withDaemon with tweak applied to the daemon's
// configuration after bench's own flags.
func withDaemonConfig(ctx context.Context, dir, cacheDir string, tweak func(*core.Config), fn func(*daemon.Ephemeral) error) error {
	if benchSeccomp != v1.SeccompDefault && benchSeccomp != v1.SeccompUnconfined {
		return fmt.Errorf("--seccomp %q: want %s or %s", benchSeccomp, v1.SeccompDefault, v1.SeccompUnconfined)
	}
	if !benchHardening {
		benchSeccomp = v1.SeccompUnconfined
	}
	fmt.Fprintln(os.Stderr, "bench: sandboxes' seccomp filter:", benchSeccomp, "hardening:", benchHardening)
	cfg := func(c *core.Config) {
		benchTweak(c)
		if tweak != nil {
			tweak(c)
		}
	}
	e, err := daemon.StartEphemeralWith(ctx, dir, cacheDir, version, cfg, benchOptions()...)
	if err != nil {
		return err
	}
	defer func() {
		if err := e.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "molt: cleanup:", err)
		}
	}()
	fmt.Fprintln(os.Stderr, "bench: building the default image (cached after the first build)")
	if _, err := e.Client.BuildImage(ctx, v1.ImageBuildRequest{Name: "default"}, nil); err != nil {
		return err
	}
	return fn(e)
}

// benchDynMods is bench's --cgroup-favordynmods.
var benchDynMods = true

// benchSeccomp is bench's --seccomp.
var benchSeccomp = v1.SeccompDefault

// benchHardening is bench's --hardening.
var benchHardening = true

// benchCOW is bench's --cow-capture.
var benchCOW = true

// benchTemplate is bench's --template-capture.
var benchTemplate = true

// benchUserNS is bench's --userns.
var benchUserNS bool

// benchNodeSize is bench's --pool-node-size.
var benchNodeSize int

// benchTweak applies bench's own flags to a benchmark daemon's
// configuration.
func benchTweak(c *core.Config) {
	c.UserNS = benchUserNS
	c.PoolNodeSize = benchNodeSize
	c.SeccompDefault = benchSeccomp
	if benchEncrypt {
		c.KEK = benchKEK()
	}
	if !benchHardening {
		c.SeccompDefault = v1.SeccompUnconfined
		c.DefaultResources.MemoryBytes, c.DefaultResources.Pids, c.DefaultResources.CPUMillis = -1, -1, -1
	}
}

// benchOptions maps bench's on/off flags to core's options, then adds
// extra. With --cgroup-favordynmods=false it clears the option on the
// host first: a daemon that ran before may have set it.
func benchOptions(extra ...core.Option) []core.Option {
	opts := slices.Concat(without(benchCOW, core.WithoutCOWCapture()), without(benchTemplate, core.WithoutTemplateCapture()),
		without(benchHardening, core.WithoutDiskQuota()))
	if !benchDynMods {
		opts = append(opts, core.WithoutFavorDynMods())
		if _, err := cgroup.SetDynMods(false); err != nil {
			fmt.Fprintln(os.Stderr, "bench: cannot clear favordynmods:", err)
		}
	}
	return append(opts, extra...)
}
