package criu

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

func TestProbe(t *testing.T) {
	tool := realTool(t)
	ctx := testCtx(t)
	start := time.Now()
	f := tool.Probe(ctx)
	first := time.Since(start)
	t.Logf("probe %v: %+v", first.Round(time.Millisecond), f)
	if !strings.HasPrefix(f.Version, "4.2") {
		t.Errorf("version %q, want 4.2.x", f.Version)
	}
	if !f.VersionOK {
		t.Error("VersionOK false")
	}
	if !f.Check {
		t.Errorf("criu check failed: %s", f.CheckOutput)
	}
	if f.SelfTest != nil {
		t.Errorf("self-test: %v", f.SelfTest)
	}
	if f.SelfTestMS <= 0 {
		t.Errorf("self-test took %v ms", f.SelfTestMS)
	}
	// The RPC feature check agrees with `criu check --feature`.
	for feature, got := range map[string]bool{"uffd-noncoop": f.LazyPages, "mem_dirty_track": f.DirtyTrack} {
		want := exec.Command(DefaultPath, "check", "--feature", feature).Run() == nil
		if got != want {
			t.Errorf("%s: probe says %v, criu check --feature says %v", feature, got, want)
		}
	}

	start = time.Now()
	g := tool.Probe(ctx)
	if again := time.Since(start); again > time.Millisecond {
		t.Errorf("second probe took %v, want memoized", again)
	}
	if g != f {
		t.Errorf("second probe %+v differs from first %+v", g, f)
	}
}

func TestSelfTest(t *testing.T) {
	tool := realTool(t)
	start := time.Now()
	if err := tool.SelfTest(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("self-test %v", time.Since(start).Round(time.Millisecond))
}

func TestDumpRestore(t *testing.T) {
	for _, leave := range []bool{false, true} {
		t.Run("leave-running="+strconv.FormatBool(leave), func(t *testing.T) {
			tool := realTool(t)
			ctx := testCtx(t)
			c := startCounter(t, 1<<20)
			before := waitCount(t, c.port, 5)
			images, dumpWork, restoreWork := dirs3(t)

			var state byte
			ds, err := tool.Dump(ctx, DumpOptions{
				Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork, LeaveRunning: leave,
				PostDump: func() error {
					state = procState(t, c.pid())
					return nil
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if state != 't' {
				t.Errorf("process state %q at post-dump, want 't' (stopped by CRIU)", state)
			}
			t.Logf("dump %+v", ds)
			if ds.PagesWritten == 0 || ds.FrozenMS <= 0 || ds.TotalMS <= 0 {
				t.Errorf("dump stats %+v, want pages written and times", ds)
			}
			if _, err := os.Stat(filepath.Join(dumpWork, "dump.log")); err != nil {
				t.Errorf("no dump.log in the work dir: %v", err)
			}

			// The original keeps counting after a dump that leaves it
			// running; its restored copy starts again from the dump.
			later := -1
			if leave {
				later = waitCount(t, c.port, before+5)
			}
			dumpedAt := time.Now()
			c.kill() // dumped without LeaveRunning, CRIU killed it already; reap it.

			rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("restore %+v", rs.Stats)
			adopt(t, rs.Pid)
			if rs.Pid != c.pid() {
				t.Errorf("restored pid %d, dumped %d", rs.Pid, c.pid())
			}
			if pp := ppid(t, rs.Pid); pp != os.Getpid() {
				t.Errorf("restored with RstSibling: parent %d, want the test process %d", pp, os.Getpid())
			}
			if rs.Stats.TotalMS <= 0 || rs.Stats.RestoreMS <= 0 {
				t.Errorf("restore stats %+v", rs.Stats)
			}

			after := mustCount(t, c.port)
			steps := int(time.Since(dumpedAt)/(100*time.Millisecond)) + 3
			if after < before || (!leave && after > before+steps) {
				t.Errorf("restored count %d, want %d..%d: the dumped count", after, before, before+steps)
			}
			if leave && after >= later {
				t.Errorf("restored count %d, want below %d that the original reached after the dump", after, later)
			}
			waitCount(t, c.port, after+3) // and it goes on counting
		})
	}
}

// TestPostDumpFails: an error of PostDump fails the dump, comes back
// wrapped, and the tree goes on running.
func TestPostDumpFails(t *testing.T) {
	tool := realTool(t)
	c := startCounter(t, 1<<20)
	before := waitCount(t, c.port, 2)
	images, work, _ := dirs3(t)
	errSnap := errors.New("snapshot failed")
	_, err := tool.Dump(testCtx(t), DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: work, PostDump: func() error { return errSnap }})
	if !errors.Is(err, errSnap) {
		t.Fatalf("dump error %v, want the post-dump error", err)
	}
	t.Log(err)
	waitCount(t, c.port, before+2)
}

func TestLazyRestore(t *testing.T) {
	tool, ctx := lazyTool(t)
	c := startCounter(t, 20<<20)
	before := waitCount(t, c.port, 3)
	images, dumpWork, restoreWork := dirs3(t)
	if _, err := tool.Dump(ctx, DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork}); err != nil {
		t.Fatal(err)
	}
	c.kill()
	rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true, LazyPages: true})
	if err != nil {
		t.Fatal(err)
	}
	adopt(t, rs.Pid)
	restored := time.Now()
	if rs.LazyDone == nil {
		t.Fatal("lazy restore without LazyDone")
	}
	if after := mustCount(t, c.port); after < before {
		t.Errorf("restored count %d, want >= %d", after, before)
	}
	select {
	case err := <-rs.LazyDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("lazy-pages daemon still running after 30 s")
	}
	t.Logf("lazy restore returned in %.1f ms, all pages in %v later", rs.Stats.TotalMS, time.Since(restored).Round(time.Millisecond))
	waitCount(t, c.port, before+3)
}

// lazyTool is realTool where CRIU restores lazily, and a test context.
func lazyTool(t *testing.T) (*Tool, context.Context) {
	t.Helper()
	tool := realTool(t)
	ctx := testCtx(t)
	if f, err := tool.features(ctx); err != nil {
		t.Fatal(err)
	} else if !f.lazyPages {
		testutil.Unavailable(t, "lazy pages: "+f.lazyReason)
	}
	return tool, ctx
}

func TestDumpMissingPid(t *testing.T) {
	tool := realTool(t)
	images, work, _ := dirs3(t)
	pid := freePid(t)
	_, err := tool.Dump(testCtx(t), DumpOptions{Pid: pid, ImagesDir: images, WorkDir: work})
	if err == nil {
		t.Fatal("dump of a missing pid succeeded")
	}
	t.Log(err)
	msg := err.Error()
	if strings.Contains(msg, rlimitNoise) || !strings.Contains(msg, "Error (") || !strings.Contains(msg, strconv.Itoa(pid)) {
		t.Errorf("error %q does not give CRIU's real cause", msg)
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("error %v is not ErrNotFound", err)
	}
	var ce *Error
	if !errors.As(err, &ce) || ce.Log != filepath.Join(work, "dump.log") {
		t.Errorf("error %#v does not name the log", err)
	}
	if le := LogError(work); le != ce.Cause+" (log "+ce.Log+")" {
		t.Errorf("LogError = %q, want the error's cause %q and log", le, ce.Cause)
	}
}

// TestHang: a CRIU that never answers is killed at the deadline, with the
// hint about CRIU_FAULT.
func TestHang(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "criu")
	pidFile := filepath.Join(dir, "pid")
	script := "#!/bin/sh\necho $$ > " + pidFile + "\nsleep 60\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := New(fake).Dump(ctx, DumpOptions{Pid: os.Getpid(), ImagesDir: dir})
	took := time.Since(start)
	if err == nil {
		t.Fatal("dump with a hanging criu succeeded")
	}
	t.Log(err)
	if !strings.Contains(err.Error(), "CRIU_FAULT=130") || !strings.Contains(err.Error(), "timed out") {
		t.Errorf("error %q lacks the hang hint", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("error %v is not DeadlineExceeded and ErrUnavailable", err)
	}
	if took > 3*time.Second {
		t.Errorf("dump returned after %v, want soon after the 500 ms deadline", took)
	}
	b, _ := os.ReadFile(pidFile)
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Errorf("fake criu (pid %d) still runs", pid)
		}
	}
}

func TestCancel(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "criu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nsleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err := New(fake).Restore(ctx, RestoreOptions{ImagesDir: dir})
	if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "CRIU_FAULT") {
		t.Errorf("error %v, want a plain cancellation", err)
	}
}

func TestCacheKerndat(t *testing.T) {
	tool := realTool(t)
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "kdat")
	t.Cleanup(func() { uncacheKerndat(t, dir) })
	if err := tool.CacheKerndat(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if onTmpfs("/run") {
		if got := tool.kerndatCache(); got != kdatPath {
			t.Errorf("kerndat cache %q on a tmpfs /run, want %s", got, kdatPath)
		}
		// CRIU caches its kernel probe by itself there: nothing more
		// of CacheKerndat to check on this host.
		t.Log("/run is a tmpfs: CacheKerndat leaves CRIU's own cache alone")
		return
	}
	cache := filepath.Join(dir, kdatName)
	if target, err := os.Readlink(kdatPath); err != nil || target != cache {
		t.Fatalf("%s -> %q (%v), want %s", kdatPath, target, err, cache)
	}
	if got := tool.kerndatCache(); got != cache {
		t.Errorf("kerndatCache() = %q, want %s", got, cache)
	}
	st1, err := os.Stat(cache)
	if err != nil {
		t.Fatal(err)
	}

	// A second call keeps the cache; a removed link comes back with the
	// next call.
	if err := tool.CacheKerndat(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(cache); err != nil || !st2.ModTime().Equal(st1.ModTime()) {
		t.Errorf("second CacheKerndat rewrote the cache")
	}
	os.Remove(kdatPath)

	c := startCounter(t, 1<<20)
	images, work, _ := dirs3(t)
	if _, err := tool.Dump(ctx, DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: work, LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(work, "dump.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "Loaded kdat cache from "+kdatPath) {
		t.Error("CRIU did not load the kerndat cache")
	}
	if target, _ := os.Readlink(kdatPath); target != cache {
		t.Errorf("after the dump %s -> %q, want %s", kdatPath, target, cache)
	}
}

// uncacheKerndat undoes CacheKerndat(dir): the link, if it is still
// ours, and the tmpfs.
func uncacheKerndat(t testing.TB, dir string) {
	if target, err := os.Readlink(kdatPath); err == nil && target == filepath.Join(dir, kdatName) {
		os.Remove(kdatPath)
	}
	if onTmpfs(dir) {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	}
}

// BenchmarkDumpRestore dumps a Python process holding 20 MiB of random
// data and restores it, with CRIU probing the kernel on every call and
// with the kerndat cache.
func BenchmarkDumpRestore(b *testing.B) {
	realTool(b)
	python(b)
	for _, cached := range []bool{false, true} {
		name := "kerndat=reprobe"
		if cached {
			name = "kerndat=cached"
		}
		b.Run(name, func(b *testing.B) {
			tool := New(DefaultPath)
			if !cached && tool.kerndatCache() != "" {
				b.Skipf("CRIU loads a kerndat cache (%s) already", tool.kerndatCache())
			}
			if cached {
				dir := filepath.Join(b.TempDir(), "kdat")
				b.Cleanup(func() { uncacheKerndat(b, dir) })
				if err := tool.CacheKerndat(context.Background(), dir); err != nil {
					b.Fatal(err)
				}
			}
			benchDumpRestore(b, tool)
		})
	}
}

func benchDumpRestore(b *testing.B, tool *Tool) {
	ctx := context.Background()
	var dump, frozen, restore float64
	var pages uint64
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		c := startCounter(b, 20<<20)
		waitCount(b, c.port, 1)
		images, dumpWork, restoreWork := dirs3(b)
		b.StartTimer()
		ds, err := tool.Dump(ctx, DumpOptions{Pid: c.pid(), ImagesDir: images, WorkDir: dumpWork})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		c.kill()
		b.StartTimer()
		rs, err := tool.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if p, err := os.FindProcess(rs.Pid); err == nil {
			p.Kill()
			p.Wait()
		}
		pages = ds.PagesWritten
		dump += ds.TotalMS
		frozen += ds.FrozenMS
		restore += rs.Stats.TotalMS
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(dump/n, "dump-ms")
	b.ReportMetric(frozen/n, "frozen-ms")
	b.ReportMetric(restore/n, "restore-ms")
	b.Logf("%d runs: dump %.1f ms (frozen %.1f ms, %.1f MiB written), restore %.1f ms", b.N, dump/n, frozen/n, float64(pages)*4096/(1<<20), restore/n)
}
