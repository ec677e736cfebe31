// Package daemon wires molt's daemon together: the core Manager on the
// state root, and the HTTP API on a unix socket.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/molt-sh/molt/internal/coord"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/httpapi"
)

// Config configures the daemon.
type Config struct {
	core.Config
	Socket string
	// Ready, if set, is called once the API accepts connections.
	Ready func()
}

// Listen creates the API socket. A socket file left by a dead daemon is
// replaced; one that a live daemon serves is an error.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s: a daemon is already serving it: %w", path, errdefs.ErrAlreadyExists)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Run serves until ctx is done. Sandboxes keep running after it returns.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
		cfg.Logger = log
	}
	setProcs()
	m, err := core.Open(ctx, cfg.Config)
	if err != nil {
		return err
	}
	defer m.Close()
	ln, err := Listen(cfg.Socket)
	if err != nil {
		return err
	}
	co := coord.New(m, log)
	defer co.Close()
	srv := &http.Server{Handler: httpapi.Handler(m, co, log), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	h := m.Host()
	log.Info("molt daemon ready", "socket", cfg.Socket, "root", cfg.Root, "pool", h.Pool.Dir, "loop", h.Pool.Loop, "cgroup", h.Cgroup)
	if cfg.Ready != nil {
		cfg.Ready()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	_ = os.Remove(cfg.Socket)
	if errors.Is(err, context.DeadlineExceeded) {
		srv.Close()
		err = nil
	}
	return err
}
