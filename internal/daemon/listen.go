package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/tenant"
)

// The TCP listener serves the same API as the unix socket, over TLS
// (mutual when a client CA is given), to tenants' tokens only: every
// request needs `Authorization: Bearer TOKEN` (401 otherwise), and the
// token's principal decides what it reaches (internal/httpapi's guard).
// The host admin stays on the unix socket.

// TLSFiles are the TCP listener's certificate and key, and the CA whose
// client certificates it requires ("" for none).
type TLSFiles struct {
	Cert, Key, ClientCA string
}

// serveTCP serves api on addr for tokens; stop closes the listener.
// Requests refused for want of a valid token are recorded in the audit
// log l (at most refusalsPerSecond a second: an unauthenticated client
// cannot fill the disk with them; the next entry counts those left out).
func serveTCP(addr string, files TLSFiles, st *tenant.Store, api http.Handler, l audit.Appender, log *slog.Logger) (stop func(), err error) {
	hostport, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return nil, fmt.Errorf("--listen %q: want tcp://HOST:PORT", addr)
	}
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("--listen needs --tls-cert and --tls-key: tokens are never sent in clear")
	}
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if files.ClientCA != "" {
		b, err := os.ReadFile(files.ClientCA)
		if err != nil {
			return nil, fmt.Errorf("TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("TLS client CA %s: no certificate in it", files.ClientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	ln, err := net.Listen("tcp", hostport)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: tokenAuth(st, api, refusalLog(l, log), log), TLSConfig: cfg, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("API listener", "addr", hostport, "err", err)
		}
	}()
	log.Info("API served to tenants' tokens over TLS", "addr", ln.Addr().String(), "mutual", files.ClientCA != "")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	}, nil
}

// tokenAuth lets through requests with a valid token, as its principal;
// refused ones are recorded by refused.
func tokenAuth(st *tenant.Store, h http.Handler, refused func(r *http.Request), log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		pr, err := st.Authenticate(strings.TrimSpace(tok))
		if !ok || err != nil {
			log.Warn("API request without a valid token refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			if refused != nil {
				refused(r)
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("WWW-Authenticate", `Bearer realm="molt"`)
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"kind":%q,"message":"this listener serves tenants' tokens: send Authorization: Bearer TOKEN"}`+"\n", v1.ErrKindUnauthenticated)
			return
		}
		ctx := tenant.With(r.Context(), pr)
		ctx = audit.WithActor(ctx, audit.Actor{Tenant: pr.Tenant, Token: pr.TokenID})
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// ownsSandboxes says whether a tenant owns a sandbox of m.
func ownsSandboxes(m *core.Manager) func(string) bool {
	return func(name string) bool {
		l, err := m.Sandboxes()
		if err != nil {
			return true
		}
		for _, sb := range l {
			if sb.Tenant == name {
				return true
			}
		}
		return false
	}
}

// refusalsPerSecond bounds the refused requests the audit log records.
const refusalsPerSecond = 20

// refusalLog returns the recorder of refused requests into l: the
// route, the remote address and the token's ID if it names one (never
// its secret), bounded to refusalsPerSecond.
func refusalLog(l audit.Appender, log *slog.Logger) func(*http.Request) {
	if l == nil {
		return nil
	}
	var mu sync.Mutex
	var second int64
	var n, suppressed int
	return func(r *http.Request) {
		mu.Lock()
		now := time.Now().Unix()
		if now != second {
			second, n = now, 0
		}
		n++
		if n > refusalsPerSecond {
			suppressed++
			mu.Unlock()
			return
		}
		left := suppressed
		suppressed = 0
		mu.Unlock()
		e := audit.RequestEntry(r, http.StatusUnauthorized)
		e.Error = v1.ErrKindUnauthenticated
		e.Note = "refused: no valid token; remote " + r.RemoteAddr
		if id, ok := tenant.TokenID(strings.TrimSpace(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))); ok {
			e.Note += "; token " + id
		}
		if left > 0 {
			e.Note += fmt.Sprintf("; %d refusals before this one not recorded (over %d a second)", left, refusalsPerSecond)
		}
		if _, err := l.Append(e); err != nil {
			log.Error("audit log: cannot record a refused request", "err", err)
		}
	}
}
