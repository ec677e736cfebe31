package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/image"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/revert"
)

func (m *Manager) imageDir(name string) string { return m.path("images", name) }

// BuildImage makes a Debian image with debootstrap (or from the cache).
// An existing image of that name is returned as is unless req.Force.
func (m *Manager) BuildImage(ctx context.Context, req v1.ImageBuildRequest, log io.Writer) (meta.Image, error) {
	if req.Suite == "" {
		req.Suite = "bookworm"
	}
	src := "debootstrap:" + req.Suite
	if len(req.Packages) > 0 {
		pk := slices.Clone(req.Packages)
		slices.Sort(pk)
		src += "+" + strings.Join(pk, ",")
	}
	if req.Mirror != "" {
		src += "@" + req.Mirror
	}
	return m.makeImage(ctx, meta.Image{Name: req.Name, Source: src}, req.Force, true, emptyStage(func(dst string) error {
		return image.Build(ctx, image.BuildOptions{
			Suite: req.Suite, Packages: req.Packages, Mirror: req.Mirror,
			CacheDir: m.cfg.CacheDir, Log: log,
		}, dst)
	}))
}

// ImportImage imports a root filesystem (a directory or a tarball), a
// docker-save archive or an OCI image layout as an image. Progress lines
// go to log.
func (m *Manager) ImportImage(ctx context.Context, req v1.ImageImportRequest, log io.Writer) (meta.Image, error) {
	if _, err := os.Stat(req.Path); err != nil {
		return meta.Image{}, fmt.Errorf("image import: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	f, err := image.Detect(req.Path)
	if err != nil {
		return meta.Image{}, err
	}
	rec := meta.Image{Name: req.Name, Source: "import:" + req.Path}
	if f == image.FormatDir || f == image.FormatTar {
		return m.makeImage(ctx, rec, false, false, emptyStage(func(dst string) error {
			return image.Import(ctx, req.Path, dst)
		}))
	}
	rec.Source = "import:" + f.String() + ":" + req.Path
	if err := validName("image", req.Name); err != nil {
		return meta.Image{}, err
	}
	img, err := image.OpenArchive(ctx, req.Path, f, m.path("tmp"))
	if err != nil {
		return meta.Image{}, err
	}
	defer img.Close()
	fmt.Fprintf(orDiscard(log), "importing %s (%s)\n", req.Path, f)
	return m.makeImage(ctx, rec, false, false, m.unpackStage(ctx, img, log))
}

// PullImage pulls an OCI or Docker image from a registry.
func (m *Manager) PullImage(ctx context.Context, req v1.ImagePullRequest, log io.Writer) (meta.Image, error) {
	if err := validName("image", req.Name); err != nil {
		return meta.Image{}, err
	}
	img, err := image.OpenRegistry(ctx, req.Ref, image.RegistryOptions{Insecure: req.Insecure})
	if err != nil {
		return meta.Image{}, err
	}
	defer img.Close()
	fmt.Fprintf(orDiscard(log), "pulling %s\n", img)
	rec := meta.Image{Name: req.Name, Source: "pull:" + img.String(), Digest: img.Digest()}
	return m.makeImage(ctx, rec, req.Force, false, m.unpackStage(ctx, img, log))
}

// unpackStage unpacks img into a new staging subvolume and records its
// config.
func (m *Manager) unpackStage(ctx context.Context, img *image.Image, log io.Writer) func(string, *meta.Image) error {
	return func(staging string, rec *meta.Image) error {
		if err := fsnap.CreateSubvolume(staging); err != nil {
			return err
		}
		c, err := img.Unpack(ctx, staging, log)
		if err != nil {
			return err
		}
		rec.Config = &meta.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
		return nil
	}
}

// emptyStage makes the staging subvolume empty and fills it with fill.
func emptyStage(fill func(dst string) error) func(string, *meta.Image) error {
	return func(staging string, _ *meta.Image) error {
		if err := fsnap.CreateSubvolume(staging); err != nil {
			return err
		}
		return fill(staging)
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// makeImage makes the staging subvolume with stage (which may also set
// the record's config), makes it read-only and moves it into place; the
// record, rec completed, is written last. An existing image is replaced
// when force is set, returned when reuse is set and it came from the
// same source (a build is idempotent), and an error otherwise.
func (m *Manager) makeImage(ctx context.Context, rec meta.Image, force, reuse bool, stage func(staging string, rec *meta.Image) error) (meta.Image, error) {
	name := rec.Name
	if err := validName("image", name); err != nil {
		return meta.Image{}, err
	}
	unlock := m.lock("image/" + name)
	defer unlock()
	var existing meta.Image
	err := m.db.Get(meta.Images, name, &existing)
	switch {
	case err == nil && !force && reuse && existing.Source == rec.Source:
		return existing, nil
	case err == nil && !force && reuse:
		return meta.Image{}, fmt.Errorf("image %q exists, built from %s: %w (rebuild with --force)", name, existing.Source, errdefs.ErrAlreadyExists)
	case err == nil && !force:
		return meta.Image{}, fmt.Errorf("image %q: %w (remove it first)", name, errdefs.ErrAlreadyExists)
	case err != nil && !errors.Is(err, errdefs.ErrNotFound):
		return meta.Image{}, err
	}
	r := revert.Logged(m.log, "image "+name)
	defer r.Fail()
	staging := m.path("tmp", "image-"+newID())
	r.Add(func() error { return removeTree(staging) })
	if err := stage(staging, &rec); err != nil {
		return meta.Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	dst := m.imageDir(name)
	if force {
		if err := m.db.Delete(meta.Images, name); err != nil {
			return meta.Image{}, err
		}
		if err := removeTree(dst); err != nil {
			return meta.Image{}, fmt.Errorf("image %s: remove old: %w", name, err)
		}
	}
	// A read-only subvolume cannot be renamed (its ".." would change):
	// the image appears in place as a read-only snapshot of the staging
	// subvolume, which then goes.
	if err := fsnap.Snapshot(staging, dst, true); err != nil {
		return meta.Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	r.Add(func() error { return removeTree(dst) })
	if err := removeTree(staging); err != nil {
		return meta.Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	rec.Created = time.Now().UTC()
	if err := m.db.Put(meta.Images, name, rec); err != nil {
		return meta.Image{}, err
	}
	r.Success()
	m.queueIndex(name)
	return rec, nil
}

// Images lists images by name.
func (m *Manager) Images() ([]meta.Image, error) {
	l, err := meta.List[meta.Image](m.db, meta.Images)
	sort.Slice(l, func(i, j int) bool { return l[i].Name < l[j].Name })
	return l, err
}

// Image returns one image.
func (m *Manager) Image(name string) (meta.Image, error) {
	var img meta.Image
	if err := m.db.Get(meta.Images, name, &img); err != nil {
		return meta.Image{}, notFound("image", name)
	}
	return img, nil
}

// RemoveImage deletes an image. Sandboxes made from it are unaffected:
// their roots are independent snapshots.
func (m *Manager) RemoveImage(ctx context.Context, name string) error {
	unlock := m.lock("image/" + name)
	defer unlock()
	if _, err := m.Image(name); err != nil {
		return err
	}
	if err := m.db.Delete(meta.Images, name); err != nil {
		return err
	}
	return removeTree(m.imageDir(name))
}
