// Package s3test runs the S3 server of package s3server for a test.
package s3test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/molt-sh/molt/internal/objstore"
	"github.com/molt-sh/molt/internal/objstore/s3server"
	"github.com/molt-sh/molt/internal/testutil"
)

// Start starts a server for t, with its data in a t.TempDir(), and
// stops it at t's cleanup, failing t if it had died. Without the
// server's binary it skips t with the command that builds it, or fails
// it under MOLT_REQUIRE_PRIVILEGED=1 (`make test`, which builds it
// first). On failure, the tail of the server's log is printed.
func Start(t testing.TB) Server {
	t.Helper()
	if _, err := s3server.Binary(); err != nil {
		testutil.Unavailable(t, fmt.Sprintf("%v: build it with `%s` (or `make deps`) from the repository's root", err, s3server.BuildCommand))
	}
	p, err := s3server.StartProcess(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("%v; its log ends with:\n%s", err, p.LogTail(4096))
		} else if t.Failed() {
			t.Logf("the S3 server's log ends with:\n%s", p.LogTail(4096))
		}
	})
	return Server{p.Server}
}

// Server is a running server for a test.
type Server struct{ s3server.Server }

var prefixes atomic.Int64

// OpenBucket opens the server's bucket under a prefix of its own for t,
// named after the test: "" is a prefix never used before, anything
// else is taken as is.
func (s Server) OpenBucket(t testing.TB, prefix string) *objstore.S3 {
	t.Helper()
	if prefix == "" {
		name := strings.Map(func(c rune) rune {
			if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' {
				return c
			}
			return '-'
		}, t.Name())
		if len(name) > 100 {
			name = name[:100]
		}
		prefix = fmt.Sprintf("t%d-%s", prefixes.Add(1), name)
	}
	b, err := s.Open(t.Context(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
