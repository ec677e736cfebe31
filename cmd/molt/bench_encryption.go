package main

import (
	"crypto/rand"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/molt-sh/molt/internal/keys"
)

// benchEncrypt is bench's --encrypt: the benchmark daemon gets a random
// KEK (encryption at rest on).
var benchEncrypt bool

// benchKEK returns a random KEK for a benchmark daemon.
func benchKEK() keys.KEK {
	raw := make([]byte, keys.KeySize)
	if _, err := rand.Read(raw); err != nil {
		panic(err)
	}
	k, err := keys.NewKEK(raw)
	if err != nil {
		panic(err)
	}
	return k
}

// benchEncryptionCmd is molt bench encryption: the cost of encryption at
// rest, the same workloads on two daemons side by side.
func benchEncryptionCmd(g *globals) *cobra.Command {
	var dir, cacheDir string
	var rounds, heap int
	c := &cobra.Command{
		Use:   "encryption",
		Short: "Full checkpoints and hot, warm and cold rollbacks with encryption at rest off and on, on two daemons in alternating order",
		Long: "Starts two daemons on temporary roots, one without and one with a KEK (molt daemon --kek-file),\n" +
			"and runs the workloads of bench cr on both, round by round in alternating order: a small change, a\n" +
			"full checkpoint waited for to its commit, and a rollback to it on each tier.",
		Example: "  molt bench encryption --rounds 10 --heap 100",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			benchEncrypt = false
			return withDaemon(ctx, dir, cacheDir, func(plain *daemon.Ephemeral) error {
				benchEncrypt = true
				sealed, err := startBenchDaemon(ctx, dir, cacheDir)
				benchEncrypt = false
				if err != nil {
					return err
				}
				defer func() {
					if err := sealed.Close(); err != nil {
						fmt.Fprintln(os.Stderr, "molt: cleanup:", err)
					}
				}()
				res, err := bench.RunEncryption(ctx, plain, sealed, bench.EncryptionConfig{Image: "default", CriuPath: core.DefaultCriuPath, Rounds: rounds, HeapMiB: heap, Progress: os.Stderr})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench encryption: %d rounds per workload, alternating which daemon goes first\n", rounds)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintEncryption(os.Stdout, res)
				})
			})
		},
	}
	c.Flags().IntVar(&rounds, "rounds", 10, "rounds per workload (each: a checkpoint and three rollbacks on each daemon)")
	c.Flags().IntVar(&heap, "heap", 100, "heap of the Python workload, MiB")
	c.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state roots go")
	c.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return c
}
