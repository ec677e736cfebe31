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
}

// StartEphemeral starts a daemon on a new directory under parent ("" for
// /var/tmp). cacheDir holds debootstrap trees ("" for the default).
func StartEphemeral(ctx context.Context, parent, cacheDir, version string) (*Ephemeral, error) {
	return StartEphemeralWith(ctx, parent, cacheDir, version, nil)
}

// StartEphemeralWith is StartEphemeral with the Manager's configuration
// adjusted by tweak (benchmarks compare configurations).
func StartEphemeralWith(ctx context.Context, parent, cacheDir, version string, tweak func(*core.Config)) (*Ephemeral, error) {
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
	m, err := core.Open(ctx, cfg)
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	sock := filepath.Join(root, "molt.sock")
	ln, err := Listen(sock)
	if err != nil {
		m.Close()
		_ = m.Pool().Unmount()
		os.RemoveAll(root)
		return nil, err
	}
	co := coord.New(m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	e := &Ephemeral{Client: client.New(sock), Manager: m, Root: root, coord: co,
		srv: &http.Server{Handler: httpapi.Handler(m, co, slog.Default()), ReadHeaderTimeout: 10 * time.Second}}
	go func() { _ = e.srv.Serve(ln) }()
	return e, nil
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
