package core

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/image"
	"github.com/molt-sh/molt/internal/meta"
)

// CommitSandbox makes the image req.Name of the sandbox's files: a
// snapshot of its root taken with the sandbox frozen (so no write is cut
// in half), recording the sandbox's image as its parent and that image's
// config as its own. It holds the sandbox's lock, then the new image's.
func (m *Manager) CommitSandbox(ctx context.Context, ref string, req v1.CommitRequest) (meta.Image, error) {
	if err := validName("image", req.Name); err != nil {
		return meta.Image{}, err
	}
	rec, unlock, err := m.lockSandbox(ref)
	if err != nil {
		return meta.Image{}, err
	}
	defer unlock()
	img := meta.Image{Name: req.Name, Source: "commit:" + rec.ID, Parent: rec.Image, Config: cloneImageConfig(rec.ImageConfig)}
	return m.makeImage(ctx, img, false, false, func(staging string, _ *meta.Image) error {
		return m.snapshotFrozen(ctx, rec, staging)
	})
}

// snapshotFrozen makes dst a read-only snapshot of the sandbox's root,
// with its cgroup frozen if it is running.
func (m *Manager) snapshotFrozen(ctx context.Context, rec sandboxRec, dst string) error {
	root := m.sbRoot(rec.ID)
	// Dirty data is flushed before the freeze, so that the snapshot's
	// own flush inside it is short.
	if err := fsnap.SyncFS(root); err != nil {
		return err
	}
	if m.report(rec).State != v1.StateRunning {
		return snapshotRoot(root, dst, nil)
	}
	cg, err := cgroup.Load(m.cgroupName(rec.ID))
	if err != nil {
		return err
	}
	if err := cg.Freeze(ctx); err != nil {
		return err
	}
	err = snapshotRoot(root, dst, nil)
	if terr := cg.Thaw(); terr != nil {
		err = errors.Join(err, fmt.Errorf("thaw: %w", terr))
	}
	return err
}

// PushImage pushes the image name to req.Ref as one layer (its tree) and
// a config carrying the image's, and returns the image with the digest
// of the pushed manifest. The image's lock is held meanwhile, so it is
// not removed under the push.
func (m *Manager) PushImage(ctx context.Context, name string, req v1.ImagePushRequest, log io.Writer) (meta.Image, error) {
	unlock := m.lock("image/" + name)
	defer unlock()
	img, err := m.Image(name)
	if err != nil {
		return meta.Image{}, err
	}
	var cfg image.Config
	if c := img.Config; c != nil {
		cfg = image.Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	}
	fmt.Fprintf(orDiscard(log), "pushing %s to %s\n", name, req.Ref)
	d, err := image.Push(ctx, m.imageDir(name), cfg, req.Ref, image.RegistryOptions{Insecure: req.Insecure}, m.path("tmp"), log)
	if err != nil {
		return meta.Image{}, err
	}
	img.Digest = d
	return img, nil
}

func cloneImageConfig(c *meta.ImageConfig) *meta.ImageConfig {
	if c == nil {
		return nil
	}
	return &meta.ImageConfig{
		Env: slices.Clone(c.Env), WorkingDir: c.WorkingDir, User: c.User,
		Entrypoint: slices.Clone(c.Entrypoint), Cmd: slices.Clone(c.Cmd),
	}
}

// imageEnv is a new sandbox's env: the image's, under the request's.
func imageEnv(c *meta.ImageConfig, env map[string]string) map[string]string {
	if c == nil || len(c.Env) == 0 {
		return env
	}
	out := map[string]string{}
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			out[k] = v
		}
	}
	maps.Copy(out, env)
	return out
}

// execDefaults fills what an exec request leaves out from the config of
// the sandbox's image: Entrypoint followed by Cmd for no command, the
// working directory, the user.
func execDefaults(rec sandboxRec, req *v1.ExecRequest) {
	c := rec.ImageConfig
	if c == nil {
		return
	}
	if len(req.Args) == 0 {
		req.Args = append(slices.Clone(c.Entrypoint), c.Cmd...)
	}
	if req.Cwd == "" {
		req.Cwd = c.WorkingDir
	}
	if req.User == "" {
		req.User = c.User
	}
}
