package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/tenant"
)

// tenantEngine holds two tenants' objects: sandbox sbaaa ("alpha") of a
// with checkpoint ckaaa (label l) and effect effa, and sbbbb ("beta") of
// b with ckbbb (label l) and effb.
type tenantEngine struct {
	*fakeEngine
	mu      sync.Mutex
	created v1.SandboxCreateRequest
}

var tenantSandboxes = []meta.Sandbox{{ID: "sbaaa", Name: "alpha", Tenant: "a"}, {ID: "sbbbb", Name: "beta", Tenant: "b"}}

func (e *tenantEngine) Sandboxes() ([]meta.Sandbox, error) { return slices.Clone(tenantSandboxes), nil }
func (e *tenantEngine) Sandbox(ctx context.Context, ref string) (meta.Sandbox, error) {
	for _, sb := range tenantSandboxes {
		if sb.ID == ref {
			return sb, nil
		}
	}
	return e.fakeEngine.Sandbox(ctx, ref)
}

// StoredSandbox: sbstorea of a and sbstoreb of b are in the object store
// only.
func (e *tenantEngine) StoredSandbox(ctx context.Context, id string) (meta.Sandbox, error) {
	switch id {
	case "sbstorea":
		return meta.Sandbox{ID: id, Tenant: "a"}, nil
	case "sbstoreb":
		return meta.Sandbox{ID: id, Tenant: "b"}, nil
	}
	return e.fakeEngine.StoredSandbox(ctx, id)
}
func (e *tenantEngine) Checkpoints(ref string) ([]meta.Checkpoint, error) {
	return []meta.Checkpoint{{ID: "ck" + ref[2:], Sandbox: ref, Label: "l"}}, nil
}
func (e *tenantEngine) EffectSandbox(id string) (string, bool) {
	switch id {
	case "effa":
		return "sbaaa", true
	case "effb":
		return "sbbbb", true
	}
	return "", false
}
func (e *tenantEngine) Create(ctx context.Context, req v1.SandboxCreateRequest) (meta.Sandbox, error) {
	e.mu.Lock()
	e.created = req
	e.mu.Unlock()
	return meta.Sandbox{ID: "new", Tenant: req.Tenant}, nil
}

// tenantServer serves the API to principal pr, as the daemon's token
// listener does.
func tenantServer(t *testing.T, pr tenant.Principal) (*httptest.Server, *tenantEngine, *server) {
	t.Helper()
	e := &tenantEngine{fakeEngine: &fakeEngine{}}
	s, h := newServer(e, fakeLLM{e.fakeEngine}, slog.New(slog.NewTextHandler(io.Discard, nil)), Route{Pattern: "GET /v1/extra", Handler: http.NotFoundHandler()})
	// Every engine call through the fake records the reference it got.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(tenant.With(r.Context(), pr)))
	}))
	t.Cleanup(srv.Close)
	return srv, e, s
}

// path fills a route's pattern with refs.
func path(pattern, id string) (method, p string) {
	method, p, _ = strings.Cut(pattern, " ")
	p = strings.ReplaceAll(p, "{id}", id)
	p = strings.ReplaceAll(p, "{name}", "main")
	return method, p
}

// TestTenantIsolation: over every route, a token of tenant a never
// reaches tenant b's objects, by ID, prefix, name or label (404, as for
// objects that do not exist, and the engine is not called with them);
// the host admin's routes are refused (403); the list shows only a's; a
// sandbox a creates is a's whatever it asks; a's own objects are reached
// by their full IDs.
func TestTenantIsolation(t *testing.T) {
	a := tenant.Principal{Tenant: "a", TokenID: "t1", Scopes: tenant.AllScopes}
	srv, e, s := tenantServer(t, a)
	foreign := map[target][]string{tSandbox: {"sbbbb", "sbb", "beta"}, tCheckpoint: {"ckbbb", "ckb", "beta:l", "sbbbb:l"}, tEffect: {"effb"},
		tStored: {"sbbbb", "sbb", "beta", "sbstoreb", "sbstore"}}
	own := map[target]string{tSandbox: "alpha", tCheckpoint: "sbaaa:l", tEffect: "effa", tStored: "sbstorea"}
	ownID := map[target]string{tSandbox: "sbaaa", tCheckpoint: "ckaaa", tEffect: "effa", tStored: "sbstorea"}
	for _, rt := range s.routes {
		switch rt.policy.target {
		case tAdmin:
			m, p := path(rt.pattern, "sbaaa")
			if ans := call(t, srv, m, p, "{}"); ans.status != http.StatusForbidden || ans.err.Kind != v1.ErrKindPermissionDenied {
				t.Errorf("%s: %d %s, want 403 permission_denied", rt.pattern, ans.status, ans.err.Kind)
			}
		case tSandbox, tCheckpoint, tEffect, tStored:
			for _, ref := range foreign[rt.policy.target] {
				e.fakeEngine.called()
				m, p := path(rt.pattern, ref)
				ans := call(t, srv, m, p, "{}")
				if ans.status != http.StatusNotFound || ans.err.Kind != v1.ErrKindNotFound || leaks(ans.body, ref) {
					t.Errorf("%s with b's %q: %d %q, want 404 not naming b's objects", rt.pattern, ref, ans.status, ans.body)
				}
				if c := e.fakeEngine.called(); len(c) > 0 {
					t.Errorf("%s with b's %q reached the engine: %v", rt.pattern, ref, c)
				}
			}
			m, p := path(rt.pattern, own[rt.policy.target])
			ans := call(t, srv, m, p, "{}")
			if ans.status == http.StatusForbidden || (ans.status == http.StatusNotFound && !strings.Contains(ans.err.Message, ownID[rt.policy.target])) {
				t.Errorf("%s with a's own %q: %d %q, want it to reach the engine with %s", rt.pattern, own[rt.policy.target], ans.status, ans.body, ownID[rt.policy.target])
			}
		case tList:
			var l []v1.Sandbox
			ans := call(t, srv, "GET", "/v1/sandboxes", "")
			if err := json.Unmarshal([]byte(ans.body), &l); err != nil || len(l) != 1 || l[0].ID != "sbaaa" {
				t.Errorf("list: %d %q, want only a's sandbox", ans.status, ans.body)
			}
		case tCreate:
			ans := call(t, srv, "POST", "/v1/sandboxes", `{"image":"img","tenant":"b"}`)
			if ans.status != 200 || e.created.Tenant != "a" {
				t.Errorf("create asking for b: %d, made for %q, want a's", ans.status, e.created.Tenant)
			}
		case tHost:
			m, p := path(rt.pattern, "img")
			if ans := call(t, srv, m, p, ""); ans.status == http.StatusForbidden {
				t.Errorf("%s: 403 for a token", rt.pattern)
			}
		default:
			t.Errorf("%s: no policy target", rt.pattern)
		}
	}
	if len(s.routes) < 39 {
		t.Fatalf("only %d routes checked", len(s.routes))
	}
}

// A token without a scope is refused the routes that need it (403), and
// one limited to some sandboxes reaches only those.
func TestTokenScopes(t *testing.T) {
	ro := tenant.Principal{Tenant: "a", Scopes: []string{tenant.ScopeRead}}
	srv, _, _ := tenantServer(t, ro)
	if ans := call(t, srv, "POST", "/v1/sandboxes/alpha/sessions/main/run", `{"command":"true"}`); ans.status != 403 {
		t.Errorf("read-only token ran a command: %d", ans.status)
	}
	if ans := call(t, srv, "POST", "/v1/sandboxes/alpha/rollback", `{"checkpoint":"l"}`); ans.status != 403 {
		t.Errorf("read-only token rolled back: %d", ans.status)
	}
	if ans := call(t, srv, "GET", "/v1/sandboxes/alpha", ""); ans.status == 403 {
		t.Errorf("read-only token could not read: %d", ans.status)
	}
	none := tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes, Sandboxes: []string{"other"}}
	srv, _, _ = tenantServer(t, none)
	if ans := call(t, srv, "GET", "/v1/sandboxes/alpha", ""); ans.status != 404 {
		t.Errorf("token limited to another sandbox reached alpha: %d", ans.status)
	}
}

// leaks reports whether an answer names one of b's objects the request
// did not name itself.
func leaks(body, ref string) bool {
	for _, id := range []string{"sbbbb", "ckbbb", "beta"} {
		if strings.Contains(body, id) && !strings.Contains(ref, id) {
			return true
		}
	}
	return false
}

// References in a request's body or query (a rollback's target, a
// recovery's, a fork's, effects since) are resolved among the token's
// own checkpoints too: another tenant's is not found, and the engine is
// not called with it; and a tenant cannot open an LLM endpoint on a
// host address.
func TestTenantBodyReferences(t *testing.T) {
	a := tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes}
	srv, e, _ := tenantServer(t, a)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes/alpha/rollback", `{"checkpoint":"ckbbb"}`},
		{"POST", "/v1/sandboxes/alpha/rollback", `{"checkpoint":"beta:l"}`},
		{"POST", "/v1/sandboxes/alpha/recover", `{"to":"ckbbb"}`},
		{"POST", "/v1/sandboxes/alpha/fork", `{"checkpoint":"ckbbb","n":1}`},
		{"GET", "/v1/sandboxes/alpha/effects?since=ckbbb", ""},
	} {
		e.fakeEngine.called()
		ans := call(t, srv, c.method, c.path, c.body)
		if ans.status != 404 || leaks(ans.body, c.body+c.path) {
			t.Errorf("%s %s %s: %d %q, want 404", c.method, c.path, c.body, ans.status, ans.body)
		}
		if got := e.fakeEngine.called(); len(got) > 0 {
			t.Errorf("%s %s %s reached the engine: %v", c.method, c.path, c.body, got)
		}
	}
	if ans := call(t, srv, "PUT", "/v1/sandboxes/alpha/llm", `{"upstream":"http://127.0.0.1:1","listen":"0.0.0.0:9","expose":true}`); ans.status != 403 {
		t.Errorf("a tenant exposed an LLM endpoint: %d %q", ans.status, ans.body)
	}
}

// A tenant's sandbox keeps molt's filter and its limits.
func TestTenantCreateLimits(t *testing.T) {
	srv, _, _ := tenantServer(t, tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes})
	for _, body := range []string{
		`{"image":"img","seccomp":"unconfined"}`,
		`{"image":"img","seccomp_profile":"{}"}`,
		`{"image":"img","resources":{"memory_bytes":-1}}`,
		`{"image":"img","resources":{"pids":-1}}`,
	} {
		if ans := call(t, srv, "POST", "/v1/sandboxes", body); ans.status != 403 {
			t.Errorf("create %s: %d, want 403", body, ans.status)
		}
	}
	if ans := call(t, srv, "POST", "/v1/sandboxes", `{"image":"img","resources":{"memory_bytes":1073741824}}`); ans.status != 200 {
		t.Errorf("create with a limit: %d %q", ans.status, ans.body)
	}
}

// A tenant's compensator runs only in a helper sandbox of its own; HTTP
// compensators (sent from the daemon's network) are the admin's.
func TestTenantCompensators(t *testing.T) {
	srv, e, _ := tenantServer(t, tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes})
	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/v1/sandboxes/alpha/effects", `{"method":"POST","compensator":{"sandbox":"beta","command":["x"]}}`, 404},
		{"/v1/effects/effa/compensator", `{"sandbox":"sbbbb","command":["x"]}`, 404},
		{"/v1/effects/effa/compensator", `{"method":"POST","url":"http://169.254.169.254/"}`, 403},
		{"/v1/sandboxes/alpha/effects", `{"method":"POST","compensator":{"method":"POST","url":"http://127.0.0.1:1/"}}`, 403},
	} {
		e.fakeEngine.called()
		if ans := call(t, srv, "POST", c.path, c.body); ans.status != c.status || leaks(ans.body, c.body) {
			t.Errorf("%s %s: %d %q, want %d", c.path, c.body, ans.status, ans.body, c.status)
		}
		if got := e.fakeEngine.called(); len(got) > 0 {
			t.Errorf("%s %s reached the engine: %v", c.path, c.body, got)
		}
	}
}

// importEngine adds imported checkpoints: ckimpa of tenant a, ckimpb of
// b, belonging to no sandbox; it records the tenant an import is for.
type importEngine struct {
	*tenantEngine
	importedFor chan string
}

func (e *importEngine) ImportedCheckpoints(tenant string) ([]meta.Checkpoint, error) {
	return []meta.Checkpoint{{ID: "ckimp" + tenant, Sandbox: "sbimp" + tenant}}, nil
}

func (e *importEngine) ImportCheckpoint(ctx context.Context, r io.Reader, tenant string) (meta.CheckpointImport, error) {
	e.importedFor <- tenant
	return meta.CheckpointImport{Checkpoint: meta.Checkpoint{ID: "new"}}, nil
}

// An imported checkpoint is its tenant's: a's token reaches a's by ID or
// prefix, never b's, nor a's when limited to some sandboxes; an import
// by a's token is a's whatever the query asks.
func TestTenantImportedCheckpoints(t *testing.T) {
	for _, c := range []struct {
		pr   tenant.Principal
		ref  string
		want int
	}{
		{tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes}, "ckimpa", http.StatusOK},
		{tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes}, "ckimpa"[:5], http.StatusOK},
		{tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes}, "ckimpb", http.StatusNotFound},
		{tenant.Principal{Tenant: "a", Scopes: tenant.AllScopes, Sandboxes: []string{"sbaaa"}}, "ckimpa", http.StatusNotFound},
	} {
		e := &importEngine{tenantEngine: &tenantEngine{fakeEngine: &fakeEngine{}}, importedFor: make(chan string, 1)}
		_, h := newServer(e, fakeLLM{e.fakeEngine}, slog.New(slog.NewTextHandler(io.Discard, nil)))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(tenant.With(r.Context(), c.pr)))
		}))
		ans := call(t, srv, "POST", "/v1/checkpoints/"+c.ref+"/verify", "")
		// Reached: the engine was called with the full ID (the fake
		// answers not found itself).
		reached := slices.Equal(e.fakeEngine.called(), []string{"VerifyCheckpoint"}) && strings.Contains(ans.body, `"ckimpa\"`)
		if reached != (c.want == http.StatusOK) || (!reached && ans.status != http.StatusNotFound) {
			t.Errorf("%+v verify %s: %d %s, reached the engine %v, want %d", c.pr, c.ref, ans.status, ans.body, reached, c.want)
		}
		if len(c.pr.Sandboxes) == 0 {
			if ans := call(t, srv, "POST", "/v1/checkpoints/import?tenant=b", ""); ans.status != 200 {
				t.Errorf("import: %d %s", ans.status, ans.body)
			} else if who := <-e.importedFor; who != "a" {
				t.Errorf("a's token imported for %q", who)
			}
		}
		srv.Close()
	}
}
