package fsnap

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The EBUSY retry of DeleteSubvolume, with the ioctl replaced: no btrfs
// and no root needed.
func TestDeleteRetriesBusy(t *testing.T) {
	sub := filepath.Join(t.TempDir(), "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroy = destroyIoctl })
	for _, c := range []struct {
		name    string
		results []error // the last one repeats
		want    error
		calls   int
	}{
		{"released", []error{unix.EBUSY, unix.EBUSY, nil}, nil, 3},
		{"other error", []error{unix.EPERM}, unix.EPERM, 1},
		{"stays busy", []error{unix.EBUSY}, unix.EBUSY, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			destroy = func(_ int, name string) error {
				if name != "sub" {
					t.Errorf("destroy(%q), want %q", name, "sub")
				}
				calls++
				return c.results[min(calls, len(c.results))-1]
			}
			start := time.Now()
			err := DeleteSubvolume(sub)
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("DeleteSubvolume = %v, want %v", err, c.want)
			}
			if c.calls >= 0 && calls != c.calls {
				t.Errorf("%d destroy calls, want %d", calls, c.calls)
			}
			if c.calls < 0 && time.Since(start) < deleteBusyTimeout {
				t.Errorf("gave up after %v, want %v", time.Since(start), deleteBusyTimeout)
			}
		})
	}
}
