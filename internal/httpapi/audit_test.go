package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
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

// TestAuditedExec: through the audit middleware the exec handler still
// upgrades and relays (the middleware's writer hijacks), and the exec is
// in the log, status 101, before the stream ends.
func TestAuditedExec(t *testing.T) {
	l, err := audit.Open(t.TempDir(), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f := &fakeEngine{}
	sock := filepath.Join(t.TempDir(), "molt.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(audit.Middleware(l, Handler(f, fakeLLM{f}, nil), func(err error) { t.Error(err) }))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	var during audit.Head
	frames := make(chan string, 16)
	f.exec = func(ref string, req v1.ExecRequest) (int, net.Conn, error) {
		d, i := net.Pipe()
		go fakeInit(t, i, frames, false)
		return 0, d, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout strings.Builder
	st, err := client.New(sock).Exec(ctx, "sb-9", v1.ExecRequest{Args: []string{"cat"}}, client.ExecIO{
		Stdin: readerFunc(func(p []byte) (int, error) {
			if during.Seq == 0 {
				during = l.Head()
				return copy(p, "hi\n"), nil
			}
			return 0, io.EOF
		}), Stdout: &stdout})
	if err != nil || st.ExitCode != 3 || stdout.String() != "out:hi\n" {
		t.Fatalf("exec through the middleware: %+v %q %v", st, stdout.String(), err)
	}
	if during.Seq != 1 {
		t.Fatalf("the exec was not in the log while it ran (head %v)", during)
	}
	var buf strings.Builder
	if err := l.Export(&buf, 0); err != nil {
		t.Fatal(err)
	}
	var e audit.Entry
	if err := json.Unmarshal([]byte(buf.String()), &e); err != nil {
		t.Fatal(err)
	}
	if e.Status != 101 || e.Route != "POST /v1/sandboxes/{id}/exec" || e.Sandbox != "sb-9" {
		t.Fatalf("entry %+v", e)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestAuditStreamedOutcome: a streamed answer's status is 200 from its
// first byte, but the audit entry records how the request ended: the
// status and error kind of its last line.
func TestAuditStreamedOutcome(t *testing.T) {
	l, err := audit.Open(t.TempDir(), audit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f := &fakeEngine{}
	srv := httptest.NewServer(audit.Middleware(l, Handler(f, fakeLLM{f}, nil), func(err error) { t.Error(err) }))
	defer srv.Close()
	for _, id := range []string{"nope", "reports"} {
		progressLines(t, post(t, srv.URL+"/v1/sandboxes/"+id+"/hibernate", ndjson))
	}
	var buf strings.Builder
	if err := l.Export(&buf, 0); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var e audit.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d %s", e.Status, e.Error))
	}
	if want := []string{"404 " + v1.ErrKindNotFound, "200 "}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("audit of streamed requests: %q, want %q", got, want)
	}
}
