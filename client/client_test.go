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

// Every wire kind comes back as the sentinel the daemon's engine wrapped:
// api/v1's value, under the client's name and under api/v1's.
func TestErrorKindsSurviveTheWire(t *testing.T) {
	for _, c := range []struct {
		kind           string
		client, shared error
	}{
		{v1.ErrKindNotFound, ErrNotFound, v1.ErrNotFound},
		{v1.ErrKindAlreadyExists, ErrAlreadyExists, v1.ErrAlreadyExists},
		{v1.ErrKindInvalidArgument, ErrInvalidArgument, v1.ErrInvalidArgument},
		{v1.ErrKindFailedPrecondition, ErrFailedPrecondition, v1.ErrFailedPrecondition},
		{v1.ErrKindUnavailable, ErrUnavailable, v1.ErrUnavailable},
		{v1.ErrKindNotSupported, ErrNotSupported, v1.ErrNotSupported},
		{v1.ErrKindResourceExhausted, ErrResourceExhausted, v1.ErrResourceExhausted},
		// A request the daemon has no such method for is a caller's mistake.
		{v1.ErrKindMethodNotAllowed, ErrInvalidArgument, v1.ErrInvalidArgument},
	} {
		cl := serve(t, 418, v1.Error{Kind: c.kind, Message: "sandbox x: " + c.kind})
		_, err := cl.Sandbox(context.Background(), "x")
		if !errors.Is(err, c.client) || !errors.Is(err, c.shared) {
			t.Errorf("kind %s: errors.Is(%v, %v) is false", c.kind, err, c.client)
		}
		var ae *APIError
		if !errors.As(err, &ae) || ae.Status != 418 || ae.Message != "sandbox x: "+c.kind {
			t.Errorf("kind %s: %#v", c.kind, err)
		}
	}
	// An internal error, or a kind this client does not know, is no kind.
	for _, kind := range []string{v1.ErrKindInternal, "from_the_future"} {
		_, err := serve(t, 500, v1.Error{Kind: kind, Message: "boom"}).Sandbox(context.Background(), "x")
		var ae *APIError
		if !errors.As(err, &ae) || ae.Kind != kind || errors.Unwrap(err) != nil {
			t.Errorf("kind %s: %#v wraps %v", kind, err, errors.Unwrap(err))
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
