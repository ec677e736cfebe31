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
	return m.makeImage(ctx, req.Name, src, req.Force, true, func(dst string) error {
		return image.Build(ctx, image.BuildOptions{
			Suite: req.Suite, Packages: req.Packages, Mirror: req.Mirror,
			CacheDir: m.cfg.CacheDir, Log: log,
		}, dst)
	})
}

// ImportImage imports a directory or tarball as an image.
func (m *Manager) ImportImage(ctx context.Context, req v1.ImageImportRequest) (meta.Image, error) {
	if _, err := os.Stat(req.Path); err != nil {
		return meta.Image{}, fmt.Errorf("image import: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return m.makeImage(ctx, req.Name, "import:"+req.Path, false, false, func(dst string) error {
		return image.Import(ctx, req.Path, dst)
	})
}

// makeImage fills a staging subvolume with fill, makes it read-only and
// moves it into place; the record is written last. An existing image is
// replaced when force is set, returned when reuse is set and it came from
// the same source (a build is idempotent), and an error otherwise.
func (m *Manager) makeImage(ctx context.Context, name, source string, force, reuse bool, fill func(dst string) error) (meta.Image, error) {
	if err := validName("image", name); err != nil {
		return meta.Image{}, err
	}
	unlock := m.lock("image/" + name)
	defer unlock()
	var existing meta.Image
	err := m.db.Get(meta.Images, name, &existing)
	switch {
	case err == nil && !force && reuse && existing.Source == source:
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
	if err := fsnap.CreateSubvolume(staging); err != nil {
		return meta.Image{}, fmt.Errorf("image %s: %w", name, err)
	}
	r.Add(func() error { return removeTree(staging) })
	if err := fill(staging); err != nil {
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
	img := meta.Image{Name: name, Source: source, Created: time.Now().UTC()}
	if err := m.db.Put(meta.Images, name, img); err != nil {
		return meta.Image{}, err
	}
	r.Success()
	return img, nil
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
