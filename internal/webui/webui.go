package webui

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/atomicfile"
	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/tenant"
)

//go:embed static
var static embed.FS

// Header is the header that carries the token on every call of the page
// (/events and /api/).
const Header = "X-Molt-UI-Token"

// Config configures the web view's server.
type Config struct {
	// Addr is HOST:PORT to listen on (port 0: any).
	Addr string
	// Expose allows an Addr that is not loopback.
	Expose bool
	// TokenFile, if set, is where the URL with the token is written
	// (mode 0600).
	TokenFile string
	// API is the daemon's API handler, served under /api/ as the host
	// admin.
	API http.Handler
	// Source is polled for changes (/events).
	Source Source
	// Interval is how often Source is polled while a page listens
	// (default 500 ms).
	Interval time.Duration
	Log      *slog.Logger
}

// Server is a running web view.
type Server struct {
	cfg    Config
	token  string
	ln     net.Listener
	srv    *http.Server
	hub    *hub
	cancel context.CancelFunc
}

// Start listens on cfg.Addr and serves until Close.
func Start(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.API == nil || cfg.Source == nil {
		return nil, fmt.Errorf("web view: no API to serve: %w", errdefs.ErrInvalidArgument)
	}
	if err := CheckAddr(cfg.Addr, cfg.Expose); err != nil {
		return nil, err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("web view: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{cfg: cfg, token: hex.EncodeToString(b[:]), ln: ln, cancel: cancel}
	s.hub = newHub(cfg.Source, cfg.Interval, cfg.Log, ctx.Done())
	go s.hub.run(ctx)
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	if cfg.TokenFile != "" {
		if err := atomicfile.Write(cfg.TokenFile, []byte(s.URL()+"\n"), 0o600); err != nil {
			s.Close()
			return nil, fmt.Errorf("web view: token file: %w", err)
		}
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error("web view", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return s, nil
}

// CheckAddr refuses an address that is not HOST:PORT, or not loopback
// unless expose.
func CheckAddr(addr string, expose bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("web view address %q: want HOST:PORT: %w", addr, errdefs.ErrInvalidArgument)
	}
	if expose || isLoopback(host) {
		return nil
	}
	return fmt.Errorf("web view address %q is not loopback: its token would cross the network in clear; --ui-expose allows it: %w", addr, errdefs.ErrInvalidArgument)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// URL is the address to open: it carries the token.
func (s *Server) URL() string {
	return "http://" + s.ln.Addr().String() + "/?token=" + s.token
}

// Token is the server's token (the URL carries it).
func (s *Server) Token() string { return s.token }

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error {
	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	if s.cfg.TokenFile != "" {
		_ = os.Remove(s.cfg.TokenFile)
	}
	return err
}

// Handler is the web view's handler (Start serves it).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(static, "static")
	files := http.FileServerFS(sub)
	mux.HandleFunc("GET /{$}", s.index)
	mux.Handle("GET /static/", http.StripPrefix("/static", files))
	mux.Handle("GET /events", s.authed(http.HandlerFunc(s.hub.serve)))
	mux.Handle("/api/", s.authed(s.proxy()))
	return s.headers(mux)
}

// headers sets what every answer carries and checks the Host header.
func (s *Server) headers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if !s.cfg.Expose && !isLoopback(host) {
			deny(w, http.StatusForbidden, "the web view answers to its loopback address only (Host "+r.Host+")")
			return
		}
		h.ServeHTTP(w, r)
	})
}

func deny(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintln(w, msg)
}

// valid reports whether tok is the server's token.
func (s *Server) valid(tok string) bool {
	return tok != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) == 1
}

// tokenOK reports whether r carries the token.
func (s *Server) tokenOK(r *http.Request) bool {
	return s.valid(r.Header.Get(Header))
}

// index serves the page, which holds no data (it reads the API with the
// token). The URL the daemon prints, /?token=TOKEN, is redirected to
// /#token=TOKEN: the page keeps the token from the fragment, which no
// request carries, in the tab's session storage (its origin's, port
// included) and takes it out of the address bar.
func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	if tok := r.URL.Query().Get("token"); tok != "" {
		if !s.valid(tok) {
			s.cfg.Log.Warn("web view: wrong token", "remote", r.RemoteAddr)
			deny(w, http.StatusUnauthorized, "wrong token: open the URL the daemon printed")
			return
		}
		http.Redirect(w, r, "/#token="+s.token, http.StatusSeeOther)
		return
	}
	http.ServeFileFS(w, r, static, "static/index.html")
}

// authed lets through requests with the token; state-changing ones also
// need an Origin equal to the view's own.
func (s *Server) authed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.tokenOK(r) {
			deny(w, http.StatusUnauthorized, "no token: open the URL the daemon printed")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if why := sameOrigin(r); why != "" {
				s.cfg.Log.Warn("web view: state-changing request refused", "reason", why, "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
				deny(w, http.StatusForbidden, why)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// sameOrigin says why a state-changing request is refused ("": it is not).
func sameOrigin(r *http.Request) string {
	o := r.Header.Get("Origin")
	u, err := url.Parse(o)
	// https: an exposed view behind a TLS proxy.
	if o == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host != r.Host {
		return fmt.Sprintf("cross-origin request refused (Origin %q, Host %q)", o, r.Host)
	}
	return ""
}

// The API routes the page uses; nothing else is reachable through it.
var apiRoutes = []string{
	"GET /v1/host",
	"GET /v1/sandboxes",
	"GET /v1/sandboxes/{id}",
	"GET /v1/sandboxes/{id}/checkpoints",
	"GET /v1/sandboxes/{id}/turns",
	"GET /v1/sandboxes/{id}/effects",
	"POST /v1/sandboxes/{id}/rollback",
	"POST /v1/sandboxes/{id}/fork",
	"POST /v1/sandboxes/{id}/hibernate",
	"POST /v1/sandboxes/{id}/resume",
	"DELETE /v1/sandboxes/{id}",
	"POST /v1/checkpoints/{id}/fork",
}

// proxy serves the API routes the page uses, in-process, as the host
// admin; the audit log records them with the token "webui".
func (s *Server) proxy() http.Handler {
	mux := http.NewServeMux()
	fwd := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := tenant.With(r.Context(), tenant.Principal{Admin: true})
		ctx = audit.WithActor(ctx, audit.Actor{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), PID: int32(os.Getpid()), Token: "webui"})
		r2 := r.Clone(ctx)
		r2.Header.Del(Header)
		r2.Header.Del("Accept") // the page wants plain JSON, never a progress stream
		s.cfg.API.ServeHTTP(w, r2)
	})
	for _, p := range apiRoutes {
		mux.Handle(p, fwd)
	}
	return http.StripPrefix("/api", mux)
}
