package bench

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/daemon"
)

// ImagesConfig configures bench images.
type ImagesConfig struct {
	Image      string // the tree split into layers
	Layers     int
	Iterations int
	// Work holds the layer files and the OCI layout (not the pool: the
	// sources of an import are the user's files).
	Work     string
	CriuPath string // reported with the host's facts
	Progress io.Writer
}

// ImagesRow is one way of making a tree of the layers.
type ImagesRow struct {
	Method string `json:"method"`
	Stats  Stats  `json:"stats"`
}

// ImagesResult is the outcome of RunImages.
type ImagesResult struct {
	Host        HostFacts   `json:"host"`
	Layers      int         `json:"layers"`
	Files       int         `json:"files"`
	Bytes       int64       `json:"bytes"`
	LayerBytes  int64       `json:"layer_bytes"`
	Rows        []ImagesRow `json:"rows"`
	Description string      `json:"description"`
}

// RunImages splits the tree of cfg.Image into cfg.Layers gzip-compressed
// layers (GNU tar, the entries in sorted order cut into equal runs),
// serves them from a registry in this process on loopback and as an OCI
// layout, and times, round by round in alternating order: molt image
// pull, molt image import of the layout, and tar -x of the same layer
// files in sequence into a directory of the pool (alone, and followed by
// syncfs: molt's image is a read-only snapshot, which writes the data
// out).
func RunImages(ctx context.Context, e *daemon.Ephemeral, cfg ImagesConfig) (ImagesResult, error) {
	progress := progressf(cfg.Progress)
	c := e.Client
	h, err := c.Host(ctx)
	if err != nil {
		return ImagesResult{}, err
	}
	res := ImagesResult{Host: GatherHost(ctx, c, cfg.CriuPath), Layers: cfg.Layers}
	tree := filepath.Join(h.Pool.Dir, "images", cfg.Image)
	work, err := os.MkdirTemp(cfg.Work, "molt-bench-images-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(work)
	progress("splitting %s into %d layers", cfg.Image, cfg.Layers)
	files, err := splitLayers(ctx, tree, work, cfg.Layers, &res)
	if err != nil {
		return res, err
	}
	ref, layoutDir, err := serveImage(ctx, work, files)
	if err != nil {
		return res, err
	}
	scratch := filepath.Join(h.Pool.Dir, "tmp")
	var pull, imp, tarx, tarSync Sample
	for i := range cfg.Iterations {
		steps := []func() error{
			func() error {
				d, err := timeImage(func() error {
					_, err := c.PullImage(ctx, v1.ImagePullRequest{Name: fmt.Sprintf("bench-pull-%d", i), Ref: ref}, nil)
					return err
				}, func() error { return c.RemoveImage(ctx, fmt.Sprintf("bench-pull-%d", i)) })
				pull = append(pull, d)
				return err
			},
			func() error {
				d, err := timeImage(func() error {
					_, err := c.ImportImage(ctx, v1.ImageImportRequest{Name: fmt.Sprintf("bench-import-%d", i), Path: layoutDir})
					return err
				}, func() error { return c.RemoveImage(ctx, fmt.Sprintf("bench-import-%d", i)) })
				imp = append(imp, d)
				return err
			},
			func() error {
				x, s, err := timeTar(ctx, files, filepath.Join(scratch, fmt.Sprintf("bench-tar-%d", i)))
				tarx, tarSync = append(tarx, x), append(tarSync, s)
				return err
			},
		}
		if i%2 == 1 {
			steps[0], steps[2] = steps[2], steps[0]
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return res, err
			}
		}
		progress("round %d/%d: pull %.2fs, import %.2fs, tar -x %.2fs (+syncfs %.2fs)", i+1, cfg.Iterations,
			pull[i].Seconds(), imp[i].Seconds(), tarx[i].Seconds(), tarSync[i].Seconds())
	}
	res.Rows = []ImagesRow{
		{"molt image pull (loopback registry)", pull.Stats()},
		{"molt image import (OCI layout dir)", imp.Stats()},
		{"tar -xzpf of each layer", tarx.Stats()},
		{"tar -xzpf of each layer + syncfs", tarSync.Stats()},
	}
	res.Description = fmt.Sprintf("%d layers, %d entries, %s uncompressed, %s of gzip layers", res.Layers, res.Files, mib(res.Bytes), mib(res.LayerBytes))
	return res, nil
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

// timeImage times op, then runs cleanup untimed.
func timeImage(op, cleanup func() error) (time.Duration, error) {
	start := time.Now()
	if err := op(); err != nil {
		return 0, err
	}
	d := time.Since(start)
	return d, cleanup()
}

// timeTar extracts the layers in order into dir with GNU tar; it returns
// the time of the extraction, and of the extraction and a syncfs.
func timeTar(ctx context.Context, layers []string, dir string) (time.Duration, time.Duration, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	start := time.Now()
	for _, l := range layers {
		if out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-xzpf", l, "-C", dir).CombinedOutput(); err != nil {
			return 0, 0, fmt.Errorf("tar -x %s: %v: %s", l, err, out)
		}
	}
	x := time.Since(start)
	if out, err := exec.CommandContext(ctx, "sync", "-f", dir).CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("sync -f: %v: %s", err, out)
	}
	return x, time.Since(start), nil
}

// splitLayers writes the tree as n gzip-compressed tar files in work:
// its entries in sorted order, cut into n runs of about equal bytes.
func splitLayers(ctx context.Context, tree, work string, n int, res *ImagesResult) ([]string, error) {
	type ent struct {
		rel  string
		size int64
	}
	var ents []ent
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(tree, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		ents = append(ents, ent{rel, fi.Size()})
		res.Bytes += fi.Size()
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Files = len(ents)
	var files []string
	per := res.Bytes/int64(n) + 1
	var list []string
	var acc int64
	flush := func() error {
		k := len(files) + 1
		lp := filepath.Join(work, fmt.Sprintf("list-%d", k))
		if err := os.WriteFile(lp, []byte(strings.Join(list, "\n")+"\n"), 0o600); err != nil {
			return err
		}
		f := filepath.Join(work, fmt.Sprintf("layer-%d.tar.gz", k))
		if out, err := exec.CommandContext(ctx, "tar", "--numeric-owner", "--xattrs", "--no-recursion", "-C", tree, "-czf", f, "-T", lp).CombinedOutput(); err != nil {
			return fmt.Errorf("tar -c: %v: %s", err, out)
		}
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		res.LayerBytes += st.Size()
		files = append(files, f)
		list, acc = nil, 0
		return nil
	}
	for _, e := range ents {
		list = append(list, e.rel)
		acc += e.size
		if acc >= per && len(files) < n-1 {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	res.Layers = len(files)
	return files, nil
}

// serveImage makes an image of the layer files, pushes it to a registry
// served in this process on loopback until ctx ends, and writes it as an
// OCI layout in work.
func serveImage(ctx context.Context, work string, files []string) (string, string, error) {
	var layers []gv1.Layer
	for _, f := range files {
		l, err := tarball.LayerFromFile(f)
		if err != nil {
			return "", "", err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return "", "", err
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	context.AfterFunc(ctx, srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/bench/layered:1"
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", "", err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return "", "", err
	}
	dir := filepath.Join(work, "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", "", err
	}
	return ref, dir, lp.AppendImage(img)
}

// PrintImages prints the result as a table.
func PrintImages(w io.Writer, r ImagesResult) {
	fmt.Fprintf(w, "image: %s\n", r.Description)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "method\tp50 s\tmin s\tmax s\tn\tp50 / tar+syncfs p50")
	base := r.Rows[len(r.Rows)-1].Stats.P50
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%d\t%s\n", row.Method, row.Stats.P50/1000, row.Stats.Min/1000, row.Stats.Max/1000, row.Stats.N,
			RatioString(row.Stats.P50, base))
	}
	tw.Flush()
}
