package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/coord"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/testutil"
)

// openServer serves the API of a fresh Manager (a loop pool, no image, no
// sandbox): every case of testBadInput must be refused before the daemon looks
// anything up, so an answer other than the refusal (such as 404 for the
// missing sandbox) shows the request got past the check.
func openServer(t *testing.T) *httptest.Server {
	t.Helper()
	testutil.RequireRoot(t)
	m, err := core.Open(context.Background(), core.Config{Root: t.TempDir(), PoolSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		if err := m.Pool().Unmount(); err != nil {
			t.Errorf("unmount pool: %v", err)
		}
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	co := coord.New(m, log)
	t.Cleanup(co.Close)
	srv := httptest.NewServer(Handler(m, co, log))
	t.Cleanup(srv.Close)
	return srv
}

// bothServers runs test against the fake engine (always) and against a
// fresh core.Manager (as root): the checks are the handlers', and the real
// engine must answer the requests they let through the same way.
func bothServers(t *testing.T, test func(t *testing.T, srv *httptest.Server, real bool)) {
	t.Run("fake", func(t *testing.T) {
		srv, _ := fakeServer(t)
		test(t, srv, false)
	})
	t.Run("core", func(t *testing.T) { test(t, openServer(t), true) })
}

type answer struct {
	status int
	header http.Header
	body   string
	err    v1.Error
}

func call(t *testing.T, srv *httptest.Server, method, path, body string) answer {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b)}
	_ = json.Unmarshal(b, &a.err)
	return a
}

func TestBadInput(t *testing.T) { bothServers(t, testBadInput) }

// The llm cases are coord's checks: the fake has no coordinator.
func testBadInput(t *testing.T, srv *httptest.Server, real bool) {
	cases := []struct {
		name, method, path, body string
		want                     string // in the message
	}{
		{"fork n=0", "POST", "/v1/sandboxes/nosuch/fork", `{"n":0}`, "n=0"},
		{"fork n<0", "POST", "/v1/checkpoints/nosuch/fork", `{"n":-3}`, "n=-3"},
		{"fork n too large", "POST", "/v1/sandboxes/nosuch/fork", `{"n":1000000}`, "n=1000000"},
		{"create env key with =", "POST", "/v1/sandboxes", `{"image":"nosuch","env":{"A=B":"c"}}`, "'='"},
		{"create env key with NUL", "POST", "/v1/sandboxes", `{"image":"nosuch","env":{"A\u0000B":"c"}}`, "NUL"},
		{"create env empty key", "POST", "/v1/sandboxes", `{"image":"nosuch","env":{"":"c"}}`, "empty"},
		{"create env value with NUL", "POST", "/v1/sandboxes", `{"image":"nosuch","env":{"A":"b\u0000c"}}`, "NUL"},
		{"exec env key with =", "POST", "/v1/sandboxes/nosuch/exec", `{"args":["true"],"detach":true,"env":{"PATH=/evil:":"x"}}`, "'='"},
		{"exec env value with NUL", "POST", "/v1/sandboxes/nosuch/exec", `{"args":["true"],"detach":true,"env":{"A":"\u0000"}}`, "NUL"},
		{"exec arg with NUL", "POST", "/v1/sandboxes/nosuch/exec", `{"args":["tr\u0000ue"],"detach":true}`, "NUL"},
		{"session close bad name", "DELETE", "/v1/sandboxes/nosuch/sessions/.x", ``, "session name"},
		{"session close name with space", "DELETE", "/v1/sandboxes/nosuch/sessions/a%20b", ``, "session name"},
		{"trailing data", "POST", "/v1/sandboxes", `{"image":"nosuch"} {"image":"other"}`, "data after"},
		{"trailing garbage", "POST", "/v1/sandboxes/nosuch/rollback", `{"checkpoint":"x"}]`, "data after"},
		{"unknown field", "POST", "/v1/sandboxes", `{"image":"nosuch","imag":"x"}`, "unknown field"},
		{"image build bad name", "POST", "/v1/images/build", `{"name":"../x"}`, "image name"},
		{"image build no name", "POST", "/v1/images/build", ``, "image name"},
		{"image build bad suite", "POST", "/v1/images/build", `{"name":"x","suite":"../bookworm"}`, "suite"},
		{"image build bad package", "POST", "/v1/images/build", `{"name":"x","packages":["--no-check-gpg"]}`, "package"},
		{"llm on every interface", "PUT", "/v1/sandboxes/nosuch/llm", `{"upstream":"http://127.0.0.1:1","listen":"0.0.0.0:0"}`, "not loopback"},
		{"llm on a host name", "PUT", "/v1/sandboxes/nosuch/llm", `{"upstream":"http://127.0.0.1:1","listen":"example.com:8080"}`, "not loopback"},
		{"image build bad mirror", "POST", "/v1/images/build", `{"name":"x","mirror":"ftp://m"}`, "mirror"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if strings.HasPrefix(c.name, "llm ") && !real {
				t.Skip("the fake has no coordinator")
			}
			a := call(t, srv, c.method, c.path, c.body)
			if a.status != http.StatusBadRequest || a.err.Kind != "invalid_argument" || !strings.Contains(a.err.Message, c.want) {
				t.Fatalf("%s %s %s: %d %s; want 400 invalid_argument mentioning %q", c.method, c.path, c.body, a.status, a.body, c.want)
			}
		})
	}
	// What the checks must let through reaches the daemon's lookups.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes/nosuch/fork", ``},          // no body: one fork
		{"POST", "/v1/sandboxes/nosuch/fork", `{}`},        // no "n": one fork
		{"POST", "/v1/checkpoints/nosuch/fork", `{"n":3}`}, // a count
		{"POST", "/v1/sandboxes", `{"image":"nosuch","env":{"A":"b=c"}}` + "\n\t "},
		{"DELETE", "/v1/sandboxes/nosuch/sessions/main", ``},
		{"PUT", "/v1/sandboxes/nosuch/llm", `{"upstream":"http://127.0.0.1:1","listen":"0.0.0.0:0","expose":true}`},
		{"PUT", "/v1/sandboxes/nosuch/llm", `{"upstream":"http://127.0.0.1:1","listen":"127.0.0.1:0"}`},
	} {
		if a := call(t, srv, c.method, c.path, c.body); a.status != http.StatusNotFound {
			t.Errorf("%s %s %s: %d %s; want 404 for the missing sandbox, image or checkpoint", c.method, c.path, c.body, a.status, a.body)
		}
	}
}

func TestMethodNotAllowed(t *testing.T) { bothServers(t, testMethodNotAllowed) }

func testMethodNotAllowed(t *testing.T, srv *httptest.Server, _ bool) {
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/sandboxes/x/fork", "POST"},
		{"PUT", "/v1/sandboxes", "GET, HEAD, POST"},
		{"POST", "/v1/checkpoints/x", "DELETE, GET, HEAD"},
		{"DELETE", "/v1/host", "GET, HEAD"},
	} {
		a := call(t, srv, c.method, c.path, "")
		if a.status != http.StatusMethodNotAllowed || a.err.Kind != "method_not_allowed" {
			t.Errorf("%s %s: %d %s; want 405 method_not_allowed", c.method, c.path, a.status, a.body)
			continue
		}
		if got := a.header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
		if ct := a.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.path, ct)
		}
	}
	// A path no method has is still 404 with the JSON body.
	if a := call(t, srv, "GET", "/v1/nosuch", ""); a.status != http.StatusNotFound || a.err.Kind != "not_found" {
		t.Errorf("GET /v1/nosuch: %d %s; want 404 not_found", a.status, a.body)
	}
}
