// Package daemon wires molt's daemon together: the core Manager on the
// state root, and the HTTP API on a unix socket, every request and every
// effect-ledger record logged in the audit log (<root>/audit).
package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/molt-sh/molt/internal/coord"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/httpapi"
	"github.com/molt-sh/molt/internal/tenant"
	"github.com/molt-sh/molt/internal/webui"
)

// Config configures the daemon.
type Config struct {
	core.Config
	// Options switch core's optimizations off (the on/off flags).
	Options []core.Option
	Socket  string
	// SocketAccess says who besides root may use the socket.
	SocketAccess SocketAccess
	// Ready, if set, is called once the API accepts connections.
	Ready func()
	// Listen, if set, is a TCP address ("tcp://HOST:PORT") where the API
	// is also served, over TLS, to tenants' tokens (listen.go).
	Listen string
	TLS    TLSFiles
	// UI, if set, is HOST:PORT where the web view is served (loopback
	// unless UIExpose; internal/webui). UITokenFile, if set, receives
	// its URL, token included (mode 0600).
	UI          string
	UIExpose    bool
	UITokenFile string
	// StoreGCEvery, if set, runs a garbage collection over the object
	// store that often, with grace period StoreGCGrace (storegc.go).
	StoreGCEvery time.Duration
	StoreGCGrace time.Duration
}

// Run serves until ctx is done. Sandboxes keep running after it returns.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
		cfg.Logger = log
	}
	if cfg.UI != "" {
		if err := webui.CheckAddr(cfg.UI, cfg.UIExpose); err != nil {
			return err // before anything is opened
		}
	}
	setProcs()
	raiseKernelLimits(log)
	alog, err := openAudit(cfg.Root, log)
	if err != nil {
		return err
	}
	defer alog.Close()
	cfg.Egress.OnLedgerAppend = auditLedger(alog, log)
	m, err := core.Open(ctx, cfg.Config, cfg.Options...)
	if err != nil {
		return err
	}
	defer m.Close()
	ln, err := ListenAccess(cfg.Socket, cfg.SocketAccess, log)
	if err != nil {
		return err
	}
	co := coord.New(m, log)
	defer co.Close()
	tenants := tenant.New(m.DB())
	shred := func(name string) error { _, err := m.ShredDataKeys(name); return err }
	admin := append(httpapi.TenantRoutes(tenants, ownsSandboxes(m), shred), httpapi.KeyRoutes(m)...)
	admin = append(admin, httpapi.StoreRoutes(m)...)
	admin = append(admin, httpapi.TrustRoutes(m)...)
	stopGC := startStoreGC(m, cfg.StoreGCEvery, cfg.StoreGCGrace, log)
	defer stopGC()
	api := auditedAPI(m, co, alog, log, admin...)
	srv := &http.Server{Handler: api, ConnContext: peerContext, ReadHeaderTimeout: 10 * time.Second}
	if cfg.Listen != "" {
		stop, err := serveTCP(cfg.Listen, cfg.TLS, tenants, api, alog, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if cfg.UI != "" {
		ui, err := webui.Start(webui.Config{Addr: cfg.UI, Expose: cfg.UIExpose, TokenFile: cfg.UITokenFile, API: api, Source: m, Log: log})
		if err != nil {
			return err
		}
		defer ui.Close()
		log.Info("web view: open this URL (it carries the view's token)", "url", ui.URL())
	}
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
