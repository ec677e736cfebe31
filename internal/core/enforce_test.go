package core

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/meta"
)

// v1Dir is the directory of sandbox id's cgroup in the v1 hierarchy
// mounted at /sys/fs/cgroup/<ctrl> ("" when there is none: a v2 host).
func v1Dir(id, ctrl string) string {
	d := filepath.Join("/sys/fs/cgroup", ctrl, testCgroup(id))
	if _, err := os.Stat(d); err != nil {
		return ""
	}
	return d
}

// limitFile reads a sandbox's limit file: the v1 one when the host has
// the v1 hierarchy, else the v2 one.
func limitFile(t *testing.T, id, v1ctrl, v1file, v2file string) string {
	t.Helper()
	dir, file := v1Dir(id, v1ctrl), v1file
	if dir == "" {
		dir, file = filepath.Join("/sys/fs/cgroup", testCgroup(id)), v2file
	}
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		t.Fatalf("read %s limit: %v", v1ctrl, err)
	}
	return strings.TrimSpace(string(b))
}

// checkHierarchies checks, from the host, that every process of the
// sandbox is in the sandbox's leaf cgroup in every hierarchy, and, from
// inside, that the sandbox sees that cgroup as its root.
func checkHierarchies(t *testing.T, m *Manager, id, when string) {
	t.Helper()
	cg, err := cgroup.Load(testCgroup(id))
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cg.Pids()
	if err != nil || len(pids) == 0 {
		t.Fatalf("%s: pids %v, %v", when, pids, err)
	}
	want := "/" + testCgroup(id) + "/" + cgroup.Leaf
	for _, pid := range pids {
		if exiting(pid) {
			// The kernel shows an exiting task at "/" in v1
			// hierarchies (the old tree of a rollback, a helper).
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil || exiting(pid) {
			continue // exited meanwhile
		}
		for line := range strings.Lines(strings.TrimSpace(string(b))) {
			parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
			if len(parts) == 3 && parts[2] != want {
				t.Errorf("%s: pid %d in hierarchy %q at %s, want %s", when, pid, parts[1], parts[2], want)
			}
		}
	}
	// Inside: a cgroup namespace rooted at the leaf.
	r := run(t, m, id, "cat /proc/self/cgroup")
	for line := range strings.Lines(strings.TrimSpace(r.Stdout)) {
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 || parts[2] != "/" {
			t.Errorf("%s: the sandbox sees %q in /proc/self/cgroup, want its own cgroup as /", when, line)
		}
	}
}

// sandboxLimitsOK checks that the sandbox's cgroup holds its limits res
// (plus the rooms of the daemon's processes in it, as they are now).
// exiting reports whether pid is gone or exiting (PF_EXITING in the
// flags of /proc/PID/stat).
func exiting(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return true
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err != nil || flags&0x4 != 0 || f[0] == "Z" || f[0] == "X"
}

func sandboxLimitsOK(t *testing.T, m *Manager, id string, res meta.Resources, when string) {
	t.Helper()
	cg, err := cgroup.Load(testCgroup(id))
	if err != nil {
		t.Fatal(err)
	}
	// Read together with the rooms they hold: rooms are lent and given
	// back, limits written, under m.lim.mu, and background work (a
	// standby's preparation) may lend one at any time.
	m.lim.mu.Lock()
	got, err := cg.Limits()
	want := m.withRoomsLocked(id, res)
	m.lim.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	want.MemoryMax &^= int64(os.Getpagesize() - 1)
	got.IOWeight = want.IOWeight
	if got != want {
		t.Errorf("%s: limits %+v, want %+v", when, got, want)
	}
}

// TestDefaultLimits: a sandbox created without limits gets the
// daemon's defaults, recorded (the API shows them) and written into its
// cgroup; an explicit -1 gets none; the built-in defaults are sane.
func TestDefaultLimits(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()

	sb := newSandbox(t, m)
	want := meta.Resources{MemoryBytes: DefaultMemory(), Pids: DefaultPids, CPUMillis: DefaultCPUMillis()}
	if sb.Resources != want {
		t.Errorf("built-in defaults: %+v, want %+v", sb.Resources, want)
	}
	if DefaultMemory() > 4<<30 || DefaultMemory() < 64<<20 {
		t.Errorf("default memory %d", DefaultMemory())
	}
	if got := limitFile(t, sb.ID, "pids", "pids.max", "pids.max"); got != strconv.Itoa(DefaultPids) {
		t.Errorf("pids.max %s, want %d", got, DefaultPids)
	}
	if v1Dir(sb.ID, "cpu") != "" {
		if got := limitFile(t, sb.ID, "cpu", "cpu.cfs_quota_us", ""); got != strconv.Itoa(runtime.NumCPU()*100000) {
			t.Errorf("cpu.cfs_quota_us %s, want %d", got, runtime.NumCPU()*100000)
		}
	}
	sandboxLimitsOK(t, m, sb.ID, sb.Resources, "built-in defaults")

	m.cfg.DefaultResources = meta.Resources{MemoryBytes: 300 << 20, Pids: 200, CPUMillis: 500}
	sb2 := newSandbox(t, m)
	if sb2.Resources.MemoryBytes != 300<<20 || sb2.Resources.Pids != 200 || sb2.Resources.CPUMillis != 500 {
		t.Errorf("daemon defaults: %+v", sb2.Resources)
	}
	if v1Dir(sb2.ID, "cpu") != "" {
		if got := limitFile(t, sb2.ID, "cpu", "cpu.cfs_quota_us", ""); got != "50000" {
			t.Errorf("cpu.cfs_quota_us %s, want 50000 (0.5 CPU)", got)
		}
	} else if got := limitFile(t, sb2.ID, "", "", "cpu.max"); got != "50000 100000" {
		t.Errorf("cpu.max %s, want 50000 100000", got)
	}
	got, err := m.Sandbox(ctx, sb2.ID)
	if err != nil || got.Resources != sb2.Resources {
		t.Errorf("inspect: %+v, %v; want %+v", got.Resources, err, sb2.Resources)
	}

	sb3, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{MemoryBytes: -1, Pids: -1, CPUMillis: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if got := limitFile(t, sb3.ID, "pids", "pids.max", "pids.max"); got != "max" {
		t.Errorf("unlimited: pids.max %s", got)
	}
	sandboxLimitsOK(t, m, sb3.ID, sb3.Resources, "unlimited")

	if _, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{Pids: -2}}); err == nil {
		t.Error("pids -2 accepted")
	}
}

// TestForkBombContained: a fork bomb run by exec in a sandbox with the
// daemon's default pids limit stays at that limit; a neighbour and the
// daemon keep working, and the bomb's sandbox can be removed.
func TestForkBombContained(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	const limit = 64
	m.cfg.DefaultResources = meta.Resources{Pids: limit, CPUMillis: 500}
	bomb := newSandbox(t, m)
	m.cfg.DefaultResources = meta.Resources{}
	neighbour := newSandbox(t, m)
	cg, err := cgroup.Load(testCgroup(bomb.ID))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Exec(ctx, bomb.ID, v1.ExecRequest{Args: []string{"/bin/bash", "-c", `f() { f | f & }; f`}, Detach: true}); err != nil {
		t.Fatal(err)
	}
	var refused int64
	for deadline := time.Now().Add(60 * time.Second); refused == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no fork was refused in 60 s")
		}
		refused = cg.PidsLimitHits()
	}
	time.Sleep(500 * time.Millisecond)
	st, err := cg.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Pids > limit {
		t.Errorf("%d processes in the bomb's sandbox, limit %d", st.Pids, limit)
	}
	t.Logf("bomb: %d processes, %d forks refused", st.Pids, refused)
	if r := run(t, m, neighbour.ID, "echo ok"); r.Stdout != "ok\n" {
		t.Errorf("neighbour: %q %q", r.Stdout, r.Stderr)
	}
	if _, err := m.Checkpoint(ctx, neighbour.ID, v1.CheckpointRequest{}); err != nil {
		t.Errorf("neighbour checkpoint: %v", err)
	}
	if err := m.Remove(ctx, bomb.ID); err != nil {
		t.Fatalf("remove the bomb's sandbox: %v", err)
	}
}

// TestMemoryHogOOMKilled: a process allocating beyond the sandbox's
// default memory limit is OOM-killed in the sandbox; the sandbox, a
// neighbour and the daemon keep working.
func TestMemoryHogOOMKilled(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	m.cfg.DefaultResources = meta.Resources{MemoryBytes: 128 << 20}
	hog := newSandbox(t, m)
	m.cfg.DefaultResources = meta.Resources{}
	neighbour := newSandbox(t, m)
	run(t, m, neighbour.ID, "export N=alive")
	r := run(t, m, hog.ID, `/usr/bin/python3 -c 'b = bytearray(512 << 20); print("allocated")' 2>&1; echo "exit=$?"`)
	if strings.Contains(r.Stdout, "allocated") || !strings.Contains(r.Stdout, "exit=137") {
		t.Errorf("512 MiB under a 128 MiB limit: %q", r.Stdout)
	}
	cg, err := cgroup.Load(testCgroup(hog.ID))
	if err != nil {
		t.Fatal(err)
	}
	if k, err := cg.OOMKills(); err != nil || k < 1 {
		t.Errorf("oom kills %d, %v", k, err)
	}
	if r := run(t, m, hog.ID, "echo still"); r.Stdout != "still\n" {
		t.Errorf("the hog's sandbox after the kill: %q", r.Stdout)
	}
	if r := run(t, m, neighbour.ID, "echo $N"); r.Stdout != "alive\n" {
		t.Errorf("neighbour: %q", r.Stdout)
	}
	if _, err := m.Checkpoint(ctx, neighbour.ID, v1.CheckpointRequest{}); err != nil {
		t.Errorf("neighbour checkpoint: %v", err)
	}
}

// TestLimitsTampered: pids.max changed behind the daemon's back (as a
// sandbox that reached its limits' cgroup would) is found at the next
// checkpoint, written back, logged, counted and shown in the sandbox;
// cpu and devices changed are found at the next restore.
func TestLimitsTampered(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{Pids: 300}})
	if err != nil {
		t.Fatal(err)
	}
	cg, _ := cgroup.Load(testCgroup(sb.ID))
	pidsDir := v1Dir(sb.ID, "pids")
	if pidsDir == "" {
		pidsDir = filepath.Join("/sys/fs/cgroup", testCgroup(sb.ID))
	}
	if err := os.WriteFile(filepath.Join(pidsDir, "pids.max"), []byte("max"), 0); err != nil {
		t.Fatal(err)
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := limitFile(t, sb.ID, "pids", "pids.max", "pids.max"); got != "300" {
		t.Errorf("pids.max after the checkpoint: %s, want 300 (restored)", got)
	}
	got, err := m.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.LimitsTampered != 1 || got.LastTampered == nil || got.LastTampered.When != "checkpoint" ||
		!slices.ContainsFunc(got.LastTampered.Limits, func(s string) bool { return strings.HasPrefix(s, "pids: want 300, found unlimited") }) {
		t.Errorf("sandbox after tampering: %d, %+v", got.LimitsTampered, got.LastTampered)
	}
	var mt dto.Metric
	if err := m.tamperCounter().WithLabelValues("pids").Write(&mt); err != nil || mt.GetCounter().GetValue() != 1 {
		t.Errorf("molt_limits_tampered_total{limit=pids} = %v, %v", mt.GetCounter().GetValue(), err)
	}

	var wantLimits []string
	if d := v1Dir(sb.ID, "cpu"); d != "" {
		if err := os.WriteFile(filepath.Join(d, "cpu.cfs_quota_us"), []byte("-1"), 0); err != nil {
			t.Fatal(err)
		}
		wantLimits = append(wantLimits, "cpu")
	}
	if d := v1Dir(sb.ID, "devices"); d != "" {
		if err := os.WriteFile(filepath.Join(d, "devices.allow"), []byte("c 1:11 rwm"), 0); err != nil {
			t.Fatal(err)
		}
		wantLimits = append(wantLimits, "devices")
	}
	if len(wantLimits) == 0 {
		return
	}
	if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
		t.Fatal(err)
	}
	got, _ = m.Sandbox(ctx, sb.ID)
	if got.LimitsTampered != 2 || got.LastTampered == nil || got.LastTampered.When != "restore" || len(got.LastTampered.Limits) != len(wantLimits) {
		t.Errorf("after tampering with %v: %d, %+v", wantLimits, got.LimitsTampered, got.LastTampered)
	}
	sandboxLimitsOK(t, m, sb.ID, got.Resources, "after the restore")
	if lst, _ := os.ReadFile(filepath.Join(v1Dir(sb.ID, "devices"), "devices.list")); strings.Contains(string(lst), "c 1:11") {
		t.Errorf("devices still open: %s", lst)
	}
	_ = cg
}

// TestLimitsAcrossCheckpoints: the limits and the placement in every
// hierarchy (and the cgroup namespace) hold after a full checkpoint, a
// warm rollback, a hot one, a hibernation and resume, and in a fork.
func TestLimitsAcrossCheckpoints(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	m.cfg.StandbyBudget = 1 << 30
	ctx := context.Background()
	res := meta.Resources{MemoryBytes: 512 << 20, Pids: 500, CPUMillis: 1500}
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources(res)})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "sleep 100000 & export X=1")
	checkHierarchies(t, m, sb.ID, "created")
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	sandboxLimitsOK(t, m, sb.ID, res, "after the checkpoint")
	for _, tier := range []string{v1.TierWarm, v1.TierHot} {
		if tier == v1.TierHot {
			for deadline := time.Now().Add(60 * time.Second); len(m.standbyCheckpoints(sb.ID)) == 0; time.Sleep(50 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no standby in 60 s")
				}
			}
		}
		run(t, m, sb.ID, "export X=2")
		rr, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: tier})
		if err != nil {
			t.Fatal(err)
		}
		if rr.Tier != tier {
			t.Errorf("rollback tier %s, want %s", rr.Tier, tier)
		}
		if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "1\n" {
			t.Errorf("%s rollback: X=%q", tier, r.Stdout)
		}
		sandboxLimitsOK(t, m, sb.ID, res, tier+" rollback")
		checkHierarchies(t, m, sb.ID, tier+" rollback")
	}
	if _, err := m.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	sandboxLimitsOK(t, m, sb.ID, res, "resume")
	checkHierarchies(t, m, sb.ID, "resume")
	// A fork restored by CRIU (one adopting the source's standby keeps
	// the source's cgroup namespace: docs/architecture.md, Limits).
	m.dropStandby(sb.ID, false)
	fr, err := m.Fork(ctx, sb.ID, v1.ForkRequest{Checkpoint: ck.ID, N: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := fr.Sandboxes[0]
	if f.Resources != sb.Resources {
		t.Errorf("fork's limits %+v, want its source's %+v", f.Resources, sb.Resources)
	}
	sandboxLimitsOK(t, m, f.ID, res, "fork")
	checkHierarchies(t, m, f.ID, "fork")
	if r := run(t, m, f.ID, "echo $X"); r.Stdout != "1\n" {
		t.Errorf("fork: X=%q", r.Stdout)
	}
}

// TestSandboxCannotLiftLimits: root in a user namespace of the
// sandbox's own, with a cgroup namespace and a cgroupfs mount of its
// own, reaches only its leaf cgroup; the limits one level up hold (the
// host once read pids.max "max" after this).
func TestSandboxCannotLiftLimits(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{Pids: 100, MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	mount := "mount -t cgroup -o pids none /tmp/cg"
	if v1Dir(sb.ID, "pids") == "" {
		mount = "mount -t cgroup2 none /tmp/cg"
	}
	r := run(t, m, sb.ID, `mkdir -p /tmp/cg; unshare -U -r -C -m sh -c '`+mount+` && echo max > /tmp/cg/pids.max; echo wrote=$?; cat /tmp/cg/pids.max; ls /tmp/cg | head -3' 2>&1`)
	t.Logf("inside: %q", r.Stdout)
	if got := limitFile(t, sb.ID, "pids", "pids.max", "pids.max"); got != "100" {
		t.Errorf("the sandbox lifted its pids limit: pids.max %s, want 100", got)
	}
	if r := run(t, m, sb.ID, "for i in $(seq 150); do sleep 1000 & done 2>/dev/null; sleep 0.5; ls /proc | grep -c '^[0-9]'"); r.ExitCode == 0 {
		if n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout)); n > 100 {
			t.Errorf("%d processes in a sandbox limited to 100", n)
		}
	}
}
