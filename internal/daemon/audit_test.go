package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/httpapi"
	"github.com/molt-sh/molt/internal/meta"
)

// stubEngine answers the two calls these tests make; any other panics.
type stubEngine struct{ httpapi.Engine }

func (stubEngine) Host() meta.Host              { return meta.Host{Version: "test"} }
func (stubEngine) MetricsHandler() http.Handler { return http.NotFoundHandler() }
func (stubEngine) Stop(_ context.Context, ref string) (meta.Sandbox, error) {
	return meta.Sandbox{ID: ref}, nil
}
func (stubEngine) Sandbox(_ context.Context, ref string) (meta.Sandbox, error) {
	return meta.Sandbox{}, fmt.Errorf("sandbox %q: %w", ref, errdefs.ErrNotFound)
}

// serve serves h on a real socket the way Run does (SO_PEERCRED checked
// and handed to the requests) and returns a client of it.
func serve(t testing.TB, h http.Handler) *client.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "molt.sock")
	ln, err := ListenAccess(sock, SocketAccess{Group: -1, UIDs: []int{os.Getuid()}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ConnContext: peerContext, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return client.New(sock)
}

func entries(t *testing.T, c *client.Client) []audit.Entry {
	t.Helper()
	var buf bytes.Buffer
	if err := c.AuditExport(context.Background(), 0, &buf); err != nil {
		t.Fatal(err)
	}
	var out []audit.Entry
	dec := json.NewDecoder(&buf)
	for dec.More() {
		var e audit.Entry
		if err := dec.Decode(&e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

// TestAPIRequestsAudited: a request that succeeds and one that fails
// each leave an entry naming the socket peer, the route, the sandbox and
// the status; the log verifies through the API.
func TestAPIRequestsAudited(t *testing.T) {
	dir := t.TempDir()
	l, err := openAudit(dir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := serve(t, auditedAPI(stubEngine{}, nil, l, slog.Default()))
	ctx := context.Background()
	if _, err := c.Host(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sandbox(ctx, "sb-nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("want not found, got %v", err)
	}
	resp, err := c.AuditVerify(ctx)
	if err != nil || !resp.OK || resp.Entries != 2 {
		t.Fatalf("verify: %+v %v", resp, err)
	}
	es := entries(t, c)
	if len(es) != 3 { // host, sandbox, verify (the export is logged after it)
		t.Fatalf("%d entries: %+v", len(es), es)
	}
	me := audit.Actor{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), PID: int32(os.Getpid())}
	want := []struct {
		route, sandbox, errKind string
		status                  int
	}{
		{"GET /v1/host", "", "", 200},
		{"GET /v1/sandboxes/{id}", "sb-nope", "not_found", 404},
		{"POST /v1/audit/verify", "", "", 200},
	}
	for i, w := range want {
		e := es[i]
		if e.Kind != audit.KindAPI || e.Actor == nil || *e.Actor != me || e.Route != w.route || e.Sandbox != w.sandbox ||
			e.Status != w.status || e.Error != w.errKind || e.Seq != uint64(i+1) {
			t.Errorf("entry %d: %+v (actor %+v), want %+v by %+v", i+1, e, e.Actor, w, me)
		}
	}
}

// BenchmarkAPIAudit: API calls over the daemon's socket, without and
// with the audit middleware: GET /v1/host (its entry written, synced by
// the group commit) and POST /v1/sandboxes/{id}/stop against a stub
// engine (its entry on disk before the answer), one client and 8 at once.
func BenchmarkAPIAudit(b *testing.B) {
	plain := httpapi.Handler(stubEngine{}, nil, slog.Default())
	l, err := audit.Open(b.TempDir(), audit.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	audited := auditedAPI(stubEngine{}, nil, l, slog.Default())
	calls := []struct {
		name string
		call func(context.Context, *client.Client) error
	}{
		{"GET-host", func(ctx context.Context, c *client.Client) error { _, err := c.Host(ctx); return err }},
		{"POST-stop", func(ctx context.Context, c *client.Client) error { _, err := c.Stop(ctx, "sb-1"); return err }},
	}
	for _, call := range calls {
		for _, bc := range []struct {
			name string
			h    http.Handler
		}{{"plain", plain}, {"audited", audited}} {
			b.Run(call.name+"/"+bc.name, func(b *testing.B) {
				c := serve(b, bc.h)
				ctx := context.Background()
				for b.Loop() {
					if err := call.call(ctx, c); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(call.name+"/"+bc.name+"-x8", func(b *testing.B) {
				c := serve(b, bc.h)
				ctx := context.Background()
				b.SetParallelism(4) // 8 clients on 2 CPUs
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := call.call(ctx, c); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// TestLedgerRecordsAudited: the hook the daemon gives the effect ledger
// records each record's ID, sandbox, kind, state, method, host and path,
// and not its query.
func TestLedgerRecordsAudited(t *testing.T) {
	l, err := openAudit(t.TempDir(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	led, err := ledger.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close()
	led.OnAppend(auditLedger(l, slog.Default()))
	r, err := led.Begin("sb-1", ledger.Record{Kind: ledger.Effect, Request: ledger.Identity{Proto: "https", Method: "POST", URL: "https://pay.example/charge?token=SECRET"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := led.Finish("sb-1", r.ID, ledger.Completed, &ledger.Response{Status: 200}, ""); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := l.Export(&buf, 0); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(buf.Bytes(), []byte("SECRET")) {
		t.Fatalf("the query reached the audit log: %s", buf.Bytes())
	}
	dec := json.NewDecoder(&buf)
	for i, state := range []string{"pending", "completed"} {
		var e audit.Entry
		if err := dec.Decode(&e); err != nil {
			t.Fatal(err)
		}
		if e.Kind != audit.KindEffect || e.Effect != r.ID || e.Sandbox != "sb-1" || e.EffectKind != "effect" || e.State != state ||
			e.Method != "POST" || e.Host != "pay.example" || e.URLPath != "/charge" {
			t.Errorf("entry %d: %+v", i+1, e)
		}
	}
	if rep, err := l.Verify(); err != nil || !rep.OK || rep.Entries != 2 {
		t.Fatalf("%+v %v", rep, err)
	}
}
