package audit

import (
	"bufio"
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestHijackLoggedAtStart: a streaming exec is logged when its
// connection is upgraded, while the stream still runs.
func TestHijackLoggedAtStart(t *testing.T) {
	l, _ := fill(t, 0)
	defer l.Close()
	seen := make(chan Head, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		c, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		seen <- l.Head() // the stream runs here
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n")
		rw.Flush()
	})
	srv := httptest.NewServer(WithActorMiddleware(Middleware(l, mux, func(err error) { t.Error(err) })))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/sandboxes/sb-1/exec", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if h := <-seen; h.Seq != 1 {
		t.Fatalf("nothing logged when the stream started (head %v)", h)
	}
	var buf bytes.Buffer
	if err := l.Export(&buf, 0); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	var n int
	for sc.Scan() {
		e, err := decode(sc.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		n++
		if e.Status != http.StatusSwitchingProtocols || e.Route != "POST /v1/sandboxes/{id}/exec" || e.Sandbox != "sb-1" ||
			e.Actor == nil || e.Actor.PID != 42 {
			t.Fatalf("entry %+v", e)
		}
	}
	if n != 1 {
		t.Fatalf("%d entries, want 1", n)
	}
}

// WithActorMiddleware stands for the daemon's per-connection actor.
func WithActorMiddleware(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(WithActor(r.Context(), Actor{UID: 1, GID: 1, PID: 42})))
	})
}

func TestExportSince(t *testing.T) {
	l, _ := fill(t, 6)
	defer l.Close()
	var buf bytes.Buffer
	if err := l.Export(&buf, 4); err != nil {
		t.Fatal(err)
	}
	r := Verify(&buf, nil)
	if !r.OK || !r.Partial || r.FirstSeq != 5 || r.Entries != 2 || r.Head != l.Head() {
		t.Fatalf("%+v", r)
	}
}
