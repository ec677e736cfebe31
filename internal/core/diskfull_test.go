package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/testutil"
	"golang.org/x/sys/unix"
)

// openSmallManager opens a Manager on root with a loop pool of size
// bytes and the test image, kept free reserve bytes.
func openSmallManager(t *testing.T, root string, size, reserve int64) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	m, err := Open(context.Background(), Config{Root: root, PoolSize: size, DiskReserve: reserve, CacheDir: os.Getenv("MOLT_CACHE_DIR")})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if _, err := m.BuildImage(context.Background(), v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
		t.Fatal(err)
	}
	return m
}

// fill grows the file at path until avail() reports at most leave
// bytes (0: until the filesystem refuses more), and returns a function
// that removes it.
func fill(t *testing.T, path string, leave int64, avail func() int64) func() {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var off int64
	for chunk := int64(256 << 20); chunk >= 4<<10; {
		if leave > 0 {
			a := avail()
			if a <= leave {
				break
			}
			chunk = min(chunk, max(a-leave, 4<<10))
		}
		if err := unix.Fallocate(int(f.Fd()), 0, off, chunk); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			chunk /= 2
			continue
		}
		off += chunk
		_ = unix.Syncfs(int(f.Fd()))
	}
	t.Logf("filled %s with %d MiB", path, off>>20)
	removed := false
	t.Cleanup(func() {
		if !removed {
			os.Remove(path)
		}
	})
	return func() {
		removed = true
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		unix.Sync()
	}
}

// refusedForSpace checks that ops on a full disk fail as
// resource_exhausted (the message naming what is short) and that the
// sandbox, its checkpoints and the daemon carry on as before.
func refusedForSpace(t *testing.T, m *Manager, sb string, good meta.Checkpoint, what string) {
	t.Helper()
	ctx := context.Background()
	before, err := m.Checkpoints(sb)
	if err != nil {
		t.Fatal(err)
	}
	sbsBefore, _ := m.Sandboxes()
	check := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), what) {
			t.Fatalf("%s on a full disk: %v, want resource exhausted naming %q", op, err, what)
		}
	}
	_, err = m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	check("full checkpoint", err)
	_, err = m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFS})
	check("fs checkpoint", err)
	_, err = m.Fork(ctx, "", v1.ForkRequest{Checkpoint: good.ID, N: 2})
	check("fork", err)
	_, err = m.Rollback(ctx, sb, good.ID)
	check("rollback", err)
	_, err = m.Hibernate(ctx, sb)
	check("hibernate", err)
	// Nothing moved: the sandbox runs on with its session, the daemon
	// lists what it did.
	if got := run(t, m, sb, "echo $x").Stdout; got != "2\n" {
		t.Fatalf("session after the refusals: %q", got)
	}
	after, err := m.Checkpoints(sb)
	if err != nil || len(after) != len(before) {
		t.Fatalf("checkpoints %+v after the refusals (%v), were %+v", after, err, before)
	}
	if sbs, _ := m.Sandboxes(); len(sbs) != len(sbsBefore) {
		t.Fatalf("%d sandboxes after the refusals, were %d", len(sbs), len(sbsBefore))
	}
	if e := entries(t, m.path("checkpoints")); len(e) != len(before) {
		t.Fatalf("checkpoint directories %v after the refusals", e)
	}
}

// TestDiskFullPool fills a small loop pool: before a checkpoint, a fork,
// a rollback and a hibernation (refused up front, below the reserve),
// and inside a full checkpoint's background store (the checkpoint,
// reported pending, is then listed failed with the reason; rollback and
// fork to it are refused; it can be deleted). The sandbox runs on and
// works again once space is freed.
func TestDiskFullPool(t *testing.T) {
	m := openSmallManager(t, t.TempDir(), 2<<30, 256<<20)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "x=1")
	good, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "x=2")
	avail := func() int64 {
		s, err := m.pool.Space()
		if err != nil {
			t.Fatal(err)
		}
		return s.Avail()
	}
	free := fill(t, m.path("fill"), 128<<20, avail)
	refusedForSpace(t, m, sb.ID, good, "pool "+m.pool.Dir+" has")
	free()

	// Filled once the capture is done, while the images are stored.
	m.cfg.DiskReserve = -1
	var freeAgain func()
	m.hooks.failpoint = func(step string) error {
		if step == "persist:store" {
			freeAgain = fill(t, m.path("fill"), 0, avail)
		}
		return nil
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "doomed"})
	if err != nil {
		t.Fatal(err)
	}
	if !ck.Pending {
		t.Fatalf("checkpoint %+v not reported pending", ck)
	}
	_, err = m.awaitCheckpoint(ctx, ck.ID)
	m.hooks.failpoint = nil
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("storing the checkpoint on a full pool: %v, want resource exhausted", err)
	}
	t.Logf("stored on a full pool: %v", err)
	cks, err := m.Checkpoints(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var failed *meta.Checkpoint
	for i, c := range cks {
		if c.ID == ck.ID {
			failed = &cks[i]
		}
	}
	if failed == nil || !failed.Failed || failed.Pending || failed.FailedReason == "" {
		t.Fatalf("the checkpoint reported pending is listed as %+v, want failed with a reason (list %+v)", failed, cks)
	}
	if info, err := m.CheckpointInfo("doomed"); err != nil || !info.Failed {
		t.Fatalf("inspect the failed checkpoint: %+v %v", info, err)
	}
	if got := run(t, m, sb.ID, "echo $x").Stdout; got != "2\n" {
		t.Fatalf("session after the failed store: %q", got)
	}
	if rec := record(t, m, sb.ID); rec.Head != good.ID {
		t.Fatalf("head %s after the failed checkpoint, want %s", rec.Head, good.ID)
	}
	freeAgain()
	if _, err := m.Rollback(ctx, sb.ID, ck.ID); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("rollback to the failed checkpoint: %v, want failed precondition", err)
	}
	if _, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: "doomed"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fork of the failed checkpoint: %v, want failed precondition", err)
	}
	if e := entries(t, m.path("checkpoints")); len(e) != 1 || e[0] != good.ID {
		t.Fatalf("checkpoint directories %v, want %s only", e, good.ID)
	}
	if err := m.DeleteCheckpoint(ctx, ck.ID); err != nil {
		t.Fatalf("delete the failed checkpoint: %v", err)
	}
	if cks, _ := m.Checkpoints(sb.ID); len(cks) != 1 {
		t.Fatalf("after deleting the failed checkpoint: %+v", cks)
	}
	run(t, m, sb.ID, "x=2")
	// Filled inside a fork (after a fork's root is made) and inside a
	// rollback (after its tree is restored): each completes,
	// or fails as resource_exhausted with nothing half-made listed and
	// the sandbox as it was.
	fsck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS})
	if err != nil {
		t.Fatal(err)
	}
	fillAt := func(step string) {
		// Forks run in parallel: the first to reach step fills the pool.
		var once sync.Once
		freeAgain = nil
		m.hooks.failpoint = func(s string) error {
			if s == step {
				once.Do(func() { freeAgain = fill(t, m.path("fill"), 0, avail) })
			}
			return nil
		}
	}
	fillAt("create:snapshot")
	res, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: good.ID, N: 2})
	m.hooks.failpoint = nil
	if freeAgain == nil {
		t.Fatal("the fork never reached its root's snapshot")
	}
	freeAgain()
	sbs, _ := m.Sandboxes()
	switch {
	case err == nil:
		t.Logf("fork on a pool filled half-way: made %d", len(res.Sandboxes))
		for _, f := range res.Sandboxes {
			if got := run(t, m, f.ID, "echo $x").Stdout; got != "1\n" {
				t.Fatalf("fork %s: x=%q", f.ID, got)
			}
			if err := m.Remove(ctx, f.ID); err != nil {
				t.Fatal(err)
			}
		}
	case errors.Is(err, errdefs.ErrResourceExhausted):
		t.Logf("fork on a pool filled half-way: %v", err)
		if len(sbs) != 1 || len(entries(t, m.path("sandboxes"))) != 1 {
			t.Fatalf("after a failed fork: %+v, directories %v", sbs, entries(t, m.path("sandboxes")))
		}
	default:
		t.Fatalf("fork on a pool filled half-way: %v, want success or resource exhausted", err)
	}
	run(t, m, sb.ID, "touch /after")
	// (Its processes come from good, its full ancestor: restored, then
	// the pool fills.)
	fillAt("restore:adopted")
	_, err = m.Rollback(ctx, sb.ID, fsck.ID)
	m.hooks.failpoint = nil
	if freeAgain == nil {
		t.Fatal("the rollback never reached its snapshot")
	}
	freeAgain()
	switch {
	case err == nil:
		t.Log("rollback on a pool filled half-way: done")
		if got := run(t, m, sb.ID, "test -e /after && echo kept || echo gone $x").Stdout; got != "gone 1\n" {
			t.Fatalf("after the rollback: /after %q", got)
		}
	case errors.Is(err, errdefs.ErrResourceExhausted):
		t.Logf("rollback on a pool filled half-way: %v", err)
		if got := run(t, m, sb.ID, "test -e /after && echo $x").Stdout; got != "2\n" {
			t.Fatalf("after a failed rollback: %q", got)
		}
	default:
		t.Fatalf("rollback on a pool filled half-way: %v, want success or resource exhausted", err)
	}

	// Space again: everything works.
	if _, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rollback(ctx, sb.ID, good.ID); err != nil {
		t.Fatal(err)
	}
	if got := run(t, m, sb.ID, "echo $x").Stdout; got != "1\n" {
		t.Fatalf("after the rollback: %q", got)
	}
}

// TestDiskFullUnderLoopPool puts the state root on a small tmpfs of its
// own, holding a sparse pool image larger than it: once the tmpfs is
// nearly full, checkpoints, forks, rollbacks and hibernation are refused
// (the pool itself still says it has room) and the sandbox runs on.
func TestDiskFullUnderLoopPool(t *testing.T) {
	dir := smallTmpfs(t)
	m := openSmallManager(t, filepath.Join(dir, "root"), 8<<30, 128<<20)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "x=1")
	good, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "x=2")
	backing := func() int64 {
		s, err := m.pool.Space()
		if err != nil {
			t.Fatal(err)
		}
		if s.BackingFree < 0 {
			t.Fatal("no backing filesystem reported for the loop pool")
		}
		return s.BackingFree
	}
	free := fill(t, filepath.Join(dir, "fill"), 64<<20, backing)
	if s, _ := m.pool.Space(); s.Free < 1<<30 {
		t.Fatalf("the pool itself should have room: %+v", s)
	}
	refusedForSpace(t, m, sb.ID, good, "the filesystem under pool")
	free()
	if _, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rollback(ctx, sb.ID, good.ID); err != nil {
		t.Fatal(err)
	}
	if got := run(t, m, sb.ID, "echo $x").Stdout; got != "1\n" {
		t.Fatalf("after the rollback: %q", got)
	}
}

// smallTmpfs is a 1.5 GiB tmpfs of the test's own, to hold a state root
// whose filesystem fills up before its (sparse, larger) pool image does.
// It needs root.
func smallTmpfs(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1536m"); err != nil {
		testutil.Unavailable(t, "tmpfs mount: "+err.Error())
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
