// Portable checkpoints: export one as a bundle, import one.

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	v1 "github.com/molt-sh/molt/api/v1"
)

func checkpointExportCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "export CHECKPOINT -o FILE",
		Short:   "Write a checkpoint as a portable, signed bundle (docs/bundles.md)",
		Example: "  molt checkpoint export 3f2a9c1b7d4e -o ck.molt\n  molt checkpoint export mysb:before-deploy -o - | ssh other molt checkpoint import -",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("export: -o FILE is required (- for stdout)")
			}
			ctx, cancel := ctx()
			defer cancel()
			// The bundle is the answer's body: its progress is counted
			// here, as it arrives (on stderr, as every command's).
			d := newProgressDisplay(os.Stderr, "checkpoint export "+args[0], isTerminal(os.Stderr))
			defer d.stop()
			if out == "-" {
				_, err := g.client().ExportCheckpoint(ctx, args[0], &countingWriter{w: os.Stdout, d: d})
				return err
			}
			// Written beside the file, renamed into place once whole: a
			// failed export leaves no file that looks like a bundle.
			tmp, err := os.CreateTemp(filepath.Dir(out), ".export-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			bw := bufio.NewWriterSize(tmp, 1<<20)
			n, err := g.client().ExportCheckpoint(ctx, args[0], &countingWriter{w: bw, d: d})
			d.stop()
			if err == nil {
				err = bw.Flush()
			}
			if err == nil {
				err = tmp.Sync()
			}
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err == nil {
				err = os.Rename(tmp.Name(), out)
			}
			if err != nil {
				return err
			}
			return g.print(map[string]any{"checkpoint": args[0], "file": out, "bytes": n}, func() {
				fmt.Fprintf(os.Stderr, "%s: %d bytes\n", out, n)
			})
		},
	}
	c.Flags().StringVarP(&out, "output", "o", "", "file to write the bundle to (- for stdout)")
	return c
}

func checkpointImportCmd(g *globals) *cobra.Command {
	var tenant string
	c := &cobra.Command{
		Use:     "import FILE",
		Short:   "Import a checkpoint bundle, verified completely; prints the new checkpoint's ID",
		Example: "  molt checkpoint import ck.molt\n  molt fork $(molt checkpoint import ck.molt)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			in := os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			ctx, stop := withProgress(ctx, "checkpoint import")
			res, err := g.client().ImportCheckpoint(ctx, bufio.NewReaderSize(in, 1<<20), tenant)
			stop()
			if err != nil {
				return err
			}
			return g.print(res, func() { fmt.Println(res.Checkpoint.ID) })
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant the imported checkpoint belongs to (host admin only; a tenant's token imports for its tenant)")
	return c
}

// countingWriter reports the bytes written through it to a progress
// display.
type countingWriter struct {
	w io.Writer
	d *progressDisplay
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.d.update(v1.Progress{Message: "receiving the bundle", Done: c.n, Unit: "bytes"})
	return n, err
}
