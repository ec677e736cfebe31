package httpapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/audit"
)

// TestAuditRoutes: the audit endpoints answer as the others do: a bad
// since is 400, another method 405 with Allow, and verify reports the
// log's head.
func TestAuditRoutes(t *testing.T) {
	l, err := audit.Open(t.TempDir(), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 3; i++ {
		if _, err := l.Append(audit.Entry{Kind: audit.KindAPI, Route: "GET /v1/host", Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	f := &fakeEngine{}
	srv := httptest.NewServer(Handler(f, fakeLLM{f}, slog.New(slog.NewTextHandler(io.Discard, nil)), AuditRoutes(l)...))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/v1/audit?since=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Count(string(body), "\n") != 2 || !strings.HasPrefix(string(body), `{"seq":2,`) {
		t.Fatalf("export since 1: %d %s", resp.StatusCode, body)
	}
	for _, c := range []struct {
		method, path string
		status       int
		kind         string
	}{
		{"GET", "/v1/audit?since=x", 400, v1.ErrKindInvalidArgument},
		{"DELETE", "/v1/audit", 405, v1.ErrKindMethodNotAllowed},
		{"GET", "/v1/audit/verify", 405, v1.ErrKindMethodNotAllowed},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e v1.Error
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || e.Kind != c.kind {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, resp.StatusCode, e.Kind, c.status, c.kind)
		}
	}
	resp, err = http.Post(srv.URL+"/v1/audit/verify", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var res v1.AuditVerifyResult
	_ = json.NewDecoder(resp.Body).Decode(&res)
	resp.Body.Close()
	if !res.OK || res.Entries != 3 || res.Head.Seq != 3 || res.Head.Hash != l.Head().Hash || res.File != l.Path() {
		t.Fatalf("verify: %+v", res)
	}
}
