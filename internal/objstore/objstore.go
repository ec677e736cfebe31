// Package objstore is molt's view of an object store: a flat namespace
// of immutable objects under one prefix of one bucket, written whole,
// read whole or by byte range, listed by prefix and deleted. Its only
// production implementation is S3 (any S3-compatible server); Dir keeps
// objects as files and is for tests of the layers above and for a store
// on a shared filesystem.
//
// Keys are relative, slash-separated, clean paths (ValidKey): the
// layers above build them from hashes and IDs they checked, and a
// Bucket refuses any other with errdefs.ErrInvalidArgument. A missing
// object is fs.ErrNotExist, whatever the server said.
package objstore

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Bucket is an object store under one prefix.
type Bucket interface {
	// Put stores the size bytes of r as object key, replacing any
	// object of that key at once: a reader sees the old object or the
	// new one, never part of either.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get reads length bytes of object key from off; length < 0 reads
	// to the end. Reading past the end is an error.
	Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)
	// Stat reports the size of object key.
	Stat(ctx context.Context, key string) (int64, error)
	// List returns the keys under prefix (a key prefix, "" for all), in
	// lexical order.
	List(ctx context.Context, prefix string) ([]string, error)
	// Delete removes object key; a missing one is no error.
	Delete(ctx context.Context, key string) error
	// ReadVersion reads object key whole, refusing one of more than max
	// bytes, with its version: the name the store gives that content of
	// the object (an S3 ETag), which PutIf compares.
	ReadVersion(ctx context.Context, key string, max int64) ([]byte, string, error)
	// PutIf stores data as object key if the object is still at
	// version, or, with version "", if there is no object key: the
	// check and the write are one step for every writer of the store,
	// on every host. Otherwise it stores nothing and fails with
	// ErrChanged. It is for the small documents several hosts change
	// (who owns a sandbox, who runs a collection).
	PutIf(ctx context.Context, key string, data []byte, version string) error
	// Stats reports the requests and bytes moved so far.
	Stats() Stats
	// String names the bucket for messages (never with credentials).
	String() string
}

// ErrChanged fails a PutIf whose object is no longer at the version
// given (another writer changed it, made it, or removed it).
var ErrChanged = fmt.Errorf("the object changed since it was read: %w", errdefs.ErrConflict)

// MaxConditional bounds what PutIf stores: one request, no multipart.
const MaxConditional = 4 << 20

// Stats counts a bucket's traffic.
type Stats struct {
	Requests int64 `json:"requests"`
	Sent     int64 `json:"sent_bytes"`
	Received int64 `json:"received_bytes"`
}

// counter is a Bucket's Stats, safe for concurrent use.
type counter struct {
	requests, sent, received atomic.Int64
}

func (c *counter) Stats() Stats {
	return Stats{Requests: c.requests.Load(), Sent: c.sent.Load(), Received: c.received.Load()}
}

// countingReader counts bytes read into n.
type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (r countingReader) Read(p []byte) (int, error) {
	k, err := r.ReadCloser.Read(p)
	r.n.Add(int64(k))
	return k, err
}

// MaxKey bounds a key's length (S3's limit is 1024 bytes, with the
// prefix).
const MaxKey = 512

// ValidKey reports whether key is a relative, clean, slash-separated
// path of printable ASCII without empty, "." or ".." elements.
func ValidKey(key string) bool {
	if key == "" || len(key) > MaxKey {
		return false
	}
	for _, c := range []byte(key) {
		if c <= ' ' || c >= 0x7f || c == '\\' {
			return false
		}
	}
	for _, e := range strings.Split(key, "/") {
		if e == "" || e == "." || e == ".." {
			return false
		}
	}
	return true
}

func badKey(key string) error {
	return fmt.Errorf("object key %q is not a clean relative path: %w", key, errdefs.ErrInvalidArgument)
}

// conditional checks what a PutIf of data as key may store, and ctx.
func conditional(ctx context.Context, key string, data []byte) error {
	if len(data) > MaxConditional {
		return fmt.Errorf("put %s: %d bytes, a conditional put holds %d at most: %w", key, len(data), MaxConditional, errdefs.ErrInvalidArgument)
	}
	return ctx.Err()
}
