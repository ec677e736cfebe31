package client

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

// streamer answers a request that asks for progress with lines, and
// one that does not with plain.
func streamer(t *testing.T, lines []v1.Progress, plain any) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") == "" {
			_ = json.NewEncoder(w).Encode(plain)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, l := range lines {
			_ = enc.Encode(l)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return New(sock)
}

func TestWithProgress(t *testing.T) {
	res, _ := json.Marshal(v1.Sandbox{ID: "a", State: v1.StateHibernated})
	c := streamer(t, []v1.Progress{{Message: "capturing"}, {Message: "storing", Done: 1, Total: 2, Unit: "bytes"}, {Result: res, Status: 200}}, v1.Sandbox{ID: "plain"})
	var got []v1.Progress
	ctx := WithProgress(context.Background(), func(p v1.Progress) { got = append(got, p) })
	sb, err := c.Hibernate(ctx, "a")
	if err != nil || sb.ID != "a" || sb.State != v1.StateHibernated {
		t.Fatalf("hibernate with progress: %+v %v", sb, err)
	}
	if len(got) != 2 || got[1].Done != 1 || got[1].Total != 2 {
		t.Fatalf("reports: %+v", got)
	}
	// Without progress the client does not ask for a stream.
	if sb, err := c.Hibernate(context.Background(), "a"); err != nil || sb.ID != "plain" {
		t.Fatalf("hibernate without progress: %+v %v", sb, err)
	}
	// An error line is the call's error, with its kind and status.
	c = streamer(t, []v1.Progress{{Message: "capturing"}, {Error: &v1.Error{Kind: v1.ErrKindConflict, Message: "busy"}, Status: 409}}, nil)
	_, err = c.Hibernate(ctx, "a")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 409 || ae.Kind != v1.ErrKindConflict {
		t.Fatalf("streamed error: %#v", err)
	}
	// A stream cut before its answer is an error, not an empty result.
	c = streamer(t, []v1.Progress{{Message: "capturing"}}, nil)
	if _, err := c.Hibernate(ctx, "a"); err == nil {
		t.Fatal("a stream without an answer succeeded")
	}
}
