// molt image: building, importing, listing and removing root images.

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/spf13/cobra"
)

func imageCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "image", Short: "Build, import, list and remove images"}
	var suite, mirror string
	var packages []string
	var force bool
	build := &cobra.Command{
		Use: "build NAME", Short: "Build a Debian image with debootstrap (cached)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			start := time.Now()
			ctx, stop := withProgress(ctx, "image build "+args[0])
			img, err := g.client().BuildImage(ctx, v1.ImageBuildRequest{Name: args[0], Suite: suite, Packages: packages, Mirror: mirror, Force: force}, nil)
			stop()
			if err != nil {
				return err
			}
			return g.print(img, func() {
				fmt.Printf("%s\t(%s, %.1fs)\n", img.Name, img.Source, time.Since(start).Seconds())
			})
		},
	}
	build.Flags().StringVar(&suite, "suite", "bookworm", "Debian suite")
	build.Flags().StringSliceVar(&packages, "packages", nil, "extra packages, comma separated")
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror URL")
	build.Flags().BoolVar(&force, "force", false, "rebuild and replace an existing image")
	imp := &cobra.Command{
		Use: "import NAME PATH", Short: "Import a directory or a tarball (.tar, .tar.gz) as an image", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			p, err := filepath.Abs(args[1])
			if err != nil {
				return err
			}
			ctx, stop := withProgress(ctx, "image import "+args[0])
			img, err := g.client().ImportImage(ctx, v1.ImageImportRequest{Name: args[0], Path: p})
			stop()
			if err != nil {
				return err
			}
			return g.print(img, func() { fmt.Println(img.Name) })
		},
	}
	ls := &cobra.Command{
		Use: "ls", Short: "List images", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			l, err := g.client().Images(ctx)
			if err != nil {
				return err
			}
			return g.print(l, func() {
				tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSOURCE\tCREATED")
				for _, i := range l {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", i.Name, i.Source, i.Created.Local().Format(time.DateTime))
				}
				tw.Flush()
			})
		},
	}
	rm := &cobra.Command{
		Use: "rm NAME", Short: "Remove an image (sandboxes made from it are unaffected)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			if err := g.client().RemoveImage(ctx, args[0]); err != nil {
				return err
			}
			return g.print(map[string]string{"removed": args[0]}, func() { fmt.Println(args[0]) })
		},
	}
	c.AddCommand(build, imp, ls, rm)
	return c
}
