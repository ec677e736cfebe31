package core

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/meta"
)

// TestStandbyOutsideLimits: a sandbox holding ~70% of its --memory and
// most of its --pids gets a standby (which holds as much again) without
// an OOM kill or a failed restore, rolls back hot, and its own
// processes are still held to its limits afterwards: allocating the
// whole --memory on top of what it holds does not succeed with the
// first allocation alive, and forking past --pids fails.
func TestStandbyOutsideLimits(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1 << 30
	// Plain copy capture: the template path is tested with the limits
	// by TestTemplateCopiesOutsideLimits.
	m.opts.noTemplateCapture, m.opts.noCOWCapture = true, true
	const (
		memLimit = 256 << 20
		pidLimit = 48
		held     = 180 // MiB, ~70%
	)
	ctx := context.Background()
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{MemoryBytes: memLimit, Pids: pidLimit}})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := cgroup.Load(testCgroup(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	// The python holds its memory (written, so charged) and tells when.
	run(t, m, sb.ID, `/usr/bin/python3 -c 'import time,sys
b = b"x" * (`+strconv.Itoa(held)+` << 20)
open("/tmp/held", "w").write("ok")
time.sleep(1e6)' >/dev/null 2>&1 & PY=$!`)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(run(t, m, sb.ID, "cat /tmp/held 2>/dev/null").Stdout, "ok"); {
		if time.Now().After(deadline) {
			t.Fatal("python never allocated its memory")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Sleepers up to ~75% of the pids limit.
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	n := pidLimit*3/4 - st.Pids
	run(t, m, sb.ID, "for i in $(seq "+strconv.Itoa(n)+"); do sleep 100000 & done")
	st, _ = cg.Stats()
	t.Logf("sandbox: %d MiB, %d tasks of %d", st.MemoryBytes>>20, st.Pids, pidLimit)

	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	standbyReady := func() {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); ; {
			m.pipe.wg.Wait()
			m.waitHot()
			if len(m.standbyCheckpoints(sb.ID)) > 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no standby within 60 s")
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	standbyReady()
	if k, err := cg.OOMKills(); err != nil || k != 0 {
		t.Fatalf("oom kills in the sandbox: %d (%v)", k, err)
	}
	if r := run(t, m, sb.ID, "kill -0 $PY && echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("the python died with the standby: %q %q", r.Stdout, r.Stderr)
	}

	run(t, m, sb.ID, "export X=after")
	res, err := m.Rollback(ctx, sb.ID, ck.ID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Tier != v1.TierHot {
		t.Fatalf("rollback tier %s, want hot", res.Tier)
	}
	if r := run(t, m, sb.ID, "echo X=$X; kill -0 $PY && echo alive"); r.Stdout != "X=\nalive\n" {
		t.Fatalf("after the rollback: %q %q", r.Stdout, r.Stderr)
	}
	standbyReady() // the next standby, holding as much again
	if k, _ := cg.OOMKills(); k != 0 {
		t.Fatalf("%d oom kills in the sandbox", k)
	}

	lim, _ := cg.Limits()
	st, _ = cg.Stats()
	t.Logf("with the standby: limits %+v, %d MiB charged, %d tasks", lim, st.MemoryBytes>>20, st.Pids)
	// The limits hold for the sandbox's own processes: a second python
	// wanting the whole limit does not get it while the first lives.
	r := run(t, m, sb.ID, `/usr/bin/python3 -c 'b = b"y" * (`+strconv.Itoa(memLimit>>20)+` << 20); print("allocated")' 2>&1; kill -0 $PY && echo first-alive`)
	if strings.Contains(r.Stdout, "allocated") && strings.Contains(r.Stdout, "first-alive") {
		lim, _ = cg.Limits()
		st, _ = cg.Stats()
		kills, _ := cg.OOMKills()
		for _, ck := range m.standbyCheckpoints(sb.ID) {
			s := m.sby.Get(sb.ID, ck)
			for _, tk := range s.Tasks {
				b, _ := os.ReadFile("/proc/" + strconv.Itoa(tk.Pid) + "/stat")
				t.Logf("standby %s task %d: %.60s", ck, tk.Pid, b)
			}
		}
		t.Fatalf("the sandbox held %d MiB + %d MiB under a %d MiB limit: %q; limits %+v, %d MiB charged, %d oom kills, standbys %v", held, memLimit>>20, memLimit>>20, r.Stdout, lim, st.MemoryBytes>>20, kills, m.standbyCheckpoints(sb.ID))
	}
	lim, _ = cg.Limits()
	st, _ = cg.Stats()
	kills, _ := cg.OOMKills()
	t.Logf("allocation past the limit: %q; then limits %+v, %d MiB charged, %d oom kills, standbys %v", r.Stdout, lim, st.MemoryBytes>>20, kills, m.standbyCheckpoints(sb.ID))
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, sb.ID, &rec); err != nil {
		t.Fatal(err)
	}
	tree, _, err := m.treePids(sb.ID, rec.Init)
	if err != nil {
		t.Fatal(err)
	}
	r = run(t, m, sb.ID, `/usr/bin/python3 -c 'import os,time
n = 0
while n < 100:
    try:
        p = os.fork()
    except OSError:
        break
    if p == 0:
        time.sleep(20); os._exit(0)
    n += 1
print(n)' 2>&1`)
	forked, err := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if err != nil {
		t.Fatalf("fork test: %q", r.Stdout)
	}
	// The live tree plus the forks may reach the limit, plus the one
	// task a restore spare may hold, no more.
	if len(tree)+1+forked > pidLimit+1 { // +1: the forking python
		t.Fatalf("the live tree of %d tasks forked %d more under a limit of %d", len(tree), forked, pidLimit)
	}
	t.Logf("the live tree of %d tasks forked %d more before pids.max", len(tree), forked)
}

// TestTemplateCopiesOutsideLimits: a template capture's copies of a tree
// holding ~70% of --memory (which it rewrites right after the thaw, so
// that every page is copied) and most of --pids do not count against
// them: the capture takes the template path, nothing is OOM-killed, and
// once the copies are dumped the limits are the sandbox's own again.
// (Without their room, the copies' clones exceed pids.max and the
// checkpoint fails: "clone ...: resource temporarily unavailable".)
func TestTemplateCopiesOutsideLimits(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	const memLimit, pidLimit = 256 << 20, 16
	ctx := context.Background()
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{MemoryBytes: memLimit, Pids: pidLimit}})
	if err != nil {
		t.Fatal(err)
	}
	cg, err := cgroup.Load(testCgroup(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	// Rewrites its 160 MiB over and over: after the copies are made,
	// every page it writes is a new one.
	run(t, m, sb.ID, `/usr/bin/python3 -c 'import time
b = bytearray(160 << 20)
for o in range(0, len(b), 4096):
    b[o] = 1
open("/tmp/held", "w").write("ok")
i = 0
while True:
    i += 1
    for o in range(0, len(b), 4096):
        b[o] = i & 0xff
    time.sleep(0.01)' >/dev/null 2>&1 & PY=$!`)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(run(t, m, sb.ID, "cat /tmp/held 2>/dev/null").Stdout, "ok"); {
		if time.Now().After(deadline) {
			t.Fatal("python never allocated its memory")
		}
		time.Sleep(100 * time.Millisecond)
	}
	run(t, m, sb.ID, "for i in $(seq 8); do sleep 100000 & done")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if ck.Capture != capture.Template {
		t.Fatalf("capture %q (%s), want template", ck.Capture, ck.CaptureNote)
	}
	if k, err := cg.OOMKills(); err != nil || k != 0 {
		t.Fatalf("oom kills in the sandbox: %d (%v)", k, err)
	}
	if r := run(t, m, sb.ID, "kill -0 $PY && echo alive"); r.Stdout != "alive\n" {
		t.Fatalf("the python died with the copies: %q", r.Stdout)
	}
	m.waitCopies(sb.ID)
	if lim, err := cg.Limits(); err != nil || lim.MemoryMax != memLimit || lim.PidsMax != pidLimit {
		t.Fatalf("limits after the copies were dumped: %+v (%v), want the sandbox's own", lim, err)
	}
}
