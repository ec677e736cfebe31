package capture

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
)

// A capture freezes the sandbox and works on it frozen: an fs
// checkpoint's snapshot, a full checkpoint's CRIU dump (with the
// copy-on-write protection), a template capture's copies. CRIU or
// ptrace that hangs there must not keep the sandbox frozen: every
// frozen window has a deadline (Config.FrozenDeadline, the daemon's
// --frozen-deadline), after which the window's context is cancelled
// (its CRIU's process group is killed, which also lets go of the tasks
// CRIU traced), the sandbox is thawed, and the capture fails, naming the
// step that overran, with errdefs.ErrUnavailable. The capture's callers
// then release the capture slot and the sandbox lock as on any failure,
// and nothing is listed.

// DefaultFrozenDeadline is Config.FrozenDeadline's default. The stall of
// a full checkpoint measured 4-105 ms p50 and at most ~200 ms across
// BENCHMARKS.md's runs (CRIU's own dump of a 100 MiB Python: 140-173 ms),
// on machines 2-4x slower than others of their kind: 2 s is ten times
// the worst of them and still short enough that an agent's tool call
// survives it. A full checkpoint adds frozenBytesPerSec of the tree's
// private memory, which a copy capture writes out while frozen.
const DefaultFrozenDeadline = 2 * time.Second

// frozenBytesPerSec is the slowest rate at which a frozen dump is
// expected to copy memory out (measured ~1 GiB/s here for 100 MiB; a
// quarter of it, for slower machines and a busy pool, halved again).
const frozenBytesPerSec = 128 << 20

// Deadline is the deadline of a frozen window over a tree with anon
// bytes of private memory, d being Config.FrozenDeadline (0: the
// default, negative: none); 0 means none.
func Deadline(d time.Duration, anon int64) time.Duration {
	switch {
	case d < 0:
		return 0
	case d == 0:
		d = DefaultFrozenDeadline
	}
	return d + time.Duration(float64(anon)/frozenBytesPerSec*float64(time.Second))
}

// Watch bounds the frozen windows of one capture.
type Watch struct {
	d      time.Duration
	cg     *cgroup.Cgroup
	cancel context.CancelCauseFunc

	mu sync.Mutex
	// What the frozen sandbox waits for now.
	step string // +checklocks:mu
	// Armed while frozen.
	timer *time.Timer // +checklocks:mu
	// Bumped by every arm and disarm.
	gen int // +checklocks:mu
	// The step that overran, once one did.
	hung string // +checklocks:mu
}

// errFrozenDeadline is the cause of a window's cancelled context.
var errFrozenDeadline = errors.New("the frozen deadline passed")

// WatchFrozen returns a context for the capture's work on cg and the
// watch of its frozen windows; d 0 means no deadline. The caller calls
// stop once the sandbox is thawed for good.
func WatchFrozen(ctx context.Context, cg *cgroup.Cgroup, d time.Duration) (context.Context, *Watch) {
	ctx, cancel := context.WithCancelCause(ctx)
	return ctx, &Watch{d: d, cg: cg, cancel: cancel}
}

// Arm starts the deadline as the sandbox freezes, the window's first
// step being step. A nil watch does nothing.
func (w *Watch) Arm(step string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.step = step
	w.gen++
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
	if w.d <= 0 || w.hung != "" {
		return
	}
	gen := w.gen
	w.timer = time.AfterFunc(w.d, func() { w.expire(gen) })
}

// Enter names the step the frozen sandbox waits for from now on.
func (w *Watch) Enter(step string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.step = step
	w.mu.Unlock()
}

// Disarm stops the deadline as the sandbox thaws between two windows.
func (w *Watch) Disarm() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}

// expire aborts the window: the work's context ends (CRIU is killed, a
// wait on the tree returns) and the sandbox thaws at once, even if the
// goroutine in the window is stuck. The capture thaws again once that
// goroutine is back.
func (w *Watch) expire(gen int) {
	w.mu.Lock()
	if gen != w.gen || w.hung != "" {
		w.mu.Unlock()
		return
	}
	w.hung = w.step
	w.mu.Unlock()
	w.cancel(errFrozenDeadline)
	_ = w.cg.Thaw()
}

// Stop disarms the watch for good and returns the deadline's error if
// a window overran (then the capture must fail with it).
func (w *Watch) Stop() error {
	if w == nil {
		return nil
	}
	w.Disarm()
	w.mu.Lock()
	hung := w.hung
	w.mu.Unlock()
	w.cancel(nil)
	if hung == "" {
		return nil
	}
	return fmt.Errorf("%s hung: the sandbox stayed frozen for %s (the frozen deadline, --frozen-deadline); the capture was aborted and the sandbox thawed: %w", hung, w.d, errdefs.ErrUnavailable)
}
