package core

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/hot"
	"github.com/molt-sh/molt/internal/ns"
)

// warmOnly opens a Manager for full checkpoints without standbys (every
// rollback is warm; a standby would also start spares) and creates a
// sandbox on it.
func warmOnly(t *testing.T) (*Manager, string) {
	t.Helper()
	m := openManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1
	sb, err := m.Create(context.Background(), v1.SandboxCreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	return m, sb.ID
}

// After a warm rollback the sandbox has a spare CRIU waiting in its
// cgroup; the next rollback runs on it (and a new one follows); stopping
// or removing the sandbox leaves none behind.
func TestSpareCRIU(t *testing.T) {
	m, sb := warmOnly(t)
	ctx := context.Background()
	run(t, m, sb, "export X=42")
	ck, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	spare := func() int {
		t.Helper()
		m.waitHot() // refills (and standby preparations) have run
		if e := m.spr.Ready(sb); e != nil {
			return e.S.Pid()
		}
		return 0
	}
	if p := spare(); p != 0 {
		t.Fatalf("spare %d before any restore", p)
	}
	procs := func() []int {
		t.Helper()
		cg, err := cgroup.Load(testCgroup(sb))
		if err != nil {
			t.Fatal(err)
		}
		pids, err := cg.Pids()
		if err != nil {
			t.Fatal(err)
		}
		return pids
	}
	var last int
	for i := 0; i < 2; i++ {
		run(t, m, sb, "export X=99")
		res, err := m.RollbackWith(ctx, sb, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm})
		if err != nil {
			t.Fatal(err)
		}
		if r := run(t, m, sb, "echo $X"); res.Tier != v1.TierWarm || r.Stdout != "42\n" {
			t.Fatalf("rollback %d: %+v, X=%q", i, res, r.Stdout)
		}
		p := spare()
		if p == 0 || p == last {
			t.Fatalf("rollback %d: spare %d (the one before: %d), want a new one", i, p, last)
		}
		if !slices.Contains(procs(), p) {
			t.Fatalf("rollback %d: spare %d is not in the sandbox's cgroup %v", i, p, procs())
		}
		if i == 1 {
			if _, err := os.Stat("/proc/" + strconv.Itoa(last)); err == nil {
				t.Fatalf("the spare %d the rollback ran on still exists", last)
			}
		}
		last = p
	}
	if _, err := m.Stop(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p := spare(); p != 0 {
		t.Fatalf("spare %d survived stop", p)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(last)); err == nil {
		t.Fatalf("spare process %d survived stop", last)
	}
	if pids := procs(); len(pids) != 0 {
		t.Fatalf("processes left in the cgroup after stop: %v", pids)
	}
}

// A full checkpoint leaves a writable copy of its files; the first warm
// rollback to it takes that copy, later ones snapshot the checkpoint's
// files, and both bring back the checkpoint's files, not the live ones.
func TestRollbackTakesWritableCopy(t *testing.T) {
	m, sb := warmOnly(t)
	ctx := context.Background()
	run(t, m, sb, "echo one > /f")
	ck, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(m.ckFSNext(ck.ID)); err != nil {
		t.Fatalf("no writable copy of the checkpoint's files: %v", err)
	}
	for i := 0; i < 2; i++ {
		run(t, m, sb, "echo two > /f; touch /g")
		if _, err := m.Rollback(ctx, sb, ck.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(m.ckFSNext(ck.ID)); err == nil {
			t.Fatalf("rollback %d: the writable copy is still there", i)
		}
		if r := run(t, m, sb, "cat /f; ls /g 2>&1 >/dev/null | wc -l"); r.Stdout != "one\n1\n" {
			t.Fatalf("rollback %d: files %q, want the checkpoint's", i, r.Stdout)
		}
		// The copy taken must not have been the checkpoint's own files.
		if b, err := os.ReadFile(filepath.Join(m.ckFS(ck.ID), "f")); err != nil || string(b) != "one\n" {
			t.Fatalf("rollback %d: checkpoint's file %q, %v", i, b, err)
		}
	}
}

// Checkpoints whose images carry the sandbox's network namespace (as
// molt made them before external_net) still roll back and fork, on the
// namespace CRIU restores; new ones restore into a fresh namespace. Both
// come back with loopback up and a listening socket that serves.
func TestNetnsInImagesStillRestores(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1 // warm rollbacks only
	ctx := context.Background()
	for _, inImages := range []bool{true, false} {
		m.hooks.netnsInImages = inImages
		sb := newSandbox(t, m)
		run(t, m, sb.ID, "export X=42")
		if _, _, err := m.Exec(ctx, sb.ID, v1.ExecRequest{Args: []string{"python3", "-c", serverScript}, Detach: true}); err != nil {
			t.Fatal(err)
		}
		waitServing(t, m, sb.ID)
		ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		rec, _ := m.lookupCheckpoint(ck.ID, "")
		if rec.ExternalNet == inImages || rec.ExternalUTS == inImages || rec.ExternalIPC == inImages {
			t.Fatalf("in images %v: external net %v, uts %v, ipc %v", inImages, rec.ExternalNet, rec.ExternalUTS, rec.ExternalIPC)
		}
		run(t, m, sb.ID, "export X=99")
		if _, err := m.Rollback(ctx, sb.ID, ck.ID); err != nil {
			t.Fatalf("in images %v: rollback: %v", inImages, err)
		}
		if r := run(t, m, sb.ID, "echo $X; hostname"); r.Stdout != "42\n"+sb.Hostname+"\n" {
			t.Fatalf("in images %v: X and hostname %q after rollback, want 42, %s", inImages, r.Stdout, sb.Hostname)
		}
		if !inImages {
			// Again, on the spare CRIU the first rollback left: the tree
			// joins the spare's namespaces, which it names.
			m.waitHot()
			haveSpare := m.spr.Ready(sb.ID) != nil
			if !haveSpare {
				t.Fatal("no spare after a warm rollback")
			}
			if _, err := m.Rollback(ctx, sb.ID, ck.ID); err != nil {
				t.Fatalf("rollback on the spare: %v", err)
			}
			if r := run(t, m, sb.ID, "echo $X; hostname"); r.Stdout != "42\n"+sb.Hostname+"\n" {
				t.Fatalf("X and hostname %q after a rollback on the spare, want 42, %s", r.Stdout, sb.Hostname)
			}
		}
		waitServing(t, m, sb.ID)
		res, err := m.Fork(ctx, ck.ID, v1.ForkRequest{N: 1})
		if err != nil {
			t.Fatalf("in images %v: fork: %v", inImages, err)
		}
		fork := res.Sandboxes[0]
		waitServing(t, m, fork.ID)
		if r := run(t, m, fork.ID, "hostname"); r.Stdout != fork.Hostname+"\n" || fork.Hostname == sb.Hostname {
			t.Fatalf("in images %v: fork's hostname %q, want its own %s", inImages, r.Stdout, fork.Hostname)
		}
	}
}

// serverScript serves "ok" on 127.0.0.1:8080.
const serverScript = `
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8080))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(b"ok")
    c.close()
`

// waitServing waits until the sandbox's server answers on loopback.
func waitServing(t *testing.T, m *Manager, sb string) {
	t.Helper()
	probe := `python3 -c 'import socket; print(socket.create_connection(("127.0.0.1", 8080), timeout=1).recv(2).decode())'`
	var last string
	for i := 0; i < 50; i++ {
		r := run(t, m, sb, probe+" 2>&1")
		if r.Stdout == "ok\n" {
			return
		}
		last = r.Stdout
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandbox %s: loopback server does not answer: %q", sb, last)
}

// System V IPC objects live in the sandbox's IPC namespace, not in any
// process: a checkpoint of a sandbox that holds some keeps the namespace
// in its images, and a rollback brings the objects back; one without
// leaves the namespace out and restores into an empty one. An object
// made after the check and before the freeze is kept too (the dump is
// retried with the namespace).
func TestSysVIPCKeepsNamespace(t *testing.T) {
	m, sb := warmOnly(t)
	ctx := context.Background()
	ck1, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb, "ipcmk -M 4096 >/dev/null")
	ck2, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	// Another segment appears between the check and the freeze.
	rec, _ := m.lookupSandbox(sb)
	var made atomic.Bool
	m.hooks.failpoint = func(step string) error {
		if step == "full:namespaces" && made.CompareAndSwap(false, true) {
			return ns.DoPid(rec.Init.Pid, unix.CLONE_NEWIPC, func() error {
				_, err := unix.SysvShmGet(unix.IPC_PRIVATE, 8192, unix.IPC_CREAT|0o600)
				return err
			})
		}
		return nil
	}
	run(t, m, sb, "ipcrm --all=shm")
	ck3, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	m.hooks.failpoint = nil
	if err != nil {
		t.Fatal(err)
	}
	if !made.Load() {
		t.Fatal("the failpoint did not run")
	}
	segments := "ipcs -m | awk '$1 ~ /^0x/ {print $5}' | sort | tr '\\n' ' '"
	for _, c := range []struct {
		id     string
		ipcOut bool
		want   string
	}{{ck1.ID, true, ""}, {ck2.ID, false, "4096 "}, {ck3.ID, false, "8192 "}, {ck1.ID, true, ""}} {
		r, _ := m.lookupCheckpoint(c.id, "")
		if r.ExternalIPC != c.ipcOut || !r.ExternalUTS || !r.ExternalNet {
			t.Fatalf("checkpoint %s: external ipc %v (want %v), uts %v, net %v", c.id, r.ExternalIPC, c.ipcOut, r.ExternalUTS, r.ExternalNet)
		}
		if _, err := m.Rollback(ctx, sb, c.id); err != nil {
			t.Fatal(err)
		}
		if got := run(t, m, sb, segments).Stdout; got != c.want {
			t.Fatalf("after rollback to %s: segments %q, want %q", c.id, got, c.want)
		}
	}
}

// After a full checkpoint a CRIU waits in the sandbox's namespaces for
// the next one, which runs on it (and leaves a new one); after a
// rollback (another tree, other namespaces) the stale one is not used;
// stopping the sandbox kills it.
func TestDumpSpare(t *testing.T) {
	m, sb := warmOnly(t)
	ctx := context.Background()
	dumpSpare := func() int {
		t.Helper()
		m.waitHot()
		if e := m.spr.Ready(hot.DumpKey(sb)); e != nil {
			return e.S.Pid()
		}
		return 0
	}
	inode := func(pid int, name string) uint64 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat("/proc/"+strconv.Itoa(pid)+"/ns/"+name, &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	if p := dumpSpare(); p != 0 {
		t.Fatalf("dump spare %d before any checkpoint", p)
	}
	run(t, m, sb, "export X=1")
	ck, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	first := dumpSpare()
	if first == 0 {
		t.Fatal("no dump spare after a full checkpoint")
	}
	rec, _ := m.lookupSandbox(sb)
	for _, name := range []string{"net", "uts", "ipc"} {
		if inode(first, name) != inode(rec.Init.Pid, name) {
			t.Fatalf("dump spare %d is not in the sandbox's %s namespace", first, name)
		}
	}
	run(t, m, sb, "export X=2")
	if _, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}); err != nil {
		t.Fatal(err)
	}
	second := dumpSpare()
	if second == 0 || second == first {
		t.Fatalf("dump spare after the second checkpoint: %d (first %d)", second, first)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(first)); err == nil {
		t.Fatalf("the dump spare %d the checkpoint ran on still exists", first)
	}
	// A rollback makes another tree in other namespaces: the checkpoint
	// after it must not run in the old ones (a spare is not started on
	// the rollback's account: on two CPUs it slowed hot rollbacks).
	if _, err := m.Rollback(ctx, sb, ck.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}); err != nil {
		t.Fatal(err)
	}
	third := dumpSpare()
	rec, _ = m.lookupSandbox(sb)
	if third == 0 || inode(third, "net") != inode(rec.Init.Pid, "net") {
		t.Fatalf("dump spare %d after the rollback is not in the new tree's namespace", third)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(second)); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stale dump spare %d still exists", second)
		}
	}
	if r := run(t, m, sb, "echo $X"); r.Stdout != "1\n" {
		t.Fatalf("X=%q after rollback", r.Stdout)
	}
	if _, err := m.Stop(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if p := dumpSpare(); p != 0 {
		t.Fatalf("dump spare %d survived stop", p)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(third)); err == nil {
		t.Fatalf("dump spare process %d survived stop", third)
	}
}
