package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/coord"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/httpapi"
	"github.com/molt-sh/molt/internal/sandbox"
)

// Ephemeral is a daemon on a temporary state root, serving in this
// process, for the demo and the benchmarks. Close removes everything it
// made: sandboxes, the pool (unmounted, loop device released) and the
// root.
type Ephemeral struct {
	Client  *client.Client
	Manager *core.Manager
	Root    string
	srv     *http.Server
	coord   *coord.Coordinator
	cfg     core.Config
	opts    []core.Option
}

// StartEphemeral starts a daemon on a new directory under parent ("" for
// /var/tmp). cacheDir holds debootstrap trees ("" for the default).
func StartEphemeral(ctx context.Context, parent, cacheDir, version string) (*Ephemeral, error) {
	return StartEphemeralWith(ctx, parent, cacheDir, version, nil)
}

// StartEphemeralWith is StartEphemeral with the Manager's configuration
// adjusted by tweak and opened with opts (benchmarks compare
// configurations).
func StartEphemeralWith(ctx context.Context, parent, cacheDir, version string, tweak func(*core.Config), opts ...core.Option) (*Ephemeral, error) {
	if parent == "" {
		parent = "/var/tmp"
	}
	root, err := os.MkdirTemp(parent, "molt-")
	if err != nil {
		return nil, err
	}
	cfg := core.Config{
		Root: root, PoolSize: 64 << 30, CacheDir: cacheDir, Version: version, StandbyBudget: 2 << 30,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if tweak != nil {
		tweak(&cfg)
	}
	setProcs()
	raiseKernelLimits(cfg.Logger)
	e := &Ephemeral{Root: root, cfg: cfg, opts: opts, Client: client.New(filepath.Join(root, "molt.sock"))}
	if err := e.open(ctx); err != nil {
		if e.Manager != nil {
			_ = e.Manager.Pool().Unmount()
		}
		os.RemoveAll(root)
		return nil, err
	}
	return e, nil
}

// open starts the Manager and serves it on the root's socket.
func (e *Ephemeral) open(ctx context.Context) error {
	m, err := core.Open(ctx, e.cfg, e.opts...)
	if err != nil {
		return err
	}
	sock := filepath.Join(e.Root, "molt.sock")
	_ = os.Remove(sock)
	ln, err := Listen(sock)
	if err != nil {
		m.Close()
		e.Manager = m
		return err
	}
	e.Manager = m
	e.coord = coord.New(m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	e.srv = &http.Server{Handler: httpapi.Handler(m, e.coord, slog.Default()), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	return nil
}

// Restart stops the daemon, leaving its sandboxes running and its state
// on disk, and starts a new one on the same root, as a restarted `molt
// daemon` would (benchmarks measure what a restart costs the next
// operation).
func (e *Ephemeral) Restart(ctx context.Context) error {
	// The agents this process keeps per init (with the sessions they
	// know) go with the old daemon.
	if sbs, err := e.Manager.Sandboxes(); err == nil {
		for _, s := range sbs {
			if init, err := sandbox.InitOf(s.Pid); err == nil && s.Pid > 0 {
				sandbox.Forget(init)
			}
		}
	}
	_ = e.srv.Close()
	e.coord.Close()
	if err := e.Manager.Close(); err != nil {
		return err
	}
	return e.open(ctx)
}

// Close removes every sandbox, stops serving and deletes the root.
func (e *Ephemeral) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	if sbs, err := e.Manager.Sandboxes(); err == nil {
		for _, s := range sbs {
			if err := e.Manager.Remove(ctx, s.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	_ = e.srv.Close()
	e.coord.Close()
	errs = append(errs, e.Manager.Close())
	// The pool may stay busy for a moment while killed sandboxes' mount
	// namespaces are torn down.
	var uerr error
	for i := 0; i < 50; i++ {
		if uerr = e.Manager.Pool().Unmount(); uerr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if uerr != nil {
		errs = append(errs, fmt.Errorf("unmount pool: %w", uerr))
	} else {
		errs = append(errs, os.RemoveAll(e.Root))
	}
	return errors.Join(errs...)
}
