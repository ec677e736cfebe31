package core

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/meta"
)

// cowHolder holds 48 MiB of 'A's; /tmp/fill makes it write 'B' over all
// of it (then /tmp/filled), /tmp/check makes it write how many bytes are
// not 'A' to /tmp/result.
const cowHolder = `
import os, time
b = bytearray(b'A' * (48 << 20))
open('/tmp/ready', 'w').close()
while True:
    time.sleep(0.01)
    if os.path.exists('/tmp/fill'):
        os.remove('/tmp/fill')
        b[:] = b'B' * len(b)
        open('/tmp/filled', 'w').close()
    if os.path.exists('/tmp/check'):
        os.remove('/tmp/check')
        with open('/tmp/result.tmp', 'w') as f:
            f.write(str(len(b) - b.count(b'A')))
        os.rename('/tmp/result.tmp', '/tmp/result')
`

// openCOWManager opens a Manager whose big trees are captured
// copy-on-write: the template capture, which would take them first,
// is off.
func openCOWManager(t testing.TB) *Manager {
	t.Helper()
	m := openManager(t)
	m.opts.noTemplateCapture = true
	return m
}

// pythonSandbox creates a sandbox that runs script with python3 in the
// background and waits for the script to create /tmp/ready.
func pythonSandbox(t testing.TB, m *Manager, script string) meta.Sandbox {
	t.Helper()
	ctx := context.Background()
	sb := newSandbox(t, m)
	if _, _, err := m.Exec(ctx, sb.ID, v1.ExecRequest{Detach: true, Args: []string{"python3", "-c", script}}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, m, sb.ID, "/tmp/ready")
	return sb
}

func waitFile(t testing.TB, m *Manager, sb, path string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := run(t, m, sb, "cat "+path+" 2>/dev/null && echo .")
		if strings.HasSuffix(r.Stdout, ".\n") {
			return strings.TrimSuffix(r.Stdout, ".\n")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 20 s", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCOWCapture: a full checkpoint of a sandbox with 48 MiB of private
// memory is taken copy-on-write, and the pages it stores are those of
// the instant even though the process rewrote all of them after the
// thaw and before the checkpoint copied them (persist is held until
// then): a rollback brings back a heap of 'A's.
func TestCOWCapture(t *testing.T) {
	m := openCOWManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, cowHolder)
	gate := make(chan struct{})
	m.hooks.failpoint = func(step string) error {
		if step == "full:stream" {
			<-gate
		}
		return nil
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull})
	if err != nil {
		close(gate)
		t.Fatal(err)
	}
	t.Logf("checkpoint: stall %.1f ms, capture %s %s, parts %+v", ck.StallMS, ck.Capture, ck.CaptureNote, ck.StallParts)
	if ck.Capture != capture.COW {
		close(gate)
		t.Fatalf("capture %q (%s), want %q", ck.Capture, ck.CaptureNote, capture.COW)
	}
	if p := ck.StallParts; p == nil || p.ProtectMS <= 0 || p.CRIUMS <= 0 || p.SnapshotMS <= 0 ||
		p.ProtectMS+p.CRIUMS > ck.StallMS+1 || p.SnapshotMS > ck.StallMS+1 {
		close(gate)
		t.Fatalf("stall parts %+v of a %.1f ms stall: want each part above 0, the protection and CRIU within the stall", p, ck.StallMS)
	}
	run(t, m, sb.ID, "touch /tmp/fill")
	waitFile(t, m, sb.ID, "/tmp/filled")
	close(gate)
	if _, err := m.awaitCheckpoint(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	before, err := m.lookupSandbox(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	res, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollback: %+v", res)
	// The replaced init was this process's child: its reaper must still
	// be waiting for it (the capture stopped it without ptrace), so it
	// does not stay behind as a zombie.
	for deadline := time.Now().Add(5 * time.Second); ; {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", before.Init.Pid))
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replaced init %d is still there: %s", before.Init.Pid, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A tree restored from pages written after the instant can hang
	// (the session's shell did not answer in such a run): bounded.
	done := make(chan error, 1)
	go func() {
		_, err := m.SessionRun(ctx, sb.ID, "t", v1.SessionRunRequest{Command: "rm -f /tmp/result; touch /tmp/check"})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the session did not answer within 20 s of the rollback")
	}
	if got := waitFile(t, m, sb.ID, "/tmp/result"); got != "0" {
		t.Fatalf("after the rollback %s bytes of the heap are not 'A': the checkpoint stored pages written after its instant", got)
	}
}

// TestCOWCaptureFallsBack: a sandbox whose big process has threads is
// copied while frozen, and the checkpoint says why.
func TestCOWCaptureFallsBack(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, "import threading, time\nb = bytearray(b'A' * (48 << 20))\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\nopen('/tmp/ready', 'w').close()\nwhile True: time.sleep(1)")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Capture != capture.Copy || !strings.Contains(ck.CaptureNote, "threads") {
		t.Fatalf("capture %q (%q), want %q saying why", ck.Capture, ck.CaptureNote, capture.Copy)
	}
	if p := ck.StallParts; p == nil || p.ProtectMS != 0 || p.CRIUMS <= 0 {
		t.Fatalf("stall parts %+v of a copying capture: want no protection and CRIU's time", p)
	}
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	waitFile(t, m, sb.ID, "/tmp/ready")
}

// TestCOWCaptureFailureLeavesSandboxRunning: a copy-on-write capture
// that fails in the frozen window (the pre-dump step of the streamed
// dump), while the held pages are written out, or at the commit lists
// no checkpoint, leaves no checkpoint directory or staging directory,
// and the sandbox runs on with its memory; the next one works.
func TestCOWCaptureFailureLeavesSandboxRunning(t *testing.T) {
	m := openCOWManager(t)
	requireCRIU(t, m)
	sb := pythonSandbox(t, m, cowHolder)
	staging := func() []string {
		got, _ := filepath.Glob(filepath.Join("/dev/shm", m.stagingPrefix()+"*"))
		return got
	}
	for _, step := range []string{"full:protect", "full:stream", "full:record"} {
		t.Run(step, func(t *testing.T) {
			checkpointFailsAt(t, m, sb.ID, step)
			if s := staging(); len(s) != 0 {
				t.Fatalf("failed checkpoint left staging %v", s)
			}
			heapIntact(t, m, sb.ID, "after the failed checkpoint")
		})
	}
	fullCaptured(t, m, sb.ID, capture.COW)
}

// TestCOWCaptureWithStandby: the sandbox's cgroup also holds the standby
// of its last checkpoint (stopped, in a PID namespace of its own, the
// daemon's child). A copy-on-write capture protects the live tree only:
// it does not wait for the standby to stop for a tracer (which it never
// does: the daemon's reaper takes the stop) and leaves nothing traced
// for CRIU.
func TestCOWCaptureWithStandby(t *testing.T) {
	m := openCOWManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1 << 30
	ctx := context.Background()
	sb := pythonSandbox(t, m, cowHolder)
	var last meta.Checkpoint
	for i := 0; i < 3; i++ {
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatalf("checkpoint %d: %v", i, err)
		}
		t.Logf("checkpoint %d: stall %.1f ms, capture %s %s", i, ck.StallMS, ck.Capture, ck.CaptureNote)
		if ck.Capture != capture.COW {
			t.Fatalf("checkpoint %d: capture %q (%s), want %q", i, ck.Capture, ck.CaptureNote, capture.COW)
		}
		if i > 0 && ck.StallMS > 1000 {
			t.Fatalf("checkpoint %d: stall %.0f ms with a standby in the cgroup", i, ck.StallMS)
		}
		for deadline := time.Now().Add(20 * time.Second); m.standbyOf(sb.ID) == nil; {
			if time.Now().After(deadline) {
				t.Fatalf("no standby for checkpoint %d within 20 s", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
		last = ck
	}
	res, err := m.Rollback(ctx, sb.ID, last.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tier != v1.TierHot {
		t.Fatalf("rollback tier %s, want hot", res.Tier)
	}
	heapIntact(t, m, sb.ID, "after the rollback")
}

// TestCOWCaptureWithZombie: a process that never reaps its exited child
// (a zombie in the tree, as sloppy agent scripts leave) is still
// captured copy-on-write, and a rollback brings back its heap with the
// zombie child.
func TestCOWCaptureWithZombie(t *testing.T) {
	m := openCOWManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	holder := "import os\nif os.fork() == 0:\n    os._exit(0)\n" + cowHolder
	sb := pythonSandbox(t, m, holder)
	zombies := func() string {
		t.Helper()
		return strings.TrimSpace(run(t, m, sb.ID, "ps -eo stat= | grep -c '^Z' || true").Stdout)
	}
	if z := zombies(); z != "1" {
		t.Fatalf("%s zombies before the checkpoint, want 1", z)
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: stall %.1f ms, capture %s %s", ck.StallMS, ck.Capture, ck.CaptureNote)
	if ck.Capture != capture.COW {
		t.Fatalf("capture %q (%s), want %q", ck.Capture, ck.CaptureNote, capture.COW)
	}
	run(t, m, sb.ID, "touch /tmp/fill")
	waitFile(t, m, sb.ID, "/tmp/filled")
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	heapIntact(t, m, sb.ID, "after the rollback")
	if z := zombies(); z != "1" {
		t.Fatalf("%s zombies after the rollback, want the one of the checkpoint", z)
	}
}

// heapIntact checks that cowHolder's heap in sandbox id is all 'A's.
func heapIntact(t testing.TB, m *Manager, id, when string) {
	t.Helper()
	run(t, m, id, "rm -f /tmp/result; touch /tmp/check")
	if got := waitFile(t, m, id, "/tmp/result"); got != "0" {
		t.Fatalf("%s: %s bytes of the heap are not 'A'", when, got)
	}
}

// fullCaptured takes a full checkpoint of sandbox id, waits for its
// commit and checks that it was captured the way want says.
func fullCaptured(t testing.TB, m *Manager, id, want string) meta.Checkpoint {
	t.Helper()
	ck, err := m.Checkpoint(context.Background(), id, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Capture != want {
		t.Fatalf("capture %q (%s), want %q", ck.Capture, ck.CaptureNote, want)
	}
	return ck
}
