// molt bench images: pull and import of a layered image vs tar -x.

package main

import (
	"fmt"
	"os"

	"github.com/molt-sh/molt/internal/bench"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/daemon"
	"github.com/spf13/cobra"
)

func benchImagesCmd(g *globals) *cobra.Command {
	var layers, iters int
	var dir, cacheDir string
	c := &cobra.Command{
		Use:   "images",
		Short: "Image pull and import of a multi-layer image vs tar -x of the same layers",
		Long: "Starts a daemon on a temporary root (under --dir), builds the default image (cached), splits its tree into\n" +
			"--layers gzip-compressed layers, serves them from a registry in this process on loopback and as an OCI\n" +
			"layout, and times molt image pull and molt image import next to GNU tar extracting the same layer files\n" +
			"in sequence (alone, and followed by syncfs), round by round in alternating order.",
		Example: "  molt bench images --layers 5 --iterations 5",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			return withDaemon(ctx, dir, cacheDir, func(e *daemon.Ephemeral) error {
				res, err := bench.RunImages(ctx, e, bench.ImagesConfig{Image: "default", Layers: layers, Iterations: iters,
					Work: dir, CriuPath: core.DefaultCriuPath, Progress: os.Stderr})
				if err != nil {
					return err
				}
				return g.print(res, func() {
					fmt.Printf("molt bench images: %d rounds\n", iters)
					bench.PrintHost(os.Stdout, res.Host)
					bench.PrintImages(os.Stdout, res)
				})
			})
		},
	}
	c.Flags().IntVar(&layers, "layers", 5, "layers the image's tree is split into")
	c.Flags().IntVar(&iters, "iterations", 5, "rounds")
	c.Flags().StringVar(&dir, "dir", "/var/tmp", "where the temporary state root and the layer files go")
	c.Flags().StringVar(&cacheDir, "cache-dir", envOr("MOLT_CACHE_DIR", "/var/cache/molt"), "debootstrap cache")
	return c
}
