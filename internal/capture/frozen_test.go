package capture

import (
	"testing"
	"time"
)

// TestDeadline: the configured deadline (0: the default, negative:
// none) plus a second per frozenBytesPerSec of private memory.
func TestDeadline(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		anon int64
		want time.Duration
	}{
		{0, 0, DefaultFrozenDeadline},
		{0, frozenBytesPerSec, DefaultFrozenDeadline + time.Second},
		{time.Second, frozenBytesPerSec / 2, 1500 * time.Millisecond},
		{-1, 1 << 30, 0},
	} {
		if got := Deadline(c.d, c.anon); got != c.want {
			t.Errorf("Deadline(%v, %d) = %v, want %v", c.d, c.anon, got, c.want)
		}
	}
}

// TestWatchNil: a nil watch (an fs checkpoint without a cgroup) does
// nothing.
func TestWatchNil(t *testing.T) {
	var w *Watch
	w.Arm("the freeze")
	w.Enter("the snapshot")
	w.Disarm()
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
}
