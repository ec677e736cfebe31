package objstore

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
)

// TestS3HostileServer: answers no S3 server gives, from a server that
// lies, are errors (or, for keys no Bucket can name, skipped), never
// data passed on as the object's.
func TestS3HostileServer(t *testing.T) {
	var listing string // the keys of the listings' answers
	var get func(w http.ResponseWriter, r *http.Request)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("list-type") {
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>b</Name><IsTruncated>false</IsTruncated>%s</ListBucketResult>`, listing)
			return
		}
		w.Header().Set("Last-Modified", "Wed, 02 Dec 2026 14:00:00 GMT")
		get(w, r)
	}))
	defer srv.Close()
	b, err := OpenS3(t.Context(), "s3://bucket/p", S3Options{Endpoint: srv.URL, Creds: &Credentials{AccessKey: "k", SecretKey: "s"}})
	if err != nil {
		t.Fatal(err)
	}
	body := strings.Repeat("x", 100)
	for name, c := range map[string]struct {
		off, length int64
		answer      func(w http.ResponseWriter, r *http.Request)
	}{
		"range ignored": {10, 5, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) }},
		"other range": {10, 5, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Range", "bytes 0-4/100")
			w.WriteHeader(http.StatusPartialContent)
			io.WriteString(w, body[:5])
		}},
		"range longer than its bytes": {10, 5, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Range", "bytes 10-19/100")
			w.WriteHeader(http.StatusPartialContent)
			io.WriteString(w, body[:5])
		}},
		"no length": {0, -1, func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush() // chunked: no Content-Length
			io.WriteString(w, body)
		}},
		"short body": {0, -1, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "100")
			io.WriteString(w, body[:50])
		}},
	} {
		get = c.answer
		r, err := b.Get(t.Context(), "k", c.off, c.length)
		if err == nil {
			_, err = io.ReadAll(r)
			r.Close()
		}
		if err == nil {
			t.Errorf("%s: no error", name)
		}
		t.Logf("%s: %v", name, err)
	}

	listing = `<Contents><Key>p/a</Key></Contents><Contents><Key>p/a//b</Key></Contents><Contents><Key>p/../x</Key></Contents>`
	if keys, err := b.List(t.Context(), ""); err != nil || fmt.Sprint(keys) != "[a]" {
		t.Errorf("list with keys no Bucket can name: %q, %v; want [a]", keys, err)
	}
	listing = `<Contents><Key>q/a</Key></Contents>`
	if keys, err := b.List(t.Context(), ""); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("list with a key outside the prefix: %q, %v", keys, err)
	}
	listing = `<Contents><Key>p/b</Key></Contents>`
	if keys, err := b.List(t.Context(), "a"); err == nil {
		t.Errorf("list a with a key outside it: %q, %v", keys, err)
	}
}
