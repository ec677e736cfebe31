package cgroup

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

// backend is one layout the suite runs against. Besides the host's own,
// a hybrid host also gets a pure-v2 layout rooted at its cgroup2 mount, so
// the v2 code paths run here too (without controllers).
type backend struct {
	name string
	l    *layout
}

// Preconditions: the caller has called testutil.RequireRoot.
func backends(t testing.TB) []backend {
	t.Helper()
	l, err := hostLayout()
	if err != nil {
		testutil.Unavailable(t, fmt.Sprintf("no cgroups: %v", err))
	}
	bs := []backend{{"host-" + l.mode, l}}
	if l.mode == modeV1Hybrid {
		u := l.hiers[len(l.hiers)-1]
		bs = append(bs, backend{"v2-on-unified", &layout{mode: modeV2, hiers: []hierarchy{u}}})
	}
	return bs
}

func forEachBackend(t *testing.T, f func(t *testing.T, l *layout)) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) { f(t, b.l) })
	}
}

func testName(t testing.TB) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "molt-test/" + hex.EncodeToString(b[:])
}

// newTest creates a cgroup in l and destroys it when the test ends.
func newTest(t testing.TB, l *layout, res Resources) *Cgroup {
	t.Helper()
	c, err := newIn(l, testName(t), res)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Destroy(ctx); err != nil {
			t.Errorf("Destroy: %v", err)
		}
	})
	return c
}

type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan error // Wait's result
}

// start runs args outside any test cgroup and kills it when the test ends.
func start(t testing.TB, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	// A process stopped by the v1 freezer cannot die until the cgroup's own
	// cleanup (Destroy, registered earlier, so run later) thaws it: do not
	// wait for it forever here.
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
		}
	})
	return p
}

// startIn starts args in c. The command first waits for a line on stdin,
// so it does nothing outside the cgroup.
func startIn(t testing.TB, c *Cgroup, script string) *proc {
	t.Helper()
	p := start(t, "sh", "-c", "read _; "+script)
	if err := c.Add(p.cmd.Process.Pid); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	return p
}

// cpuTicks returns utime+stime of pid, in clock ticks.
func cpuTicks(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	// After the command: state is field 3 of stat(5), utime 14, stime 15.
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	return utime + stime
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNewAddPids(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		c := newTest(t, l, Resources{})
		for _, dir := range c.dirs {
			if !isDir(dir) {
				t.Errorf("%s missing after New", dir)
			}
		}
		p := start(t, "sleep", "1000")
		pid := p.cmd.Process.Pid
		if err := c.Add(pid); err != nil {
			t.Fatalf("Add: %v", err)
		}
		pids, err := c.Pids()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pids, pid) {
			t.Errorf("Pids() = %v, want it to contain %d", pids, pid)
		}
		// The kernel agrees for every hierarchy.
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range l.hiers {
			var found bool
			for line := range strings.Lines(string(b)) {
				parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
				ctrl := strings.Split(parts[1], ",")
				match := h.unified && parts[1] == "" || len(h.controllers) > 0 && slices.Contains(ctrl, h.controllers[0])
				if match && parts[2] == "/"+c.Name()+"/"+Leaf {
					found = true
				}
			}
			if !found {
				t.Errorf("/proc/%d/cgroup has no %s entry for hierarchy %s:\n%s", pid, c.Name(), h.root, b)
			}
		}
		// v1 charges a process's memory to the cgroup it was in when the
		// pages were touched, so measure one that starts after Add.
		startIn(t, c, "exec sleep 1000")
		waitPids(t, c, 2)
		// The charge may reach the counter a moment after the exec.
		var st Stats
		for deadline := time.Now().Add(2 * time.Second); ; {
			st, err = c.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if st.MemoryBytes > 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st.Pids != 2 {
			t.Errorf("Stats().Pids = %d, want 2", st.Pids)
		}
		if c.memory != "" && (!c.v2 || fileExists(filepath.Join(c.memory, "memory.current"))) && st.MemoryBytes <= 0 {
			t.Errorf("Stats().MemoryBytes = %d, want > 0 with a memory controller", st.MemoryBytes)
		}
	})
}

func TestPublicAPI(t *testing.T) {
	testutil.RequireRoot(t)
	if m := Mode(); m != modeV2 && m != modeV1Hybrid && m != modeV1 {
		t.Fatalf("Mode() = %q on a host with cgroups", m)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &sfs); err == nil {
		if got, want := Mode() == modeV2, sfs.Type == unix.CGROUP2_SUPER_MAGIC; got != want {
			t.Errorf("Mode() = %q, but /sys/fs/cgroup cgroup2 magic = %v", Mode(), want)
		}
	}
	name := testName(t)
	c, err := New(name, Resources{MemoryMax: 64 << 20, PidsMax: 64})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = c.Destroy(context.Background()) })
	if c.Name() != name || !Exists(name) {
		t.Fatalf("Name() = %q, Exists = %v", c.Name(), Exists(name))
	}
	memFile := "memory.max"
	if Mode() != modeV2 {
		memFile = "memory.limit_in_bytes"
	}
	for file, want := range map[string]string{filepath.Join(c.memory, memFile): "67108864", filepath.Join(c.pids, "pids.max"): "64"} {
		if b, err := os.ReadFile(file); err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %s", file, b, err, want)
		}
	}

	c2, err := Load(name)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if c2.hasFreeze2 != c.hasFreeze2 || c2.hasKill2 != c.hasKill2 || !slices.Equal(c2.dirs, c.dirs) {
		t.Errorf("Load = %+v, New = %+v", c2, c)
	}
	p := startIn(t, c, "while :; do :; done")
	if err := c2.Freeze(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	assertFrozen(t, p.cmd.Process.Pid)
	if err := c2.Thaw(); err != nil {
		t.Fatal(err)
	}
	assertRunning(t, p.cmd.Process.Pid)
	if err := c2.Destroy(ctxT(t)); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if Exists(name) {
		t.Error("Exists after Destroy")
	}
	if _, err := Load(name); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load after Destroy: %v, want ErrNotFound", err)
	}
}

func TestLoadMissing(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		_, err := loadIn(l, testName(t))
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("Load of a missing cgroup: %v, want ErrNotFound", err)
		}
	})
}

func TestNewTwice(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		c := newTest(t, l, Resources{})
		if _, err := newIn(l, c.Name(), Resources{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("second New: %v, want ErrAlreadyExists", err)
		}
		// The failed New must not have touched the existing cgroup.
		for _, dir := range c.dirs {
			if !isDir(dir) {
				t.Errorf("%s removed by a failed New", dir)
			}
		}
	})
}

// A leftover directory in a secondary hierarchy blocks New, but Load still
// finds it, so Destroy can clean it up.
func TestLeftoverSecondary(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		if len(l.hiers) < 2 {
			t.Skip("single hierarchy")
		}
		name := testName(t)
		stale := filepath.Join(l.hiers[len(l.hiers)-1].root, name)
		if err := os.MkdirAll(stale, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(stale) })
		if _, err := newIn(l, name, Resources{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Fatalf("New over a leftover: %v, want ErrAlreadyExists", err)
		}
		if isDir(filepath.Join(l.hiers[0].root, name)) {
			t.Fatal("failed New left the primary directory")
		}
		c, err := loadIn(l, name)
		if err != nil {
			t.Fatalf("Load of a partial cgroup: %v", err)
		}
		if err := c.Destroy(ctxT(t)); err != nil {
			t.Fatalf("Destroy of a partial cgroup: %v", err)
		}
		if isDir(stale) {
			t.Error("Destroy left", stale)
		}
	})
}

// TestNewUndo forces each step of New to fail and checks nothing is left.
func TestNewUndo(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		var steps []string
		newHook = func(s string) error { steps = append(steps, s); return nil }
		t.Cleanup(func() { newHook = nil })
		res := Resources{}
		if l.mode != modeV2 {
			res = Resources{MemoryMax: 32 << 20, PidsMax: 10}
		}
		c, err := newIn(l, testName(t), res)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Destroy(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		injected := errors.New("injected")
		for _, failAt := range steps {
			name := testName(t)
			newHook = func(s string) error {
				if strings.Replace(s, name, "NAME", 1) == strings.Replace(failAt, c.Name(), "NAME", 1) {
					return injected
				}
				return nil
			}
			if _, err := newIn(l, name, res); !errors.Is(err, injected) {
				t.Fatalf("New failing at %q: %v", failAt, err)
			}
			for _, h := range l.hiers {
				if dir := filepath.Join(h.root, name); fileExists(dir) {
					t.Errorf("New failing at %q left %s", failAt, dir)
				}
			}
		}
		if len(steps) < len(l.hiers) {
			t.Errorf("steps = %q", steps)
		}
	})
}

func assertFrozen(t *testing.T, pid int) {
	t.Helper()
	before := cpuTicks(t, pid)
	time.Sleep(200 * time.Millisecond)
	if after := cpuTicks(t, pid); after != before {
		t.Errorf("frozen busy loop used %d ticks in 200ms", after-before)
	}
}

// assertRunning checks that the busy loop makes progress: 2 ticks of CPU
// within 5 s. On a loaded machine (a load of 12 on 2 cores) it got 1 in
// 200 ms; a frozen one gets none, however long it is given.
func assertRunning(t *testing.T, pid int) {
	t.Helper()
	before := cpuTicks(t, pid)
	deadline := time.Now().Add(5 * time.Second)
	for cpuTicks(t, pid)-before < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if after := cpuTicks(t, pid); after-before < 2 {
		t.Errorf("running busy loop used only %d ticks in 5s", after-before)
	}
}

// freezerNames are the freeze implementations the tests try.
var freezerNames = []string{"Freeze", "cgroup2", "v1-freezer"}

// freezer returns the freeze implementation called name, skipping t if c
// does not have it.
func freezer(t *testing.T, c *Cgroup, name string) func(context.Context) error {
	t.Helper()
	switch {
	case name == "Freeze":
		return c.Freeze
	case name == "cgroup2" && c.hasFreeze2:
		return c.freezeV2
	case name == "v1-freezer" && c.freezer != "":
		return c.freezeV1
	}
	t.Skipf("no %s freezer here", name)
	return nil
}

func TestFreezeThaw(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		for _, name := range freezerNames {
			t.Run(name, func(t *testing.T) {
				c := newTest(t, l, Resources{})
				freeze := freezer(t, c, name)
				p := startIn(t, c, "while :; do :; done")
				pid := p.cmd.Process.Pid
				assertRunning(t, pid)
				if err := freeze(ctxT(t)); err != nil {
					t.Fatalf("freeze: %v", err)
				}
				assertFrozen(t, pid)
				if err := c.Thaw(); err != nil {
					t.Fatalf("Thaw: %v", err)
				}
				assertRunning(t, pid)
			})
		}
	})
}

// A Freeze whose context is already over either wins the race and leaves
// the group frozen, or returns the context's error with the group thawed.
func TestFreezeCanceled(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		c := newTest(t, l, Resources{})
		p := startIn(t, c, "while :; do :; done")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		switch err := c.Freeze(ctx); {
		case err == nil:
			assertFrozen(t, p.cmd.Process.Pid)
			if err := c.Thaw(); err != nil {
				t.Fatal(err)
			}
		case !errors.Is(err, context.Canceled):
			t.Fatalf("Freeze: %v, want context.Canceled", err)
		}
		assertRunning(t, p.cmd.Process.Pid)
	})
}

// A cgroup2 freeze that cannot complete ends with its context and thaws
// again. On a hybrid host, a task held by the v1 freezer never reaches the
// cgroup2 freezer, which makes such a freeze: a view of the cgroup that
// knows only the cgroup2 hierarchy waits for it in vain.
func TestFreezeTimeout(t *testing.T) {
	testutil.RequireRoot(t)
	bs := backends(t)
	if len(bs) < 2 {
		t.Skip("needs a hybrid host to make a freeze that cannot complete")
	}
	c := newTest(t, bs[0].l, Resources{})
	p := startIn(t, c, "while :; do :; done")
	if err := c.freezeV1(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	v2only, err := loadIn(bs[1].l, c.Name())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	begin := time.Now()
	err = v2only.Freeze(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Freeze: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(begin); d > time.Second {
		t.Errorf("Freeze took %v to notice its deadline", d)
	}
	if b, err := os.ReadFile(filepath.Join(v2only.unified, "cgroup.freeze")); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Errorf("cgroup.freeze = %q, %v after a failed Freeze; want 0", b, err)
	}
	if err := c.Thaw(); err != nil {
		t.Fatal(err)
	}
	assertRunning(t, p.cmd.Process.Pid)
}

func TestKill(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		kills := []struct {
			name string
			kill func(*Cgroup, context.Context) error
		}{{"Kill", (*Cgroup).Kill}, {"freeze-kill-loop", (*Cgroup).killLoop}}
		for _, k := range kills {
			for _, fname := range append([]string{"running"}, freezerNames[1:]...) {
				t.Run(k.name+"/"+fname, func(t *testing.T) {
					c := newTest(t, l, Resources{})
					var freeze func(context.Context) error
					if fname != "running" {
						freeze = freezer(t, c, fname)
					}
					p := startIn(t, c, "for i in 1 2 3; do sleep 1000 & done; while :; do :; done")
					waitPids(t, c, 4)
					if freeze != nil {
						if err := freeze(ctxT(t)); err != nil {
							t.Fatal(err)
						}
					}
					if err := k.kill(c, ctxT(t)); err != nil {
						t.Fatalf("kill: %v", err)
					}
					if pids, err := c.allPids(); err != nil || len(pids) != 0 {
						t.Fatalf("after kill: pids %v, %v", pids, err)
					}
					select {
					case err := <-p.done:
						p.done <- err
						if err == nil || !strings.Contains(err.Error(), "killed") {
							t.Errorf("shell ended with %v, want killed", err)
						}
					case <-time.After(5 * time.Second):
						t.Error("shell still running after Kill")
					}
				})
			}
		}
	})
}

func waitPids(t *testing.T, c *Cgroup, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if pids, _ := c.Pids(); len(pids) >= n {
			return
		}
	}
	t.Fatalf("cgroup never held %d processes", n)
}

func TestDestroy(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		c := newTest(t, l, Resources{})
		startIn(t, c, "sleep 1000 & while :; do :; done")
		waitPids(t, c, 2)
		// A child cgroup, as a nested runtime would make in the
		// processes' own cgroup, goes too.
		for i, dir := range c.procs {
			if err := mkdirLeaf(l.hiers[i], filepath.Join(dir, "nested")); err != nil {
				t.Fatal(err)
			}
		}
		nested := startIn(t, c, "sleep 1000")
		for _, dir := range c.procs {
			if err := writeFile(filepath.Join(dir, "nested", "cgroup.procs"), strconv.Itoa(nested.cmd.Process.Pid)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Freeze(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		if err := c.Destroy(ctxT(t)); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		for _, h := range l.hiers {
			if dir := filepath.Join(h.root, c.Name()); fileExists(dir) {
				t.Errorf("%s still exists after Destroy", dir)
			}
		}
		if err := c.Destroy(ctxT(t)); err != nil {
			t.Errorf("second Destroy: %v", err)
		}
		if _, err := c.Pids(); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Pids after Destroy: %v, want ErrNotFound", err)
		}
	})
}

func TestPidsMax(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		c, err := newIn(l, testName(t), Resources{PidsMax: 5})
		if errors.Is(err, errdefs.ErrNotSupported) && l.mode == modeV2 && l.hiers[0].root != "/sys/fs/cgroup" {
			t.Skipf("no pids controller in this layout: %v", err)
		}
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		t.Cleanup(func() { _ = c.Destroy(context.Background()) })
		if b, err := os.ReadFile(filepath.Join(c.pids, "pids.max")); err != nil || strings.TrimSpace(string(b)) != "5" {
			t.Fatalf("pids.max = %q, %v", b, err)
		}
		p := start(t, "sh", "-c", "read _; for i in $(seq 20); do sleep 100 & done; wait")
		if err := c.Add(p.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		// Wait until the kernel has refused a fork, then count.
		var refused int64
		for deadline := time.Now().Add(10 * time.Second); refused == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			refused = c.PidsLimitHits()
		}
		if refused == 0 {
			t.Fatal("no fork was refused")
		}
		time.Sleep(100 * time.Millisecond)
		pids, err := c.Pids()
		if err != nil {
			t.Fatal(err)
		}
		cur, err := readInt(filepath.Join(c.pids, "pids.current"))
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) > 5 || cur > 5 {
			t.Errorf("%d processes, pids.current %d; want <= 5", len(pids), cur)
		}
		if len(pids) < 2 {
			t.Errorf("only %d processes: the shell could not fork at all", len(pids))
		}
		t.Logf("%d processes, %d forks refused", len(pids), refused)
	})
}

func TestDevicesV1(t *testing.T) {
	testutil.RequireRoot(t)
	l, err := hostLayout()
	if err != nil || l.mode == modeV2 {
		t.Skip("devices are only restricted on v1")
	}
	c := newTest(t, l, Resources{})
	b, err := os.ReadFile(filepath.Join(c.devices, "devices.list"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(got, allowedDevices) {
		t.Errorf("devices.list = %q, want %q", b, allowedDevices)
	}
	checkDevices(t, c)
}

// checkDevices runs a shell in c that opens an allowed and a denied device.
func checkDevices(t *testing.T, c *Cgroup) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `read _; (exec 3</dev/null) && echo null-ok; (exec 3</dev/kmsg) 2>/dev/null || echo kmsg-denied`)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if err := c.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(stdin, "go\n")
	var lines []string
	s := bufio.NewScanner(stdout)
	for s.Scan() {
		lines = append(lines, s.Text())
	}
	if want := []string{"null-ok", "kmsg-denied"}; !slices.Equal(lines, want) {
		t.Errorf("device access in the cgroup: %q, want %q", lines, want)
	}
}

func TestParseMountinfo(t *testing.T) {
	const hybrid = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	const v2 = `25 21 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
99 25 0:22 / /tmp/other\040place rw - cgroup2 cgroup2 rw
`
	const legacy = `37 31 0:34 / /cg/free\040zer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /cg/mem rw,relatime - cgroup cgroup rw,memory
`
	for _, tc := range []struct {
		name, in string
		want     *layout
	}{
		{"hybrid", hybrid, &layout{mode: modeV1Hybrid, hiers: []hierarchy{
			{root: "/sys/fs/cgroup/freezer", controllers: []string{"freezer"}},
			{root: "/sys/fs/cgroup/memory", controllers: []string{"memory"}},
			{root: "/sys/fs/cgroup/pids", controllers: []string{"pids"}},
			{root: "/sys/fs/cgroup/devices", controllers: []string{"devices"}},
			{root: "/sys/fs/cgroup/cpu,cpuacct", controllers: []string{"cpu", "cpuacct"}},
			{root: "/sys/fs/cgroup/cpuset", controllers: []string{"cpuset"}},
			{root: "/sys/fs/cgroup/systemd", controllers: []string{"name=systemd"}},
			{root: "/sys/fs/cgroup/unified", unified: true},
		}}},
		{"v2", v2, &layout{mode: modeV2, hiers: []hierarchy{{root: "/sys/fs/cgroup", unified: true}}}},
		{"v2-elsewhere", "99 25 0:22 / /tmp/other\\040place rw - cgroup2 cgroup2 rw\n",
			&layout{mode: modeV2, hiers: []hierarchy{{root: "/tmp/other place", unified: true}}}},
		{"legacy", legacy, &layout{mode: modeV1, hiers: []hierarchy{
			{root: "/cg/free zer", controllers: []string{"freezer"}},
			{root: "/cg/mem", controllers: []string{"memory"}},
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMountinfo(strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if _, err := parseMountinfo(strings.NewReader("1 0 8:1 / / rw - ext4 /dev/vda rw\n")); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("no cgroups: %v, want ErrNotSupported", err)
	}
}

func TestValidName(t *testing.T) {
	for _, name := range []string{"molt/abc", "x", "molt-test/0a1b"} {
		if err := validName(name); err != nil {
			t.Errorf("validName(%q) = %v", name, err)
		}
	}
	for _, name := range []string{"", "/molt/x", "../x", "molt/../../x", "molt//x", "molt/x/", ".", "a\nb"} {
		if err := validName(name); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("validName(%q) = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// Freeze must cope with a group the v1 freezer already holds, as a CRIU
// dump can leave it: the cgroup2 freezer would wait forever for tasks that
// cannot run.
func TestFreezeHeldByV1(t *testing.T) {
	testutil.RequireRoot(t)
	forEachBackend(t, func(t *testing.T, l *layout) {
		c := newTest(t, l, Resources{})
		if c.freezer == "" || !c.hasFreeze2 {
			t.Skip("needs both the v1 and the cgroup2 freezer")
		}
		p := startIn(t, c, "while :; do :; done")
		if err := c.freezeV1(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := c.Freeze(ctx); err != nil {
			t.Fatalf("Freeze of a v1-frozen group: %v", err)
		}
		assertFrozen(t, p.cmd.Process.Pid)
		if err := c.Thaw(); err != nil {
			t.Fatal(err)
		}
		assertRunning(t, p.cmd.Process.Pid)
	})
}

func TestParseCgroup2Mount(t *testing.T) {
	const hybrid = `25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
27 25 0:24 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
`
	m, err := parseCgroup2Mount(strings.NewReader(hybrid))
	if err != nil || m.dir != "/sys/fs/cgroup/unified" || !slices.Equal(m.super, []string{"nsdelegate", "memory_recursiveprot"}) ||
		m.flags != unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RELATIME {
		t.Fatalf("hybrid: %+v %v", m, err)
	}
	// The conventional place wins over an earlier, stray mount; ro and
	// escapes are handled.
	const two = `40 30 0:50 / /run/x\040y ro - cgroup2 cgroup2 ro
41 30 0:23 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,favordynmods
`
	m, err = parseCgroup2Mount(strings.NewReader(two))
	if err != nil || m.dir != "/sys/fs/cgroup" || !slices.Equal(m.super, []string{"favordynmods"}) || m.flags != 0 {
		t.Fatalf("v2: %+v %v", m, err)
	}
	m, err = parseCgroup2Mount(strings.NewReader("40 30 0:50 / /run/x\\040y ro - cgroup2 cgroup2 ro\n"))
	if err != nil || m.dir != "/run/x y" || len(m.super) != 0 || m.flags != unix.MS_RDONLY {
		t.Fatalf("escaped: %+v %v", m, err)
	}
	if _, err := parseCgroup2Mount(strings.NewReader("27 25 0:24 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n")); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Fatalf("v1 only: %v, want ErrNotSupported", err)
	}
}

// TestEnableDynMods turns favordynmods off and on again on the host's
// cgroup2 mount and checks that the mount's other options survive both
// remounts. It leaves the option as it found it.
func TestEnableDynMods(t *testing.T) {
	testutil.RequireRoot(t)
	superOpts := func() []string {
		m, err := readCgroup2Mount()
		if err != nil {
			testutil.Unavailable(t, fmt.Sprintf("no cgroup2 mount: %v", err))
		}
		return m.super
	}
	mountFlagsNow := func() uintptr {
		m, err := readCgroup2Mount()
		if err != nil {
			t.Fatal(err)
		}
		return m.flags
	}
	// Give the mount point the flags systemd gives it, so that the test
	// sees them survive; they are put back as they were at the end.
	orig, err := readCgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	restoreFlags := func() {
		if err := unix.Mount("none", orig.dir, "cgroup2", unix.MS_REMOUNT|orig.flags, strings.Join(superOpts(), ",")); err != nil {
			t.Errorf("restore the mount flags: %v", err)
		}
	}
	t.Cleanup(restoreFlags)
	if err := unix.Mount("none", orig.dir, "cgroup2", unix.MS_REMOUNT|orig.flags|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, strings.Join(orig.super, ",")); err != nil {
		t.Fatal(err)
	}
	flags := mountFlagsNow()
	if flags&unix.MS_NOEXEC == 0 {
		t.Fatalf("mount flags %#x after remounting with noexec", flags)
	}
	before := superOpts()
	wasOn := slices.Contains(before, FavorDynMods)
	others := slices.DeleteFunc(slices.Clone(before), func(o string) bool { return o == FavorDynMods })
	t.Cleanup(func() {
		if _, err := SetDynMods(wasOn); err != nil {
			t.Errorf("restoring favordynmods=%v: %v", wasOn, err)
		}
	})
	if changed, err := SetDynMods(false); err != nil || changed != wasOn {
		t.Fatalf("off: changed %v, %v", changed, err)
	}
	if st, err := DynMods(); err != nil || st.Enabled {
		t.Fatalf("after turning it off: %+v, %v", st, err)
	}
	if got := superOpts(); !slices.Equal(got, others) {
		t.Fatalf("options after turning it off: %q, want %q", got, others)
	}
	if got := mountFlagsNow(); got != flags {
		t.Fatalf("mount flags after turning it off: %#x, want %#x", got, flags)
	}
	if changed, err := EnableDynMods(); err != nil || !changed {
		t.Fatalf("on: changed %v, %v", changed, err)
	}
	if changed, err := EnableDynMods(); err != nil || changed {
		t.Fatalf("on again: changed %v, %v (want no change)", changed, err)
	}
	st, err := DynMods()
	if err != nil || !st.Enabled || st.Mount == "" {
		t.Fatalf("after turning it on: %+v, %v", st, err)
	}
	got := slices.DeleteFunc(superOpts(), func(o string) bool { return o == FavorDynMods })
	if !slices.Equal(got, others) {
		t.Fatalf("options after turning it on: %q, want %q and favordynmods", got, others)
	}
	if got := mountFlagsNow(); got != flags {
		t.Fatalf("mount flags after turning it on: %#x, want %#x", got, flags)
	}
}
