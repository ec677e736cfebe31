package daemon

import (
	"log/slog"
	"net/http"
	"os"
	"testing"

	"github.com/molt-sh/molt/internal/audit"
	"github.com/molt-sh/molt/internal/webui"
)

// TestWebUIAudited: the web view's API calls reach the daemon's audited
// API as the daemon itself, marked webui; the view's audit-log route is
// not one of them.
func TestWebUIAudited(t *testing.T) {
	l, err := openAudit(t.TempDir(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	api := auditedAPI(stubEngine{}, nil, l, slog.Default())
	s, err := webui.Start(webui.Config{Addr: "127.0.0.1:0", API: api, Source: stubEngine{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for path, want := range map[string]int{"/api/v1/host": 200, "/api/v1/audit": 404} {
		req, _ := http.NewRequest("GET", "http://"+s.Addr()+path, nil)
		req.Header.Set(webui.Header, s.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	es := entries(t, serve(t, api))
	me := audit.Actor{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), PID: int32(os.Getpid()), Token: "webui"}
	if len(es) < 1 || es[0].Route != "GET /v1/host" || es[0].Actor == nil || *es[0].Actor != me {
		t.Fatalf("entries %+v, want GET /v1/host by %+v first", es, me)
	}
}
