package core

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/testutil"
)

// openUserNSManager is openManager with user namespaces on.
func openUserNSManager(t *testing.T) *Manager {
	t.Helper()
	testutil.RequireRoot(t)
	m, err := Open(context.Background(), Config{Root: t.TempDir(), PoolSize: 8 << 30, CacheDir: os.Getenv("MOLT_CACHE_DIR"), UserNS: true, StandbyBudget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if _, err := m.BuildImage(context.Background(), v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
		t.Fatal(err)
	}
	return m
}

// hostUID returns the real uid of pid as the host sees it.
func hostUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatalf("pid %d: no Uid line", pid)
	return -1
}

// checkMapped checks that sb's processes are root inside and the block's
// first uid on the host, that the image's files belong to root inside,
// and that a file root makes inside is stored as owned by host uid 0
// (the root is idmapped, never chowned).
func checkMapped(t *testing.T, m *Manager, id string) sandboxRec {
	t.Helper()
	rec, err := m.lookupSandbox(id)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.IDs.Enabled() || rec.IDs.Size != UserNSSize {
		t.Fatalf("sandbox %s has ids %v, want a block of %d", id, rec.IDs, UserNSSize)
	}
	r := run(t, m, id, "id -u; id -g; stat -c %u:%g /etc/passwd; touch /root/made; stat -c %u /root/made; cat /proc/self/uid_map")
	want := fmt.Sprintf("0\n0\n0:0\n0\n%10d %10d %10d\n", 0, rec.IDs.Base, rec.IDs.Size)
	if r.ExitCode != 0 || r.Stdout != want {
		t.Fatalf("inside %s: %+v; want stdout %q", id, r, want)
	}
	if uid := hostUID(t, rec.Init.Pid); uid != int(rec.IDs.Base) {
		t.Fatalf("host sees init of %s as uid %d, want %d", id, uid, rec.IDs.Base)
	}
	// Root binds a privileged port, in the namespace it started with
	// and in the fresh one a restore gives it alike.
	if r := run(t, m, id, `python3 -c 'import socket; socket.socket().bind(("127.0.0.1", 80))' && echo bound`); r.Stdout != "bound\n" {
		t.Fatalf("inside %s: bind port 80: %+v", id, r)
	}
	fi, err := os.Stat(m.sbRoot(id) + "/root/made")
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
		t.Fatalf("a file made by root inside is owned by host uid %d, want 0", st.Uid)
	}
	return rec
}

// TestUserNS: with user namespaces on, a sandbox's root is an
// unprivileged host uid of a block of its own (neighbours get different
// ones), and a full checkpoint (template capture), a warm and a hot
// rollback to it, a fork from it, hibernate, resume, stop and start keep the
// mapping; a process running as another user inside can be
// checkpointed (CRIU, host root, owns the namespace).
func TestUserNS(t *testing.T) {
	m := openUserNSManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	a, b := newSandbox(t, m), newSandbox(t, m)
	ra, rb := checkMapped(t, m, a.ID), checkMapped(t, m, b.ID)
	if ra.IDs == rb.IDs {
		t.Fatalf("neighbours share ids %v", ra.IDs)
	}
	// A process of another user, and one with enough memory for the
	// template capture (copies dumped and merged).
	run(t, m, a.ID, "X=before; setpriv --reuid=1000 --regid=1000 --clear-groups sleep 1000 >/dev/null 2>&1 &"+
		" python3 -c 'import time; b = bytearray(48 << 20); time.sleep(1000)' >/dev/null 2>&1 & sleep 1")
	ck, err := m.Checkpoint(ctx, a.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Capture != capture.Template {
		t.Errorf("capture %q (%s), want %q", ck.Capture, ck.CaptureNote, capture.Template)
	}
	run(t, m, a.ID, "X=after; rm /root/made")
	for _, tier := range []string{v1.TierWarm, v1.TierHot} {
		if tier == v1.TierHot {
			waitStandbyOf(t, m, a.ID, ck.ID)
		}
		res, err := m.RollbackWith(ctx, a.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: tier})
		if err != nil {
			t.Fatalf("rollback (tier %q): %v", tier, err)
		}
		if res.Tier != tier {
			t.Fatalf("rollback tier %s, want %s", res.Tier, tier)
		}
		if r := run(t, m, a.ID, "echo $X; pgrep -u 1000 -x sleep >/dev/null && echo uid1000; pgrep -x python3 >/dev/null && echo python"); r.Stdout != "before\nuid1000\npython\n" {
			t.Fatalf("after rollback (tier %s): %+v", res.Tier, r)
		}
		if rec := checkMapped(t, m, a.ID); rec.IDs != ra.IDs {
			t.Fatalf("rollback moved %s from ids %v to %v", a.ID, ra.IDs, rec.IDs)
		}
	}
	fk, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := fk.Sandboxes[0]
	if r := run(t, m, f.ID, "echo $X"); r.Stdout != "before\n" {
		t.Fatalf("fork: %+v", r)
	}
	// The images' namespace maps the origin's block.
	if rec := checkMapped(t, m, f.ID); rec.IDs != ra.IDs {
		t.Fatalf("fork from a full checkpoint has ids %v, want its origin's %v", rec.IDs, ra.IDs)
	}
	// Hibernate and resume (a restore with no process of the sandbox
	// left to take the map from).
	if _, err := m.Hibernate(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, f.ID, "echo $X"); r.Stdout != "before\n" {
		t.Fatalf("fork after resume: %+v", r)
	}
	checkMapped(t, m, f.ID)
	// A sandbox stopped and started afresh keeps its block.
	if _, err := m.Stop(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if rec := checkMapped(t, m, f.ID); rec.IDs != ra.IDs {
		t.Fatalf("restart moved %s to ids %v", f.ID, rec.IDs)
	}
	// A sandbox started afresh after a neighbour was removed takes a free
	// block, never one in use.
	if err := m.Remove(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	c := newSandbox(t, m)
	if rc := checkMapped(t, m, c.ID); rc.IDs == ra.IDs {
		t.Fatalf("new sandbox got ids %v, in use by %s", rc.IDs, a.ID)
	}
}
