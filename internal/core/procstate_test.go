package core

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
)

// procState returns the state letter (/proc/PID/stat) of the process
// whose PID the sandbox's file path holds.
func procState(t testing.TB, m *Manager, sb, path string) string {
	t.Helper()
	r := run(t, m, sb, `p=$(cat `+path+`); read -r l < /proc/$p/stat; s=${l##*) }; echo ${s%% *}`)
	return strings.TrimSpace(r.Stdout)
}

// waitStandbyOf waits until checkpoint ck of sandbox sb has a standby.
func waitStandbyOf(t testing.TB, m *Manager, sb, ck string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !slices.Contains(m.standbyCheckpoints(sb), ck); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no standby of %s within 30 s", ck)
		}
	}
}

// TestStoppedProcessStaysStopped: a background job stopped by job
// control (state T) at a full checkpoint is stopped again after a
// rollback of every tier and in a fork that adopts a standby, while the
// rest of the tree runs; it goes on when continued.
func TestStoppedProcessStaysStopped(t *testing.T) {
	m, sb := standbySandbox(t)
	ctx := context.Background()
	run(t, m, sb.ID, "sleep 1000 & echo $! > /tmp/stopped; kill -STOP $!; export X=at")
	if got := procState(t, m, sb.ID, "/tmp/stopped"); got != "T" {
		t.Fatalf("job state %q before the checkpoint, want T", got)
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tier := range []string{v1.TierHot, v1.TierWarm, v1.TierCold} {
		run(t, m, sb.ID, "kill -CONT $(cat /tmp/stopped); export X=changed")
		if tier == v1.TierHot {
			waitStandbyOf(t, m, sb.ID, ck.ID)
		}
		res, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: tier})
		if err != nil {
			t.Fatal(err)
		}
		if res.Tier != tier {
			t.Fatalf("rollback tier %s, want %s", res.Tier, tier)
		}
		if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "at\n" {
			t.Fatalf("%s rollback: X=%q", tier, r.Stdout)
		}
		if got := procState(t, m, sb.ID, "/tmp/stopped"); got != "T" {
			t.Fatalf("%s rollback: the stopped job is in state %q, want T", tier, got)
		}
	}
	waitStandbyOf(t, m, sb.ID, ck.ID)
	fr, err := m.Fork(ctx, ck.ID, v1.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f := fr.Sandboxes[0].ID
	if got := procState(t, m, f, "/tmp/stopped"); got != "T" {
		t.Fatalf("fork: the stopped job is in state %q, want T", got)
	}
	run(t, m, f, "kill -CONT $(cat /tmp/stopped)")
	// Continued, sleep runs for a moment before it sleeps again (a CI
	// run read "R" right after the kill): wait for S.
	got := procState(t, m, f, "/tmp/stopped")
	for deadline := time.Now().Add(5 * time.Second); got != "S" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got = procState(t, m, f, "/tmp/stopped")
	}
	if got != "S" {
		t.Fatalf("fork: the job continued is in state %q, want S", got)
	}
}

// pipeProbe makes a pipe in the sandbox and prints its capacity and how
// much of a 60 KiB write without a reader went in (an alarm ends a write
// that blocks).
const pipeProbe = `python3 -c "
import os, fcntl, signal
r, w = os.pipe()
signal.alarm(5)
print(fcntl.fcntl(w, 1032), os.write(w, b'x' * 61440))
"`

// TestPipePoolLeavesSandboxPipes: the daemon's pool of pipes for
// streamed (copy-on-write) dumps is not charged to the user the
// sandboxes run as, so after a large full checkpoint a new pipe in a
// sandbox still has 64 KiB and a 60 KiB write without a reader
// completes. Charged to root, the pool (160 MiB) put root over
// fs.pipe-user-pages-soft and every new pipe had 8 KiB.
func TestPipePoolLeavesSandboxPipes(t *testing.T) {
	m := openCOWManager(t)
	requireCRIU(t, m)
	sb := pythonSandbox(t, m, cowHolder)
	if r := run(t, m, sb.ID, pipeProbe); r.Stdout != "65536 61440\n" {
		t.Fatalf("before any checkpoint a new pipe gives %q (exit %d), want 65536 61440: this host's root already holds more than fs.pipe-user-pages-soft in pipes", r.Stdout, r.ExitCode)
	}
	fullCaptured(t, m, sb.ID, capture.COW)
	m.pipePool().Fill() // the refill persist started, done
	if r := run(t, m, sb.ID, pipeProbe); r.Stdout != "65536 61440\n" {
		t.Fatalf("after a copy-on-write checkpoint a new pipe gives %q (exit %d), want 65536 61440", r.Stdout, r.ExitCode)
	}
}
