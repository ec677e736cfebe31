package core

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
)

// maskProbe prints, for each masked path this kernel has, what a
// sandbox sees there: directories empty and read-only, files empty, and
// the read-only /proc paths not writable.
const maskProbe = `for p in /proc/acpi /proc/asound /proc/scsi /sys/firmware /sys/devices/virtual/powercap /sys/devices/virtual/tpm; do
  [ -d $p ] && echo "$p entries=$(ls -A $p | wc -l) $(mkdir $p/x 2>/dev/null && echo writable || echo ro)"
done
for p in /proc/kcore /proc/keys /proc/interrupts /proc/timer_list /proc/sched_debug /proc/latency_stats /proc/timer_stats; do
  [ -e $p ] && echo "$p bytes=$(head -c 64 $p 2>/dev/null | wc -c)"
done
for p in /proc/sys/kernel/hostname /proc/sysrq-trigger; do
  (echo x > $p) 2>/dev/null && echo "$p writable" || echo "$p ro"
done
awk '$5 == "/proc/acpi" || $5 == "/sys/firmware" { print "mount", $5, "root=" $4, $(NF-2) }' /proc/self/mountinfo | sort
true`

// TestMasksSurviveCheckpoints: a sandbox sees runc's masked and
// read-only paths as masked, and so do its restored trees: after a warm
// rollback, a fork and a hibernation.
func TestMasksSurviveCheckpoints(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	want := run(t, m, sb.ID, maskProbe).Stdout
	t.Logf("masks:\n%s", want)
	for _, p := range []string{"/proc/acpi", "/sys/firmware"} {
		if _, err := os.Stat(p); err == nil && !strings.Contains(want, p+" entries=0 ro") {
			t.Errorf("%s is not masked by an empty read-only directory", p)
		}
	}
	// The directory masks cost CRIU nothing: binds of an empty sysfs
	// directory, not a tmpfs (archived by every dump and restore).
	if strings.Contains(want, "mount ") && strings.Contains(want, " tmpfs") {
		t.Errorf("a directory is masked with a tmpfs")
	}
	for _, line := range strings.Split(strings.TrimSpace(want), "\n") {
		if strings.Contains(line, "writable") || (strings.Contains(line, "bytes=") && !strings.HasSuffix(line, "bytes=0")) {
			t.Errorf("not masked: %s", line)
		}
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	if got := run(t, m, sb.ID, maskProbe).Stdout; got != want {
		t.Errorf("after a warm rollback:\n%s\nwant\n%s", got, want)
	}
	forks, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := run(t, m, forks.Sandboxes[0].ID, maskProbe).Stdout; got != want {
		t.Errorf("in a fork:\n%s\nwant\n%s", got, want)
	}
	if _, err := m.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := run(t, m, sb.ID, maskProbe).Stdout; got != want {
		t.Errorf("after hibernation:\n%s\nwant\n%s", got, want)
	}
}

// TestRestoreRefusesPlantedSymlink: between a full checkpoint and a
// rollback to it, a mountpoint or a bind mount's source in the
// checkpoint's files is replaced by a symlink to a host path; the
// restore is refused with an error naming it, before CRIU mounts
// anything there, and the sandbox runs on as it was.
func TestRestoreRefusesPlantedSymlink(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "null"), []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, target string }{
		{"dev/pts", host},
		{"dev/null", filepath.Join(host, "null")},
		{"proc", host},
	} {
		t.Run(tc.path, func(t *testing.T) {
			run(t, m, sb.ID, "echo before > /tmp/mark")
			ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
			if err != nil {
				t.Fatal(err)
			}
			run(t, m, sb.ID, "echo after > /tmp/mark")
			// What the check costs a restore, on the untouched files.
			const reps = 100
			t0 := time.Now()
			for range reps {
				if err := criu.CheckMounts(m.ckImages(ck.ID), m.ckFS(ck.ID)); err != nil {
					t.Fatalf("the untouched checkpoint: %v", err)
				}
			}
			t.Logf("criu.CheckMounts: %v per restore", time.Since(t0)/reps)
			// In the checkpoint's files, and in the writable copy a
			// rollback takes if it is there.
			plant := func(root string) {
				p := filepath.Join(root, tc.path)
				if err := os.RemoveAll(p); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(tc.target, p); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := os.Stat(m.ckFSNext(ck.ID)); err == nil {
				plant(m.ckFSNext(ck.ID))
			}
			if err := fsnap.SetReadonly(m.ckFS(ck.ID), false); err != nil {
				t.Fatal(err)
			}
			plant(m.ckFS(ck.ID))
			if err := fsnap.SetReadonly(m.ckFS(ck.ID), true); err != nil {
				t.Fatal(err)
			}
			_, err = m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm})
			if err == nil {
				t.Fatalf("rollback onto a root with %s -> %s succeeded; the sandbox sees /proc/kcore as %q",
					tc.path, tc.target, run(t, m, sb.ID, "head -c 64 /proc/kcore; ls /dev/pts | head -3").Stdout)
			}
			if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "/"+tc.path) || !strings.Contains(err.Error(), "symlink") {
				t.Fatalf("rollback: %v; want a refusal naming /%s", err, tc.path)
			}
			t.Logf("refused: %v", err)
			if got := run(t, m, sb.ID, "cat /tmp/mark").Stdout; got != "after\n" {
				t.Fatalf("after the refused rollback the sandbox reads %q", got)
			}
		})
	}
}
