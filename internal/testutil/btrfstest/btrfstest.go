// Package btrfstest gives tests a directory on btrfs: a fresh pool on a
// loop file, as the daemon's is when its state root is not on btrfs.
package btrfstest

import (
	"context"
	"testing"

	"github.com/molt-sh/molt/internal/pool"
	"github.com/molt-sh/molt/internal/testutil"
)

// Dir returns the directory of a fresh 512 MiB btrfs pool, unmounted when
// the test ends. It needs root (testutil.RequireRoot).
func Dir(t testing.TB) string {
	t.Helper()
	testutil.RequireRoot(t)
	p, err := pool.Open(context.Background(), pool.Config{Root: t.TempDir(), Size: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return p.Dir
}
