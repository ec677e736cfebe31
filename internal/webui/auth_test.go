package webui

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/tenant"
)

// emptySource is an engine with nothing in it: these tests are of the
// web view's own checks, which run before anything reaches the engine.
type emptySource struct{}

func (emptySource) Sandboxes() ([]meta.Sandbox, error)            { return nil, nil }
func (emptySource) Checkpoints(string) ([]meta.Checkpoint, error) { return nil, nil }
func (emptySource) Turns(string) ([]meta.TurnRecord, error)       { return nil, nil }
func (emptySource) Effects(context.Context, string, string) ([]ledger.Record, map[string]bool, error) {
	return nil, nil, nil
}

func TestAddrLoopbackOnly(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, "[::1]:0": true, "localhost:0": true, "0.0.0.0:0": false, ":0": false, "10.1.2.3:80": false, "nope": false} {
		if err := CheckAddr(addr, false); (err == nil) != ok {
			t.Errorf("CheckAddr(%q) = %v", addr, err)
		}
	}
	if err := CheckAddr("0.0.0.0:0", true); err != nil {
		t.Errorf("--ui-expose: %v", err)
	}
	if _, err := Start(Config{Addr: "0.0.0.0:0", API: http.NotFoundHandler(), Source: emptySource{}}); err == nil {
		t.Error("Start served a wildcard address without Expose")
	}
}

// TestAuth checks the token, the CSRF checks and the route allowlist
// against a handler that records what reaches it.
func TestAuth(t *testing.T) {
	var reached []string
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tenant.Of(r.Context()).Admin || r.Header.Get(Header) != "" {
			t.Errorf("%s %s reached the API without the admin principal or with the token", r.Method, r.URL.Path)
		}
		reached = append(reached, r.Method+" "+r.URL.Path)
		io.WriteString(w, "[]")
	})
	s, err := Start(Config{Addr: "127.0.0.1:0", API: api, Source: emptySource{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := "http://" + s.Addr()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader("{}"))
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
			}
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := do("GET", "/?token="+s.token, nil)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/#token="+s.token || len(resp.Cookies()) != 0 {
		t.Fatalf("GET /?token=: %d %q %v, want 303 to /#token=, no cookie", resp.StatusCode, resp.Header.Get("Location"), resp.Cookies())
	}
	tok := map[string]string{Header: s.token}
	same := map[string]string{Header: s.token, "Origin": base}
	checks := []struct {
		method, path string
		hdr          map[string]string
		want         int
	}{
		{"GET", "/?token=wrong", nil, 401},
		{"GET", "/", nil, 200}, // the page: no data in it
		{"GET", "/static/app.js", nil, 200},
		{"GET", "/events", nil, 401},
		{"GET", "/api/v1/sandboxes", nil, 401},
		{"GET", "/api/v1/sandboxes", map[string]string{Header: "wrong"}, 401},
		{"GET", "/api/v1/sandboxes", map[string]string{"Cookie": "molt_ui=" + s.token}, 401},
		{"GET", "/api/v1/sandboxes", tok, 200},
		{"POST", "/api/v1/sandboxes/x/rollback", same, 200},
		{"POST", "/api/v1/sandboxes/x/rollback", map[string]string{"Origin": base}, 401},
		{"POST", "/api/v1/sandboxes/x/rollback", map[string]string{Header: s.token, "Origin": "http://evil.example"}, 403},
		{"POST", "/api/v1/sandboxes/x/rollback", tok, 403},
		{"DELETE", "/api/v1/sandboxes/x", map[string]string{Header: s.token, "Origin": "null"}, 403},
		{"POST", "/api/v1/sandboxes/x/exec", same, 404},                                                  // not a route the page uses
		{"POST", "/api/v1/sandboxes", same, 405},                                                         // nor is create
		{"GET", "/api/v1/sandboxes", map[string]string{Header: s.token, "Host": "evil.example:80"}, 403}, // DNS rebinding
	}
	for _, c := range checks {
		if got := do(c.method, c.path, c.hdr).StatusCode; got != c.want {
			t.Errorf("%s %s %v: %d, want %d", c.method, c.path, c.hdr, got, c.want)
		}
	}
	want := []string{"GET /v1/sandboxes", "POST /v1/sandboxes/x/rollback"}
	if strings.Join(reached, ",") != strings.Join(want, ",") {
		t.Errorf("reached the API: %v, want %v", reached, want)
	}
}
