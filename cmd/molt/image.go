// molt image: building, importing, listing and removing root images.

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
		Use:   "import NAME PATH",
		Short: "Import a directory, a tarball (.tar, .tar.gz, .tar.zst), a docker-save archive or an OCI image layout (directory or tar) as an image",
		Example: "  molt image import app ./app-rootfs.tar.gz\n  docker save app:1 -o app.tar && molt image import app app.tar\n" +
			"  molt image import app ./app-oci-layout/",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			p, err := filepath.Abs(args[1])
			if err != nil {
				return err
			}
			start := time.Now()
			ctx, stop := withProgress(ctx, "image import "+args[0])
			img, err := g.client().ImportImageProgress(ctx, v1.ImageImportRequest{Name: args[0], Path: p}, nil)
			stop()
			if err != nil {
				return err
			}
			return g.print(img, func() { fmt.Printf("%s\t(%.1fs)\n", img.Name, time.Since(start).Seconds()) })
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
	c.AddCommand(build, imp, imagePullCmd(g), imagePushCmd(g), ls, rm)
	return c
}

func imagePullCmd(g *globals) *cobra.Command {
	var insecure, force bool
	c := &cobra.Command{
		Use:   "pull REF [NAME]",
		Short: "Pull an OCI or Docker image from a registry (credentials from the daemon's docker config file)",
		Long: "Pull an image from a registry into the image NAME (default: REF's repository name, its last path part).\n" +
			"The daemon reads credentials from its docker config file ($DOCKER_CONFIG/config.json, else ~/.docker/config.json of the user it runs as) and its credential helpers.",
		Example: "  molt image pull docker.io/library/debian:bookworm debian\n  molt image pull --insecure 10.0.0.5:5000/app:1 app",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			name := defaultImageName(args[0])
			if len(args) == 2 {
				name = args[1]
			}
			start := time.Now()
			ctx, stop := withProgress(ctx, "image pull "+args[0])
			img, err := g.client().PullImage(ctx, v1.ImagePullRequest{Name: name, Ref: args[0], Insecure: insecure, Force: force}, nil)
			stop()
			if err != nil {
				return err
			}
			return g.print(img, func() { fmt.Printf("%s\t%s\t(%.1fs)\n", img.Name, img.Digest, time.Since(start).Seconds()) })
		},
	}
	c.Flags().BoolVar(&insecure, "insecure", false, "talk plain HTTP to the registry (one on a loopback address gets HTTP without it)")
	c.Flags().BoolVar(&force, "force", false, "replace an existing image of that name")
	return c
}

// defaultImageName is the last path part of a reference's repository.
func defaultImageName(ref string) string {
	if i := strings.LastIndex(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, "/"); i >= 0 {
		ref = ref[i+1:]
	}
	if i := strings.Index(ref, ":"); i >= 0 {
		ref = ref[:i]
	}
	return ref
}

func imagePushCmd(g *globals) *cobra.Command {
	var insecure bool
	c := &cobra.Command{
		Use:     "push NAME REF",
		Short:   "Push an image to a registry: its tree as one layer, and its config",
		Example: "  molt commit sb1 app-v2 && molt image push app-v2 registry.example:5000/app:2",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			ctx, stop := withProgress(ctx, "image push "+args[0])
			img, err := g.client().PushImage(ctx, args[0], v1.ImagePushRequest{Ref: args[1], Insecure: insecure}, nil)
			stop()
			if err != nil {
				return err
			}
			return g.print(img, func() { fmt.Printf("%s@%s\n", args[1], img.Digest) })
		},
	}
	c.Flags().BoolVar(&insecure, "insecure", false, "talk plain HTTP to the registry")
	return c
}

func commitCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "commit SANDBOX NAME",
		Short:   "Make an image of a sandbox's files (a snapshot taken with the sandbox frozen)",
		Long:    "Make the image NAME of the sandbox's files. The image records the sandbox's image as its parent and that image's config (env, working dir, user, default command).",
		Example: "  molt commit sb1 app-v2",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := ctx()
			defer cancel()
			img, err := g.client().Commit(ctx, args[0], v1.CommitRequest{Name: args[1]})
			if err != nil {
				return err
			}
			return g.print(img, func() { fmt.Println(img.Name) })
		},
	}
}
