package core

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/sbinit"
	"github.com/molt-sh/molt/internal/testutil"
	"golang.org/x/sys/unix"
)

// The test binary doubles as the sandbox init, as the molt binary does.
func TestMain(m *testing.M) {
	sbinit.RunIfInit()
	os.Exit(m.Run())
}

const testImage = "debian"

// openManager opens a Manager on a fresh root with the Debian image
// (from the debootstrap cache after the first build on this host).
func openManager(t testing.TB) *Manager {
	t.Helper()
	return openManagerConfig(t, Config{Root: t.TempDir()})
}

// openManagerConfig opens a manager of cfg (an 8 GiB pool and the
// shared image cache unless cfg says otherwise) with the test image
// built, closed when t ends.
func openManagerConfig(t testing.TB, cfg Config) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	// No test of the package takes more than a minute or two, even on
	// a machine four times slower than the one they were measured on.
	testutil.Watchdog(t, 10*time.Minute)
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 8 << 30
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = os.Getenv("MOLT_CACHE_DIR")
	}
	m, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if _, err := m.BuildImage(context.Background(), v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
		t.Fatal(err)
	}
	return m
}

// closeManager removes m's sandboxes and unmounts its pool when the test
// ends.
func closeManager(t testing.TB, m *Manager) {
	t.Cleanup(func() {
		ctx := context.Background()
		sbs, _ := m.Sandboxes()
		for _, s := range sbs {
			if err := m.Remove(ctx, s.ID); err != nil {
				t.Errorf("remove %s: %v", s.ID, err)
			}
		}
		m.Close()
		if err := m.pool.Unmount(); err != nil {
			t.Errorf("unmount pool: %v", err)
		}
	})
}

// closeLast removes the sandboxes of *cur, the Manager that stands for
// the last of the daemons a test restarts, and closes it when the test
// ends: before the pool is unmounted (closeManager's clean-up, registered
// earlier, runs after this one).
func closeLast(t testing.TB, cur **Manager) {
	t.Cleanup(func() {
		m := *cur
		if m == nil {
			return
		}
		sbs, _ := m.Sandboxes()
		for _, s := range sbs {
			if err := m.Remove(context.Background(), s.ID); err != nil {
				t.Errorf("remove %s: %v", s.ID, err)
			}
		}
		m.Close()
	})
}

// newSandbox creates a sandbox of the test image.
func newSandbox(t testing.TB, m *Manager) meta.Sandbox {
	t.Helper()
	sb, err := m.Create(context.Background(), v1.SandboxCreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func run(t testing.TB, m *Manager, sb, cmd string) meta.SessionRunResult {
	t.Helper()
	// Bounded: a command that never ends fails its test, not the package.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := m.SessionRun(ctx, sb, "t", v1.SessionRunRequest{Command: cmd})
	if err != nil {
		t.Fatalf("run %q: %v", cmd, err)
	}
	return res
}

// sbEntries lists sandbox id's directory, without the file the
// records' copy writer may be writing at that moment (meta.Copies
// writes sandbox.json in the background, through sandbox.json.tmp).
func sbEntries(t *testing.T, m *Manager, id string) []string {
	t.Helper()
	return slices.DeleteFunc(entries(t, m.sbDir(id)), func(n string) bool { return n == sandboxFile+".tmp" })
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

var errInjected = errors.New("injected failure")

func failAt(m *Manager, step string) {
	m.hooks.failpoint = func(s string) error {
		if s == step {
			return fmt.Errorf("%s: %w", s, errInjected)
		}
		return nil
	}
}

func cgroupDirs(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, h := range []string{"freezer", "memory", "pids", "unified"} {
		ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", h, "molt"))
		for _, e := range ents {
			if e.IsDir() {
				out[h+"/"+e.Name()] = true
			}
		}
	}
	return out
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	for _, step := range []string{"create:snapshot", "create:cgroup", "create:started"} {
		t.Run(step, func(t *testing.T) {
			cgBefore := cgroupDirs(t)
			failAt(m, step)
			_, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Name: "doomed"})
			m.hooks.failpoint = nil
			if !errors.Is(err, errInjected) {
				t.Fatalf("create: %v; want the injected failure", err)
			}
			if sbs, _ := m.Sandboxes(); len(sbs) != 0 {
				t.Fatalf("failed create is listed: %+v", sbs)
			}
			if e := entries(t, m.path("sandboxes")); len(e) != 0 {
				t.Fatalf("failed create left %v", e)
			}
			for d := range cgroupDirs(t) {
				if !cgBefore[d] {
					t.Fatalf("failed create left cgroup %s", d)
				}
			}
			// The name is free again.
			sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Name: "doomed"})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Remove(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStopFailureKeepsSandbox: a stop or hibernation whose kill fails
// says so and leaves the sandbox running, recorded as running, its
// session intact.
func TestStopFailureKeepsSandbox(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "export X=kept")
	for name, op := range map[string]func() error{
		"stop":      func() error { _, err := m.Stop(ctx, sb.ID); return err },
		"hibernate": func() error { _, err := m.Hibernate(ctx, sb.ID); return err },
	} {
		failAt(m, "stop:kill")
		err := op()
		m.hooks.failpoint = nil
		if !errors.Is(err, errInjected) {
			t.Fatalf("%s: %v; want the injected failure", name, err)
		}
		if s, err := m.Sandbox(ctx, sb.ID); err != nil || s.State != v1.StateRunning {
			t.Fatalf("after a failed %s: %+v, %v; want running", name, s, err)
		}
		if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "kept\n" {
			t.Fatalf("after a failed %s: X=%q", name, r.Stdout)
		}
	}
}

// TestForkFailureLeavesNothing: a fork call one of whose forks fails
// (the third to start, the first two made by then or being made) lists
// no fork and leaves no process, directory or cgroup of any; a call
// whose forks all succeed lists them all.
func TestForkFailureLeavesNothing(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	cgBefore := cgroupDirs(t)
	var started atomic.Int32
	m.hooks.failpoint = func(step string) error {
		if step == "create:started" && started.Add(1) == 3 {
			return errInjected
		}
		return nil
	}
	_, err = m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 4})
	m.hooks.failpoint = nil
	if !errors.Is(err, errInjected) {
		t.Fatalf("fork: %v; want the injected failure", err)
	}
	if sbs, _ := m.Sandboxes(); len(sbs) != 1 {
		t.Fatalf("after a failed fork %d sandboxes are listed, want the one forked from", len(sbs))
	}
	if e := entries(t, m.path("sandboxes")); !slices.Equal(e, []string{sb.ID}) {
		t.Fatalf("failed fork left %v", e)
	}
	for d := range cgroupDirs(t) {
		if !cgBefore[d] {
			t.Fatalf("failed fork left cgroup %s", d)
		}
	}
	res, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range res.Sandboxes {
		if r := run(t, m, f.ID, "echo ok"); r.Stdout != "ok\n" {
			t.Fatalf("fork %s: %+v", f.ID, r)
		}
	}
	if sbs, _ := m.Sandboxes(); len(sbs) != 3 {
		t.Fatalf("after forking 2: %d sandboxes listed, want 3", len(sbs))
	}
}

func TestCheckpointFailureLeavesSandboxRunning(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "echo 1 > /root/n; x=7")
	good, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"checkpoint:frozen", "checkpoint:manifest", "checkpoint:record"} {
		t.Run(step, func(t *testing.T) {
			failAt(m, step)
			_, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Label: "doomed"})
			m.hooks.failpoint = nil
			if !errors.Is(err, errInjected) {
				t.Fatalf("checkpoint: %v; want the injected failure", err)
			}
			cks, _ := m.Checkpoints(sb.ID)
			if len(cks) != 1 || cks[0].ID != good.ID {
				t.Fatalf("after a failed checkpoint the list is %+v", cks)
			}
			if e := entries(t, m.path("checkpoints")); len(e) != 1 || e[0] != good.ID {
				t.Fatalf("failed checkpoint left %v", e)
			}
			if e := entries(t, m.path("tmp")); len(e) != 0 {
				t.Fatalf("failed checkpoint left staging %v", e)
			}
			// The sandbox runs, thawed, with its processes and state.
			got, _ := m.Sandbox(ctx, sb.ID)
			if got.State != v1.StateRunning || got.Pid != sb.Pid {
				t.Fatalf("sandbox after failed checkpoint: %+v", got)
			}
			if r := run(t, m, sb.ID, "echo $x; cat /root/n"); r.Stdout != "7\n1\n" {
				t.Fatalf("session after failed checkpoint: %+v", r)
			}
			if rec, _ := m.lookupSandbox(sb.ID); rec.Head != good.ID {
				t.Fatalf("head moved to %q", rec.Head)
			}
		})
	}
}

func TestRollbackFailureKeepsSandbox(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "echo old > /root/f")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo new > /root/f; y=9")
	failAt(m, "rollback:snapshot")
	_, err = m.Rollback(ctx, sb.ID, ck.ID)
	m.hooks.failpoint = nil
	if !errors.Is(err, errInjected) {
		t.Fatalf("rollback: %v", err)
	}
	if r := run(t, m, sb.ID, "cat /root/f; echo $y"); r.Stdout != "new\n9\n" {
		t.Fatalf("failed rollback changed the sandbox: %q", r.Stdout)
	}
	if e := sbEntries(t, m, sb.ID); strings.Join(e, ",") != "root,sandbox.json" {
		t.Fatalf("failed rollback left %v", e)
	}
	res, err := m.Rollback(ctx, sb.ID, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !res.ProcessesRestarted || res.Tier != v1.TierRestart {
		t.Fatalf("rollback result %+v", res)
	}
	if r := run(t, m, sb.ID, "cat /root/f; echo \"[$y]\""); r.Stdout != "old\n[]\n" {
		t.Fatalf("after rollback: %q", r.Stdout)
	}
}

// TestReconcile: debris of a crash (staging directories, directories of
// checkpoints and sandboxes without records) is removed at start.
func TestReconcile(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// A crash between snapshot and commit, and a crash during create.
	if err := os.MkdirAll(m.path("tmp", "ck-dead", "fs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(m.path("checkpoints", "deadbeef0000", "fs"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(m.path("sandboxes", "deadbeef0001", "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if e := entries(t, m.path("tmp")); len(e) != 0 {
		t.Fatalf("staging left: %v", e)
	}
	if e := entries(t, m.path("checkpoints")); len(e) != 1 || e[0] != ck.ID {
		t.Fatalf("checkpoints: %v", e)
	}
	if e := entries(t, m.path("sandboxes")); len(e) != 1 || e[0] != sb.ID {
		t.Fatalf("sandboxes: %v", e)
	}
	if got, _ := m.Sandbox(ctx, sb.ID); got.State != v1.StateRunning {
		t.Fatalf("reconcile disturbed a live sandbox: %+v", got)
	}
}

// TestInitBinaryWriteStaysInRoot: a sandbox that replaces /.molt by a
// symlink to a host directory cannot make molt write there.
func TestInitBinaryWriteStaysInRoot(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	host := t.TempDir()
	run(t, m, sb.ID, fmt.Sprintf("rm -rf /.molt.bak; mv /.molt /.molt.bak; ln -s %s /.molt", host))
	if _, err := m.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if e := entries(t, host); len(e) != 0 {
		t.Fatalf("init binary written through a sandbox symlink into the host: %v", e)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(m.sbRoot(sb.ID), ".molt", "init"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Fatalf("init not reinstalled in the root: %v", err)
	}
	if r := run(t, m, sb.ID, "echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("sandbox after restart: %+v", r)
	}
}

// TestReopenAfterHostRestart simulates a host reboot: every sandbox
// process dies and the pool is unmounted. Reopening remounts the pool,
// reports the sandbox lost with a reason, keeps its checkpoints, and the
// sandbox can be started and rolled back.
func TestReopenAfterHostRestart(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Name: "phoenix"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo before > /root/f")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Label: "before"})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "echo after > /root/f")

	rec, _ := m.lookupSandbox(sb.ID)
	if err := m.killProcesses(ctx, rec); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := m.pool.Unmount(); err != nil {
		t.Fatal(err)
	}
	m, err = Open(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	got, err := m.Sandbox(ctx, "phoenix")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != v1.StateLost || !strings.Contains(got.Reason, "gone") {
		t.Fatalf("after host restart: %+v", got)
	}
	if _, err := m.SessionRun(ctx, sb.ID, "t", v1.SessionRunRequest{Command: "true"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("exec in a lost sandbox: %v", err)
	}
	cks, err := m.Checkpoints(sb.ID)
	if err != nil || len(cks) != 1 || cks[0].ID != ck.ID {
		t.Fatalf("checkpoints after host restart: %+v %v", cks, err)
	}
	if _, err := m.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "cat /root/f"); r.Stdout != "after\n" {
		t.Fatalf("files after start: %q", r.Stdout)
	}
	if _, err := m.Rollback(ctx, sb.ID, "before"); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "cat /root/f"); r.Stdout != "before\n" {
		t.Fatalf("files after rollback: %q", r.Stdout)
	}
}

func requireCRIU(t testing.TB, m *Manager) {
	t.Helper()
	if _, err := m.criuReady(context.Background()); err != nil {
		testutil.Unavailable(t, err.Error())
	}
}

// checkpointFailsAt takes a full checkpoint of sb that fails at step
// (a failpoint) and checks that it lists nothing and leaves no checkpoint
// directory.
func checkpointFailsAt(t *testing.T, m *Manager, sb, step string) {
	t.Helper()
	failAt(m, step)
	_, err := m.Checkpoint(context.Background(), sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	m.hooks.failpoint = nil
	if !errors.Is(err, errInjected) {
		t.Fatalf("checkpoint: %v; want the injected failure", err)
	}
	// Failed in the background, once reported pending, it is listed as
	// failed; never as stored.
	if cks, _ := m.Checkpoints(sb); len(stored(cks)) != 0 {
		t.Fatalf("failed checkpoint listed: %+v", cks)
	}
	if e := entries(t, m.path("checkpoints")); len(e) != 0 {
		t.Fatalf("failed checkpoint left %v", e)
	}
}

// TestFullCheckpointFailureLeavesSandboxRunning: a full checkpoint that
// fails after the freeze and snapshot, or before its record, leaves the
// sandbox thawed and running and lists nothing.
func TestFullCheckpointFailureLeavesSandboxRunning(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "x=7")
	for _, step := range []string{"full:snapshot", "full:record"} {
		t.Run(step, func(t *testing.T) {
			checkpointFailsAt(t, m, sb.ID, step)
			if r := run(t, m, sb.ID, "echo $x"); r.Stdout != "7\n" {
				t.Fatalf("sandbox after failed checkpoint: %+v", r)
			}
		})
	}
	// And one that works, after the failures.
	if _, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull}); err != nil {
		t.Fatal(err)
	}
}

// TestFullRestoreAfterHostRestart: after every process died and the pool
// was unmounted, a full checkpoint is still listed and restores the
// session it captured.
func TestFullRestoreAfterHostRestart(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "export X=42; cd /tmp")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := m.lookupSandbox(sb.ID)
	if err := m.killProcesses(ctx, rec); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := m.pool.Unmount(); err != nil {
		t.Fatal(err)
	}
	m, err = Open(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if got, _ := m.Sandbox(ctx, sb.ID); got.State != v1.StateLost {
		t.Fatalf("after host restart: %+v", got)
	}
	if _, err := m.VerifyCheckpoint(ck.ID); err != nil {
		t.Fatal(err)
	}
	res, err := m.Rollback(ctx, sb.ID, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tier != v1.TierWarm {
		t.Fatalf("rollback: %+v", res)
	}
	if r := run(t, m, sb.ID, "echo $X; pwd"); r.Stdout != "42\n/tmp\n" {
		t.Fatalf("session after restore: %q", r.Stdout)
	}
}

// TestDeletingCheckpointsReleasesSpace: pages shared between full
// checkpoints stay while one holds them and go with the last.
func TestDeletingCheckpointsReleasesSpace(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	if _, _, err := m.Exec(ctx, sb.ID, v1.ExecRequest{Detach: true, Args: []string{"python3", "-c",
		"import os, time\nb = bytearray(os.urandom(48 << 20))\nopen('/tmp/ready', 'w').close()\nwhile True: time.sleep(1)"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the python wrote /tmp/ready", func() bool { return run(t, m, sb.ID, "test -e /tmp/ready && echo y").Stdout == "y\n" })
	used := func() int64 {
		var st unix.Statfs_t
		if err := unix.Syncfs(mustOpen(t, m.pool.Dir)); err != nil {
			t.Fatal(err)
		}
		if err := unix.Statfs(m.pool.Dir, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize
	}
	before := used()
	a, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if b.BytesWritten > a.BytesWritten/5 {
		t.Fatalf("second checkpoint wrote %d bytes, first %d: pages not shared", b.BytesWritten, a.BytesWritten)
	}
	withBoth := used()
	if err := m.DeleteCheckpoint(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	// b shares a's pages: deleting a frees little.
	if freed := withBoth - used(); freed > 16<<20 {
		t.Fatalf("deleting the first checkpoint freed %d bytes that the second shares", freed)
	}
	if _, err := m.VerifyCheckpoint(b.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteCheckpoint(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	// Deleting both releases the pages (btrfs frees unshared extents
	// asynchronously: give it a moment).
	deadline := time.Now().Add(10 * time.Second)
	for used()-before > 24<<20 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if grew := used() - before; grew > 24<<20 {
		t.Fatalf("after deleting both checkpoints the pool still holds %d more bytes", grew)
	}
}

func mustOpen(t *testing.T, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestStandbyBudget: a standby is made only within the budget; without
// one a rollback restores with CRIU (warm), with one it promotes (hot),
// and both give the checkpoint's state.
func TestStandbyBudget(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "export X=42")
	for _, c := range []struct {
		budget int64
		tier   string
	}{{1, v1.TierWarm}, {1 << 30, v1.TierHot}} {
		m.cfg.StandbyBudget = c.budget
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		m.waitHot() // the background preparation has run
		if s := m.standbyOf(sb.ID); (s != nil) != (c.tier == v1.TierHot) {
			t.Fatalf("budget %d: standby %+v", c.budget, s)
		}
		run(t, m, sb.ID, "export X=99")
		res, err := m.Rollback(ctx, sb.ID, ck.ID)
		if err != nil {
			t.Fatal(err)
		}
		if res.Tier != c.tier {
			t.Fatalf("budget %d: tier %s, want %s", c.budget, res.Tier, c.tier)
		}
		if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "42\n" {
			t.Fatalf("budget %d: after rollback X=%q", c.budget, r.Stdout)
		}
		m.waitHot()
	}
	// A standby dies with its sandbox's processes and leaves no root.
	if _, err := m.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if s := m.standbyOf(sb.ID); s != nil {
		t.Fatalf("standby survived stop: %+v", s)
	}
	if e := sbEntries(t, m, sb.ID); strings.Join(e, ",") != "root,sandbox.json" {
		t.Fatalf("after stop the sandbox directory holds %v", e)
	}
}

// TestReopenThawsFrozenSandbox: a daemon killed inside a checkpoint
// leaves the sandbox's cgroup frozen, and its PID 1 stopped if it was
// killed while the tree's memory was being write-protected; the next
// daemon thaws the cgroup and continues PID 1.
func TestReopenThawsFrozenSandbox(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	if err := unix.Kill(sb.Pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitState(t, sb.Pid, "T")
	cg, err := cgroup.Load(testCgroup(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := cg.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m, err = Open(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := m.SessionRun(cctx, sb.ID, "t", v1.SessionRunRequest{Command: "echo alive"})
	if err != nil || res.Stdout != "alive\n" {
		t.Fatalf("sandbox after reopen: %+v %v", res, err)
	}
}

// TestCloseReleasesInits: a closed manager keeps no agent of its
// sandboxes' inits, whose collectors would race the next daemon's for
// the sessions' output; the next one takes the sessions over.
func TestCloseReleasesInits(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "export X=kept")
	if _, err := m.Sandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	in := record(t, m, sb.ID).Init
	if !sandbox.Held(in) {
		t.Fatal("no agent for the init after a session call")
	}
	m.Close()
	if sandbox.Held(in) {
		t.Fatal("the closed manager still keeps an agent for the init")
	}
	m, err := Open(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if got := run(t, m, sb.ID, "echo $X").Stdout; got != "kept\n" {
		t.Fatalf("session after reopen: X=%q, want kept", got)
	}
}

// TestMetrics: checkpoints, rollbacks and sandboxes show in the
// Prometheus exposition.
func TestMetrics(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb := newSandbox(t, m)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: "bogus"}); err == nil {
		t.Fatal("bogus kind accepted")
	}
	if _, err := m.Rollback(ctx, sb.ID, ck.ID); err != nil {
		t.Fatal(err)
	}
	rr := httptest.NewRecorder()
	m.MetricsHandler().ServeHTTP(rr, httptest.NewRequest("GET", "/v1/metrics", nil))
	body := rr.Body.String()
	for _, want := range []string{
		`molt_checkpoints_total{kind="fs",result="committed"} 1`,
		`molt_checkpoint_stall_seconds_count{kind="fs"} 1`,
		`molt_rollback_seconds_count{tier="restart"} 1`,
		`molt_sandboxes{state="running"} 1`,
		`molt_pending_checkpoints 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Log(body)
	}
}

// rollbackTo rolls sandbox sb back to ck and checks the tier it took and
// the session variable X it brought back.
func rollbackTo(t *testing.T, m *Manager, sb string, ck meta.Checkpoint, tier, x string) {
	t.Helper()
	res, err := m.Rollback(context.Background(), sb, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tier != tier {
		t.Fatalf("rollback to %s: tier %s, want %s (standbys %v)", ck.ID, res.Tier, tier, m.standbyCheckpoints(sb))
	}
	if r := run(t, m, sb, "echo $X"); r.Stdout != x+"\n" {
		t.Fatalf("rollback to %s: X=%q, want %q", ck.ID, r.Stdout, x)
	}
}

// standbySandbox returns a manager with room for standbys (1 GiB) and a
// sandbox of the test image in it.
func standbySandbox(t *testing.T) (*Manager, meta.Sandbox) {
	t.Helper()
	m := openManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1 << 30
	sb, err := m.Create(context.Background(), v1.SandboxCreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	return m, sb
}

// TestKeptStandbys: a checkpoint marked keep has a standby besides the
// head's, so rollbacks to either are hot; an unmarked former head loses
// its standby.
func TestKeptStandbys(t *testing.T) {
	m, sb := standbySandbox(t)
	ctx := context.Background()
	settle := func() {
		t.Helper()
		m.pipe.wg.Wait()
		m.waitHot()
	}
	rollback := func(ck meta.Checkpoint, tier, x string) {
		t.Helper()
		settle()
		rollbackTo(t, m, sb.ID, ck, tier, x)
	}
	run(t, m, sb.ID, "export X=a")
	a, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "a", Keep: true, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "export X=b")
	b, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "b", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	settle()
	for deadline := time.Now().Add(10 * time.Second); len(m.standbyCheckpoints(sb.ID)) < 2 && time.Now().Before(deadline); {
		settle()
		time.Sleep(20 * time.Millisecond)
	}
	rollback(a, v1.TierHot, "a")  // kept
	rollback(b, v1.TierWarm, "b") // b was the head, not kept: its standby went when a became the head
	rollback(a, v1.TierHot, "a")  // kept, standby made again meanwhile
	if _, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS, Keep: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("keep on an fs checkpoint: %v", err)
	}
}

// TestSandboxStandbyBudget: a sandbox's own standby budget bounds its
// standbys within the host's: with room for one, the head's standby is
// kept and a kept checkpoint's is evicted (a rollback to it is warm, with
// its state); a sandbox that allows none gets none; a bad budget is
// refused at create.
func TestSandboxStandbyBudget(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1 << 30
	ctx := context.Background()
	if _, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{StandbyBudgetBytes: -2}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("create with standby budget -2: %v", err)
	}
	settle := func() {
		t.Helper()
		m.pipe.wg.Wait()
		m.waitHot()
	}
	sb := newSandbox(t, m)
	run(t, m, sb.ID, "export X=a")
	a, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "a", Keep: true, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if a.ImageBytes <= 0 {
		t.Fatalf("checkpoint a has no image size: %+v", a)
	}
	settle()
	// Room for one standby of this size: the sandbox record is the
	// daemon's default budget's user.
	m.cfg.SandboxStandbyBudget = a.ImageBytes * 3 / 2
	run(t, m, sb.ID, "export X=b")
	b, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Label: "b", Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if b.ImageBytes+a.ImageBytes <= m.cfg.SandboxStandbyBudget {
		t.Fatalf("images of %d and %d bytes fit the budget of %d: the test needs them not to", a.ImageBytes, b.ImageBytes, m.cfg.SandboxStandbyBudget)
	}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		settle()
		got = m.standbyCheckpoints(sb.ID)
		if slices.Equal(got, []string{b.ID}) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !slices.Equal(got, []string{b.ID}) {
		t.Fatalf("standbys %v, want only the head's %s (a is %s)", got, b.ID, a.ID)
	}
	rep, err := m.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StandbyBytes != b.ImageBytes || rep.StandbyBytes > m.cfg.SandboxStandbyBudget {
		t.Fatalf("sandbox reports %d bytes of standbys, want %d within %d", rep.StandbyBytes, b.ImageBytes, m.cfg.SandboxStandbyBudget)
	}
	rollbackTo(t, m, sb.ID, a, v1.TierWarm, "a") // its standby was evicted

	none, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{StandbyBudgetBytes: -1}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, none.ID, "export X=n")
	n, err := m.Checkpoint(ctx, none.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * standbyDelay)
	settle()
	if got := m.standbyCheckpoints(none.ID); len(got) != 0 {
		t.Fatalf("a sandbox that allows no standbys has %v", got)
	}
	run(t, m, none.ID, "export X=m")
	rollbackTo(t, m, none.ID, n, v1.TierWarm, "n") // no standbys allowed
}

// TestStandbyPriority: a standby is restored by a CRIU of the lowest
// priority (backgroundNice), but its processes get their own dumped
// priorities back: after a hot rollback a process that ran at nice 5
// runs at nice 5 again, and the others at 0.
func TestStandbyPriority(t *testing.T) {
	m, sb := standbySandbox(t)
	ctx := context.Background()
	// Checkpointed once nice has executed sleep: before that, the tree
	// holds a process named nice at nice 5.
	run(t, m, sb.ID, `nice -n 5 sleep 1000 & until [ "$(cat /proc/$!/comm)" = sleep ]; do sleep 0.01; done; echo started`)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); !slices.Contains(m.standbyCheckpoints(sb.ID), ck.ID); {
		if time.Now().After(deadline) {
			t.Fatal("no standby within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := m.Rollback(ctx, sb.ID, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tier != v1.TierHot {
		t.Fatalf("rollback with a standby ready: tier %s", res.Tier)
	}
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, sb.ID, &rec); err != nil {
		t.Fatal(err)
	}
	tree, _, err := m.treePids(sb.ID, rec.Init)
	if err != nil {
		t.Fatal(err)
	}
	sleeps := 0
	for _, pid := range tree {
		f := testutil.StatFields(t, pid)
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		nice, want := f[16], "0"
		if strings.TrimSpace(string(comm)) == "sleep" {
			want = "5"
			sleeps++
		}
		if nice != want {
			t.Errorf("pid %d (%s) runs at nice %s after the hot rollback, want %s", pid, strings.TrimSpace(string(comm)), nice, want)
		}
	}
	if sleeps != 1 {
		t.Fatalf("%d sleep processes in the restored tree %v, want 1", sleeps, tree)
	}
}
