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

// serve answers every request with status and body on a unix socket.
func serve(t *testing.T, status int, body any) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return New(sock)
}

func TestErrorKindsSurviveTheWire(t *testing.T) {
	for kind, sentinel := range kinds {
		c := serve(t, 418, v1.Error{Kind: kind, Message: "sandbox x: " + kind})
		_, err := c.Sandbox(context.Background(), "x")
		if !errors.Is(err, sentinel) {
			t.Errorf("kind %s: errors.Is(%v, %v) is false", kind, err, sentinel)
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 418 || ae.Message != "sandbox x: "+kind {
			t.Errorf("kind %s: %#v", kind, err)
		}
	}
}

func TestNonJSONErrorIsReadable(t *testing.T) {
	c := serve(t, 502, "bad gateway")
	_, err := c.Host(context.Background())
	if err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("got %v", err)
	}
}

func TestNoDaemon(t *testing.T) {
	c := New(filepath.Join(t.TempDir(), "missing.sock"))
	if _, err := c.Host(context.Background()); err == nil {
		t.Fatal("no error without a daemon")
	}
}
