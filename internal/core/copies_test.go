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
	"github.com/molt-sh/molt/internal/sandbox"
)

// treeSize is how many processes the sandbox's live tree has.
func treeSize(t *testing.T, m *Manager, id string) int {
	t.Helper()
	rec, err := m.lookupSandbox(id)
	if err != nil {
		t.Fatal(err)
	}
	pids, _, err := m.treePids(id, rec.Init)
	if err != nil {
		t.Fatal(err)
	}
	return len(pids)
}

// TestTemplateCapture: a full checkpoint of a sandbox with a 48 MiB heap
// copies the tree in the frozen window (no CRIU there) and dumps the
// copies after the thaw. The process then rewrites its whole heap and
// the session changes a variable; a rollback brings back the heap of 'A's
// and the variable of the instant, and no copy stays in the sandbox.
func TestTemplateCapture(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, cowHolder)
	run(t, m, sb.ID, "export X=before")
	n := treeSize(t, m, sb.ID)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint: stall %.1f ms, capture %s %s, parts %+v, took %.1f ms", ck.StallMS, ck.Capture, ck.CaptureNote, ck.StallParts, ck.DurationMS)
	if ck.Capture != capture.Template {
		t.Fatalf("capture %q (%s), want %q", ck.Capture, ck.CaptureNote, capture.Template)
	}
	if p := ck.StallParts; p == nil || p.CopyMS <= 0 || p.CRIUMS != 0 || p.SnapshotMS <= 0 || p.CopyMS > ck.StallMS+1 {
		t.Fatalf("stall parts %+v of a %.1f ms stall: want the copying within the stall, no CRIU", p, ck.StallMS)
	}
	// The call returned at the thaw, the copies' dumps under way: the
	// heap is rewritten meanwhile.
	if !ck.Pending {
		t.Fatal("the checkpoint returned committed: its copies were dumped before the call returned")
	}
	run(t, m, sb.ID, "export X=after; touch /tmp/fill")
	waitFile(t, m, sb.ID, "/tmp/filled")
	if _, err := m.awaitCheckpoint(ctx, ck.ID); err != nil {
		t.Fatal(err)
	}
	if got := treeSize(t, m, sb.ID); got != n {
		t.Fatalf("the tree has %d processes after the checkpoint, %d before: copies stayed", got, n)
	}
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "before\n" {
		t.Fatalf("session after the rollback: %q, want before", r.Stdout)
	}
	heapIntact(t, m, sb.ID, "after the rollback")
	// The restored tree is captured the same way.
	fullCaptured(t, m, sb.ID, capture.Template)
}

// TestTemplateCaptureFallsBack: a tree the copies cannot capture (a
// process holding a socket, whose queue a copy would share) is captured
// copy-on-write, and the checkpoint says why.
func TestTemplateCaptureFallsBack(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"+cowHolder)
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Capture != capture.COW || !strings.Contains(ck.CaptureNote, "socket") {
		t.Fatalf("capture %q (%q), want %q saying why not %q", ck.Capture, ck.CaptureNote, capture.COW, capture.Template)
	}
}

// TestTemplateCaptureFailure: a template capture whose dumps fail lists
// no checkpoint, leaves no copy in the sandbox, and the sandbox runs on
// with its memory; the next checkpoint works.
func TestTemplateCaptureFailure(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	sb := pythonSandbox(t, m, cowHolder)
	run(t, m, sb.ID, "x=7")
	n := treeSize(t, m, sb.ID)
	checkpointFailsAt(t, m, sb.ID, "full:copies")
	if got := treeSize(t, m, sb.ID); got != n {
		t.Fatalf("the tree has %d processes after the failed checkpoint, %d before", got, n)
	}
	if r := run(t, m, sb.ID, "echo $x"); r.Stdout != "7\n" {
		t.Fatalf("session after the failed checkpoint: %q", r.Stdout)
	}
	heapIntact(t, m, sb.ID, "after the failed checkpoint")
	fullCaptured(t, m, sb.ID, capture.Template)
}

// TestTemplateCaptureRollbackRightAfter: a rollback that comes while a
// template capture's copies are being dumped waits for them (it would
// kill them with the tree), and both checkpoints stay good.
func TestTemplateCaptureRollbackRightAfter(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, cowHolder)
	run(t, m, sb.ID, "export X=one")
	ck1, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "export X=two")
	// The second capture's dumps are held until the rollback has had
	// time to kill the copies, were it not waiting.
	hold := make(chan struct{})
	m.hooks.failpoint = func(step string) error {
		if step == "full:copies" {
			<-hold
		}
		return nil
	}
	ck2, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull})
	if err != nil {
		close(hold)
		t.Fatal(err)
	}
	if ck1.Capture != capture.Template || ck2.Capture != capture.Template {
		close(hold)
		t.Fatalf("captures %q (%s), %q (%s)", ck1.Capture, ck1.CaptureNote, ck2.Capture, ck2.CaptureNote)
	}
	rolled := make(chan error, 1)
	go func() {
		_, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck1.ID, Tier: v1.TierWarm})
		rolled <- err
	}()
	select {
	case err := <-rolled:
		close(hold)
		t.Fatalf("the rollback did not wait for the copies' dumps: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	close(hold)
	if err := <-rolled; err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "one\n" {
		t.Fatalf("after the rollback to the first: %q", r.Stdout)
	}
	if _, err := m.awaitCheckpoint(ctx, ck2.ID); err != nil {
		t.Fatalf("the second checkpoint, whose copies the rollback came during: %v", err)
	}
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck2.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "two\n" {
		t.Fatalf("after the rollback to the second: %q", r.Stdout)
	}
}

// TestTemplateCaptureCrash kills the daemon (SIGKILL, in a child process
// as TestCrashRecovery does) in a template capture: once pid1 has copied
// itself, before the daemon holds the copy; and while the copies wait
// for their dumps. The next daemon lists no checkpoint, the sandbox's
// tree is what it was (no copy left), its session and heap are intact,
// and the next capture works.
func TestTemplateCaptureCrash(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := pythonSandbox(t, m, cowHolder)
	n := treeSize(t, m, sb.ID)
	cfg := m.cfg
	sandbox.Forget(record(t, m, sb.ID).Init)
	m.Close()
	var cur *Manager
	t.Cleanup(func() {
		if cur != nil {
			if err := cur.Remove(ctx, sb.ID); err != nil {
				t.Errorf("remove %s: %v", sb.ID, err)
			}
			cur.Close()
		}
	})
	for _, step := range []string{"template:copied", "template:dumping"} {
		t.Run(step, func(t *testing.T) {
			runCrashingDaemon(t, crashCase{Root: cfg.Root, Sandbox: sb.ID, Op: opTemplate, Step: step})
			m, err := Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			cur = m
			// One reported pending is listed as failed, nothing else.
			if cks, err := m.Checkpoints(sb.ID); err != nil || len(stored(cks)) != 0 {
				t.Fatalf("checkpoints after the restart: %+v (%v), want none stored", cks, err)
			}
			// Start-up kills what is left without waiting for it.
			for deadline := time.Now().Add(2 * time.Second); treeSize(t, m, sb.ID) != n; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					rec := record(t, m, sb.ID)
					tree, _, _ := m.treePids(sb.ID, rec.Init)
					var comms []string
					for _, pid := range tree {
						b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
						comms = append(comms, string(b))
					}
					t.Fatalf("the tree has %d processes after the restart, %d before: %q", len(tree), n, comms)
				}
			}
			if got := run(t, m, sb.ID, "echo $X; rm -f /tmp/result; touch /tmp/check").Stdout; got != "a\n" {
				t.Fatalf("X=%q after the restart, want a", got)
			}
			if got := waitFile(t, m, sb.ID, "/tmp/result"); got != "0" {
				t.Fatalf("heap after the restart: %s bytes not 'A'", got)
			}
			sandbox.Forget(record(t, m, sb.ID).Init)
			cur = nil
			m.Close()
		})
		if t.Failed() {
			return
		}
	}
	var err error
	if cur, err = Open(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	ck, err := cur.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Capture != capture.Template {
		t.Fatalf("capture after the crashes %q (%s)", ck.Capture, ck.CaptureNote)
	}
}

// TestTemplateCaptureDeepTree: a process started by the session's shell
// (a background job) is copied as well; its copy is orphaned to pid1
// rather than given to the shell, whose job table does not change, and
// a rollback brings the job back under its shell with its heap.
func TestTemplateCaptureDeepTree(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	if err := os.WriteFile(filepath.Join(m.sbRoot(sb.ID), "holder.py"), []byte(cowHolder), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "python3 /holder.py & echo $! > /tmp/job")
	waitFile(t, m, sb.ID, "/tmp/ready")
	jobs := func() string { return run(t, m, sb.ID, "jobs -l").Stdout }
	before := jobs()
	if !strings.Contains(before, "Running") {
		t.Fatalf("jobs before the checkpoint: %q", before)
	}
	ck := fullCaptured(t, m, sb.ID, capture.Template)
	if got := jobs(); got != before {
		t.Fatalf("jobs after the checkpoint %q, before %q", got, before)
	}
	run(t, m, sb.ID, "touch /tmp/fill")
	waitFile(t, m, sb.ID, "/tmp/filled")
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	if got := jobs(); got != before {
		t.Fatalf("jobs after the rollback %q, before %q", got, before)
	}
	// The job's parent is the session's shell again.
	if got := run(t, m, sb.ID, "ps -o ppid= -p $(cat /tmp/job) | tr -d ' '; echo $$").Stdout; len(strings.Fields(got)) != 2 || strings.Fields(got)[0] != strings.Fields(got)[1] {
		t.Fatalf("the job's parent and the shell: %q", got)
	}
	heapIntact(t, m, sb.ID, "after the rollback")
}
