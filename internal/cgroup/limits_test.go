package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/testutil"
)

func TestParseMountinfoEveryHierarchy(t *testing.T) {
	const in = `32 31 0:29 / /sys/fs/cgroup/net_cls,net_prio rw - cgroup cgroup rw,net_cls,net_prio
33 31 0:30 / /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio
34 31 0:31 / /sys/fs/cgroup/perf_event rw - cgroup cgroup rw,perf_event
35 31 0:32 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
36 31 0:33 / /sys/fs/cgroup/hugetlb rw - cgroup cgroup rw,hugetlb,release_agent=/x
37 31 0:32 / /mnt/freezer-again rw - cgroup cgroup rw,freezer
38 31 0:34 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
`
	got, err := parseMountinfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := &layout{mode: modeV1, hiers: []hierarchy{
		{root: "/sys/fs/cgroup/freezer", controllers: []string{"freezer"}},
		{root: "/sys/fs/cgroup/blkio", controllers: []string{"blkio"}},
		{root: "/sys/fs/cgroup/hugetlb", controllers: []string{"hugetlb"}},
		{root: "/sys/fs/cgroup/net_cls,net_prio", controllers: []string{"net_cls", "net_prio"}},
		{root: "/sys/fs/cgroup/perf_event", controllers: []string{"perf_event"}},
		{root: "/sys/fs/cgroup/systemd", controllers: []string{"name=systemd"}},
	}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

// hostCgroupLines reads /proc/PID/cgroup as the host sees it.
func hostCgroupLines(t testing.TB, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestEveryHierarchy: a process Add put in the cgroup is in the
// cgroup's leaf in every hierarchy the kernel lists for it; none is left
// at the host's root (cpuset, blkio, name=systemd were).
func TestEveryHierarchy(t *testing.T) {
	testutil.RequireRoot(t)
	l, err := hostLayout()
	if err != nil {
		testutil.Unavailable(t, fmt.Sprintf("no cgroups: %v", err))
	}
	c := newTest(t, l, Resources{})
	p := start(t, "sleep", "1000")
	if err := c.Add(p.cmd.Process.Pid); err != nil {
		t.Fatalf("Add: %v", err)
	}
	lines := hostCgroupLines(t, p.cmd.Process.Pid)
	want := "/" + c.Name() + "/" + Leaf
	for _, line := range lines {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			t.Fatalf("bad line %q", line)
		}
		if parts[2] != want {
			t.Errorf("hierarchy %q: process at %s, want %s", parts[1], parts[2], want)
		}
	}
	// cpuset: the new cpuset got cpus and mems (the process could not
	// have joined otherwise), the same as the host's.
	for _, h := range l.hiers {
		if !slices.Contains(h.controllers, "cpuset") {
			continue
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			root, _ := os.ReadFile(filepath.Join(h.root, f))
			leaf, _ := os.ReadFile(filepath.Join(h.root, c.Name(), Leaf, f))
			if strings.TrimSpace(string(leaf)) == "" || string(leaf) != string(root) {
				t.Errorf("%s of the leaf %q, host's %q", f, leaf, root)
			}
		}
	}
	t.Logf("%d hierarchies: %q", len(lines), lines)
}

// TestLimitsAboveLeaf: the limits are in the cgroup, the processes one
// level down, in its leaf, whose own files do not raise them.
func TestLimitsAboveLeaf(t *testing.T) {
	testutil.RequireRoot(t)
	l, err := hostLayout()
	if err != nil {
		testutil.Unavailable(t, fmt.Sprintf("no cgroups: %v", err))
	}
	c := newTest(t, l, Resources{PidsMax: 8})
	if c.pids == "" {
		testutil.Unavailable(t, "no pids controller")
	}
	// The leaf's own limit says nothing: the parent's holds.
	if err := writeFile(filepath.Join(c.pids, Leaf, "pids.max"), "max"); err != nil {
		t.Fatal(err)
	}
	startIn(t, c, "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do sleep 100 & done 2>/dev/null; sleep 100")
	for deadline := time.Now().Add(10 * time.Second); c.PidsLimitHits() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no fork was refused")
		}
	}
	if n, _ := readInt(filepath.Join(c.pids, "pids.current")); n > 8 {
		t.Errorf("pids.current %d above the parent's limit 8", n)
	}
	procs, _ := os.ReadFile(filepath.Join(c.pids, "cgroup.procs"))
	if strings.TrimSpace(string(procs)) != "" {
		t.Errorf("processes in the limits' cgroup itself: %q", procs)
	}
}

func TestCPULimit(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		probe := l.cgroup("probe")
		if probe.cpu == "" {
			testutil.Unavailable(t, "no cpu controller in this layout")
		}
		c, err := newIn(l, testName(t), Resources{CPUMillis: 1500})
		if err != nil && c == nil && l.mode == modeV2 && l.hiers[0].root != "/sys/fs/cgroup" {
			t.Skipf("no cpu controller in this layout: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Destroy(ctxT(t)) })
		if c.v2 {
			b, _ := os.ReadFile(filepath.Join(c.cpu, "cpu.max"))
			if got := strings.TrimSpace(string(b)); got != "150000 100000" {
				t.Errorf("cpu.max = %q, want 150000 100000", got)
			}
		} else {
			q, _ := readInt(filepath.Join(c.cpu, "cpu.cfs_quota_us"))
			per, _ := readInt(filepath.Join(c.cpu, "cpu.cfs_period_us"))
			if q != 150000 || per != 100000 {
				t.Errorf("cfs quota %d period %d, want 150000 100000", q, per)
			}
		}
		if lim, err := c.Limits(); err != nil || lim.CPUMillis != 1500 {
			t.Errorf("Limits() = %+v, %v; want 1500 millicpus", lim, err)
		}
		if err := c.SetLimits(Resources{}); err != nil {
			t.Fatal(err)
		}
		if lim, _ := c.Limits(); lim.CPUMillis != 0 {
			t.Errorf("after SetLimits(none): %d millicpus", lim.CPUMillis)
		}
	})
}

// TestIOWeight sets an I/O weight where the host has a weight file and
// checks that a host without one refuses it clearly.
func TestIOWeight(t *testing.T) {
	testutil.RequireRoot(t)
	l, err := hostLayout()
	if err != nil {
		testutil.Unavailable(t, fmt.Sprintf("no cgroups: %v", err))
	}
	c := newTest(t, l, Resources{})
	path, _ := c.ioWeightFile()
	if path == "" {
		if err := c.SetLimits(Resources{IOWeight: 500}); err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Fatalf("io weight without a weight file: %v, want not supported", err)
		}
		t.Logf("no I/O weight file here (blkio %q)", c.blkio)
		return
	}
	if err := c.SetLimits(Resources{IOWeight: 500}); err != nil {
		t.Fatal(err)
	}
	t.Logf("weight file %s", path)
	if lim, err := c.Limits(); err != nil || lim.IOWeight != 500 {
		t.Errorf("Limits() = %+v, %v; want io weight 500 in %s", lim, err, path)
	}
}

// TestEnforce changes limits behind the cgroup's back and sees Enforce
// report and restore each.
func TestEnforce(t *testing.T) {
	testutil.RequireRoot(t)
	l, err := hostLayout()
	if err != nil {
		testutil.Unavailable(t, fmt.Sprintf("no cgroups: %v", err))
	}
	res := Resources{PidsMax: 100}
	probe := l.cgroup("probe")
	if probe.memory != "" {
		res.MemoryMax = 64<<20 + 100 // not page-aligned: the kernel rounds
	}
	if probe.cpu != "" {
		res.CPUMillis = 250
	}
	c := newTest(t, l, res)
	if d, err := c.Enforce(res); err != nil || len(d) != 0 {
		t.Fatalf("fresh cgroup: drifts %v, %v", d, err)
	}
	if err := writeFile(filepath.Join(c.pids, "pids.max"), "max"); err != nil {
		t.Fatal(err)
	}
	wantDrift := []string{"pids"}
	if c.cpu != "" && !c.v2 {
		if err := writeFile(filepath.Join(c.cpu, "cpu.cfs_quota_us"), "-1"); err != nil {
			t.Fatal(err)
		}
		wantDrift = append(wantDrift, "cpu")
	}
	if c.devices != "" && !c.v2 {
		if err := writeFile(filepath.Join(c.devices, "devices.allow"), "c 1:11 rwm"); err != nil {
			t.Fatal(err)
		}
		wantDrift = append(wantDrift, "devices")
	}
	d, err := c.Enforce(res)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range d {
		got = append(got, x.Limit)
	}
	if !slices.Equal(got, wantDrift) {
		t.Errorf("drifts %v, want %v", d, wantDrift)
	}
	if n, _ := readLimit(filepath.Join(c.pids, "pids.max")); n != 100 {
		t.Errorf("pids.max after Enforce: %d", n)
	}
	if d, err := c.Enforce(res); err != nil || len(d) != 0 {
		t.Errorf("after Enforce: drifts %v, %v", d, err)
	}
	if c.devices != "" && !c.v2 {
		checkDevices(t, c)
	}
	t.Logf("found and restored: %v", d)
}

func TestDefaultCPUPeriod(t *testing.T) {
	if CPUPeriodUs*MinCPUMillis/1000 < 1000 {
		t.Fatalf("MinCPUMillis %d gives a quota below the kernel's 1 ms", MinCPUMillis)
	}
}

func TestReadLimit(t *testing.T) {
	dir := t.TempDir()
	for in, want := range map[string]int64{
		"max\n": 0, "-1\n": 0, "9223372036854771712\n": 0, "4096\n": 4096,
		"default 100\n": 100, "default 250\n8:0 100\n": 250,
	} {
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, []byte(in), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := readLimit(p); err != nil || got != want {
			t.Errorf("readLimit(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}
