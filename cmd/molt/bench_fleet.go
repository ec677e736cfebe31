package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/objstore/s3server"
	"github.com/spf13/cobra"
)

// benchFleetCmd is molt bench fleet: many sandboxes on this host
// replaying trajectories at once with their checkpoints uploaded to an
// object store, against the same without checkpoints, and a projection
// to a bigger host and a fleet (docs/scale.md).
func benchFleetCmd(g *globals) *cobra.Command {
	var (
		data, dir, cacheDir  string
		sizes                []int
		runs, maxTurns       int
		scale                float64
		wait, waitMax, cmdTO time.Duration
		drain, interval      time.Duration
		proj                 bench.ProjectConfig
		store                storeFlags
	)
	c := &cobra.Command{
		Use:   "fleet",
		Short: "Many sandboxes at once with checkpoints uploaded to an object store: stalls, overhead, upload traffic, and a projection",
		Long: "For each --sandboxes size, that many sandboxes replay recorded trajectories (--data) at once, each in a\n" +
			"fresh sandbox, in mode none (no checkpoints, not watched) and in mode auto (EndTurn under the host\n" +
			"scheduler, committed checkpoints uploaded in the background to --store), the modes' order alternating\n" +
			"between sizes. After its last turn a sandbox waits until its checkpoints are in the store (--drain-timeout).\n" +
			"Prints per run the turns, checkpoint stall p50/p99, turn end, the host's CPU time, bytes written and\n" +
			"uploaded, store requests and the drain; per size auto against none; and a projection of the largest\n" +
			"size's per-turn costs to a --cores host with --per-core sandboxes per core and a fleet of --hosts.\n" +
			"Without --store, a local S3 server (versitygw, `make deps`) is started for the run.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			for _, n := range sizes {
				if n <= 0 {
					return fmt.Errorf("--sandboxes: %d: want positive sizes", n)
				}
			}
			sel, err := selectTrajectories(data, runs, false)
			if err != nil {
				return err
			}
			bucket, name, stop, err := fleetStore(ctx, &store, dir)
			if err != nil {
				return err
			}
			defer stop()
			tweak := func(c *core.Config) { c.Store = bucket }
			return withDaemonConfig(ctx, dir, cacheDir, tweak, func(e *daemon.Ephemeral) error {
				res, err := bench.RunFleet(ctx, e, bench.FleetConfig{
					Image: "default", Trajectories: sel, Sizes: sizes, MaxTurns: maxTurns,
					Waits:      bench.WaitConfig{Scale: scale, Default: wait, Max: waitMax},
					CmdTimeout: cmdTO, DrainTimeout: drain, CriuPath: core.DefaultCriuPath,
					Store: bucket.Stats, StoreName: name, Project: bench.ProjectConfig{
						Cores: proj.Cores, PerCore: proj.PerCore, Hosts: proj.Hosts, TurnInterval: interval},
					Progress: os.Stderr,
				})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench fleet: sandboxes %s, %d trajectories, modes none and auto\n", joinInts(sizes), res.Trajectories)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintFleet(os.Stdout, res)
				})
			})
		},
	}
	f := c.Flags()
	f.IntSliceVar(&sizes, "sandboxes", []int{8, 16, 32}, "sandboxes at once, one run per size and mode")
	f.StringVar(&data, "data", "", "trajectories, JSON lines (default: "+bench.DefaultTrajectories+" relative to the repository root)")
	f.IntVar(&runs, "runs", 32, "trajectories to draw from (the first of each agent in file order, split evenly); sandbox k replays the k-th, wrapping around")
	f.IntVar(&maxTurns, "max-turns", 30, "turns per sandbox (0: all)")
	f.Float64Var(&scale, "llm-scale", 0.05, "scale of the simulated LLM waits")
	f.DurationVar(&wait, "llm-wait", 2*time.Second, "LLM wait of turns without a recorded one, before scaling")
	f.DurationVar(&waitMax, "llm-max", 60*time.Second, "cap of a recorded LLM wait, before scaling (0: none)")
	f.DurationVar(&cmdTO, "cmd-timeout", 10*time.Second, "per-command timeout")
	f.DurationVar(&drain, "drain-timeout", 10*time.Minute, "how long a sandbox waits after its last turn for its checkpoints to be in the store")
	f.IntVar(&proj.Cores, "cores", 128, "cores of the projected host")
	f.Float64Var(&proj.PerCore, "per-core", 2, "sandboxes per core on the projected host")
	f.IntVar(&proj.Hosts, "hosts", 1000, "hosts of the projected fleet")
	f.DurationVar(&interval, "turn-interval", 0, "a real agent's time between turns, for the projection (0: the trajectories' LLM waits before scaling plus the commands' mean)")
	f.StringVar(&store.url, "store", "", "object store: s3://BUCKET/PREFIX or file:///DIR (default: a local S3 server started for the run)")
	f.StringVar(&store.endpoint, "store-endpoint", "", "URL of the S3-compatible server of --store")
	f.StringVar(&store.region, "store-region", "", "region --store's requests are signed for")
	f.StringVar(&dir, "dir", "/var/tmp", "where the temporary state root (and the local S3 server's data) goes")
	f.StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return c
}

// fleetStore opens the bench's store: --store, or a local S3 server
// started under dir with a bucket prefix of its own. stop ends what it
// started.
func fleetStore(ctx context.Context, f *storeFlags, dir string) (objstore.Bucket, string, func(), error) {
	if f.url != "" {
		b, err := f.open(ctx)
		if err != nil {
			return nil, "", nil, err
		}
		return b, b.String(), func() {}, nil
	}
	tmp, err := os.MkdirTemp(dir, "molt-bench-s3-")
	if err != nil {
		return nil, "", nil, err
	}
	p, err := s3server.StartProcess(ctx, tmp)
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, "", nil, err
	}
	stop := func() {
		if err := p.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "molt: the S3 server:", err)
		}
		_ = os.RemoveAll(tmp)
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	b, err := p.Open(ctx, "fleet-"+hex.EncodeToString(r[:]))
	if err != nil {
		stop()
		return nil, "", nil, err
	}
	return b, fmt.Sprintf("a local S3 server (versitygw %s at %s, data in %s)", s3server.Version, p.Endpoint, filepath.Join(tmp, "data")), stop, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}
