package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/remote"
	tu "github.com/molt-sh/molt/internal/testutil"
)

// heapHolder holds 80 MiB of random memory (lazy resume is for more
// than lazyMinBytes) and writes the SHA-256 of it
// to /tmp/h0 at the start, and to /tmp/h1 as it reads it again at each
// SIGUSR1.
const heapHolder = `
import hashlib, os, signal
heap = bytearray(os.urandom(80 << 20))
def put(name, v):
    with open('/tmp/' + name + '.tmp', 'w') as f:
        f.write(v)
    os.rename('/tmp/' + name + '.tmp', '/tmp/' + name)
put('h0', hashlib.sha256(heap).hexdigest())
signal.signal(signal.SIGUSR1, lambda *a: put('h1', hashlib.sha256(heap).hexdigest()))
put('pid', str(os.getpid()))
while True:
    signal.pause()
`

// heapSandbox starts heapHolder in a new sandbox of m, and returns the
// sandbox and the SHA-256 of the heap.
func heapSandbox(t *testing.T, m *Manager) (meta.Sandbox, string) {
	t.Helper()
	sb := newSandbox(t, m)
	if err := os.WriteFile(filepath.Join(m.sbRoot(sb.ID), "heap.py"), []byte(heapHolder), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, m, sb.ID, "python3 /heap.py >/dev/null 2>&1 &")
	waitHostFile(t, filepath.Join(m.sbRoot(sb.ID), "tmp", "pid"))
	return sb, waitHostFile(t, filepath.Join(m.sbRoot(sb.ID), "tmp", "h0"))
}

// waitFile waits for file p and returns its content.
func waitHostFile(t *testing.T, p string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(p); err == nil {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not come", p)
		}
	}
}

// eventually waits up to a minute for cond.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: %s", what)
		}
	}
}

// TestLazyResumeFromStore resumes a sandbox holding 80 MiB of random
// memory on a second host from the store, lazily: its memory reads back
// exactly, the checkpoint becomes local and verifies thoroughly. Then a
// page of its next checkpoint is damaged in the store: the lazy resume
// on the first host kills the tree rather than let it run on that page,
// and the checkpoint stays in the store only.
func TestLazyResumeFromStore(t *testing.T) {
	bucket := testBucket(t)
	m, second := trustingHosts(t, bucket)
	requireCRIU(t, m)
	ctx := context.Background()
	if !m.criu.Probe(ctx).LazyPages {
		tu.Unavailable(t, "CRIU cannot restore lazily here (uffd-noncoop)")
	}
	sb, h0 := heapSandbox(t, m)
	if _, err := m.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := m.Offload(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	head := got.Head

	m2 := second()
	start := time.Now()
	if _, err := m2.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	root2 := m2.sbRoot(sb.ID)
	run(t, m2, sb.ID, "rm -f /tmp/h1; kill -USR1 $(cat /tmp/pid)")
	if h1 := waitHostFile(t, filepath.Join(root2, "tmp", "h1")); h1 != h0 {
		t.Fatalf("the resumed process's memory hashes to %s, it was %s", h1, h0)
	}
	eventually(t, "the lazily fetched checkpoint is local", func() bool {
		ck, err := m2.CheckpointInfo(head)
		return err == nil && !ck.Offloaded
	})
	if n := counterValue(m2.metrics.lazy.WithLabelValues("ok")); n != 1 {
		t.Fatalf("%v lazy resumes ended well, want 1", n)
	}
	if _, err := m2.VerifyCheckpoint(head); err != nil {
		t.Fatalf("the checkpoint fetched lazily: %v", err)
	}
	t.Logf("lazy resume on the second host: %v", took.Round(time.Millisecond))

	// A damaged page in the store.
	if _, err := m2.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	rec, err := m2.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	head2 := rec.Head
	pm, err := criu.ReadPageMap(m2.cks.Images(head2))
	if err != nil {
		t.Fatal(err)
	}
	// A lazy page whose block (of lazyBlock bytes) holds no page the
	// restore reads itself.
	var lazyPages uint64
	for _, r := range pm.Lazy() {
		lazyPages += r.Pages
	}
	if lazyPages < (80<<20)/criu.PageSize {
		t.Fatalf("%d lazy pages: fewer than the heap's", lazyPages)
	}
	eager := func(img string, block uint64) bool {
		for _, r := range pm.Eager() {
			lo, hi := r.Index*criu.PageSize/lazyBlock, ((r.Index+r.Pages)*criu.PageSize-1)/lazyBlock
			if r.Image == img && block >= lo && block <= hi {
				return true
			}
		}
		return false
	}
	var victim criu.PageRun
	for _, r := range pm.Lazy() {
		if r.Pages > victim.Pages && !eager(r.Image, (r.Index+r.Pages/2)*criu.PageSize/lazyBlock) {
			victim = r
		}
	}
	if victim.Pages == 0 {
		t.Fatal("no lazy page away from the pages the restore reads")
	}
	if _, err := m2.Offload(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r, err := m2.store.Recipe(ctx, head2)
	if err != nil {
		t.Fatal(err)
	}
	damage(t, bucket, r, ckstore.ImagesDir+"/"+victim.Image, int64(victim.Index+victim.Pages/2)*criu.PageSize+100)

	if _, err := m.Resume(ctx, sb.ID); err != nil {
		// Refused before the restore ran (the damaged page was among
		// the first fetched), or before the resume returned (the
		// prefetch found it first): the tree never ran on it.
		if !strings.Contains(err.Error(), "not the page dumped") {
			t.Fatal(err)
		}
		t.Logf("refused: %v", err)
		if got, err := m.Sandbox(ctx, sb.ID); err != nil || got.State == v1.StateRunning {
			t.Fatalf("after a refused resume: %+v, %v", got, err)
		}
		return
	}
	_, _ = m.SessionRun(ctx, sb.ID, "t", v1.SessionRunRequest{Command: "rm -f /tmp/h1; kill -USR1 $(cat /tmp/pid)"})
	eventually(t, "the lazy resume failed", func() bool {
		return counterValue(m.metrics.lazy.WithLabelValues("failed")) == 1
	})
	if b, err := os.ReadFile(filepath.Join(m.sbRoot(sb.ID), "tmp", "h1")); err == nil && string(b) != h0 {
		t.Fatalf("the tree ran on the damaged page: its memory hashed to %s, not %s", b, h0)
	}
	eventually(t, "the tree is gone", func() bool {
		got, err := m.Sandbox(ctx, sb.ID)
		return err == nil && got.State == v1.StateLost
	})
	if ck, err := m.CheckpointInfo(head2); err != nil || !ck.Offloaded {
		t.Fatalf("the damaged checkpoint: %+v, %v; want it in the store only", ck, err)
	}
}

// damage flips a byte of object name of recipe r at offset off in the
// pack that holds it.
func damage(t *testing.T, b interface {
	Get(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)
	Put(ctx context.Context, key string, r io.Reader, size int64) error
}, r remote.Recipe, name string, off int64) {
	t.Helper()
	ctx := context.Background()
	for _, o := range r.Objects {
		if o.Name != name {
			continue
		}
		var at int64
		for _, e := range o.Extents {
			if off >= at+e.Len {
				at += e.Len
				continue
			}
			pack := r.Packs[e.P]
			key := "packs/" + pack[:2] + "/" + pack
			rc, err := b.Get(ctx, key, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatal(err)
			}
			data[e.Off+off-at] ^= 0xff
			if err := b.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no byte %d of %s in the recipe", off, name)
}

// counterValue is the value of counter c.
func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return -1
	}
	return d.GetCounter().GetValue()
}

// TestLazyMarkerAtStart: a daemon that stopped while a sandbox's memory
// was being fetched lazily left its marker; the next start kills that
// sandbox's tree (its tasks could be reading zero pages since) and
// leaves another sandbox running.
func TestLazyMarkerAtStart(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	hit, spared := newSandbox(t, m), newSandbox(t, m)
	for _, sb := range []string{hit.ID, spared.ID} {
		run(t, m, sb, "sleep 1000 >/dev/null 2>&1 &")
	}
	if err := os.WriteFile(m.lazyMarker(hit.ID), []byte("0123456789ab"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A daemon restart: the sandboxes run on, the pool stays mounted.
	m.Close()
	m, err := Open(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	eventually(t, "the marked sandbox's tree is gone", func() bool {
		got, err := m.Sandbox(ctx, hit.ID)
		return err == nil && got.State == v1.StateLost
	})
	if got, err := m.Sandbox(ctx, spared.ID); err != nil || got.State != v1.StateRunning {
		t.Fatalf("the other sandbox: %+v, %v", got, err)
	}
	if _, err := os.Stat(m.lazyMarker(hit.ID)); !os.IsNotExist(err) {
		t.Fatalf("the marker stays: %v", err)
	}
}

// TestLazyResumeLocal resumes a hibernated sandbox holding 80 MiB of
// random memory from the local pool, lazily: its memory reads back
// exactly, the lazy-pages daemon ends with every page, and the sandbox
// hibernates and resumes again (its next checkpoint taken from memory
// that came lazily).
func TestLazyResumeLocal(t *testing.T) {
	m, sb, h0 := lazyHeapSandbox(t)
	ctx := context.Background()
	for round := 1; round <= 2; round++ {
		if _, err := m.Hibernate(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := m.Resume(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		run(t, m, sb.ID, "rm -f /tmp/h1; kill -USR1 $(cat /tmp/pid)")
		if h1 := waitHostFile(t, filepath.Join(m.sbRoot(sb.ID), "tmp", "h1")); h1 != h0 {
			t.Fatalf("round %d: the resumed process's memory hashes to %s, it was %s", round, h1, h0)
		}
		eventually(t, "the lazy-pages daemon has every page", func() bool {
			return counterValue(m.metrics.localLazy.WithLabelValues("ok")) == float64(round)
		})
		if _, err := os.Stat(m.lazyMarker(sb.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: the lazy marker stays: %v", round, err)
		}
		t.Logf("round %d: lazy resume from the pool: %v", round, took.Round(time.Millisecond))
	}
	if n := counterValue(m.metrics.localLazy.WithLabelValues("failed")); n != 0 {
		t.Fatalf("%v local lazy resumes failed", n)
	}
}

// TestLazyResumeDaemonDies: a daemon that dies during a lazy resume
// (here: its end of the page server's socket closed, and its guard's
// pipe closed without the word that the resume is over, which is what
// its death does) leaves no task of the tree running on memory that
// never came: the guard kills the tree while CRIU's lazy-pages daemon
// still holds the tree's memory, so the process that was hashing its
// heap, its pages held back, never writes a hash.
func TestLazyResumeDaemonDies(t *testing.T) {
	m, sb, h0 := lazyHeapSandbox(t)
	ctx := context.Background()
	if _, err := m.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	// Pages are served until the test says stop: the tree resumes, and
	// its heap, which it does not touch, stays in the lazy-pages daemon.
	var holding atomic.Bool
	release := make(chan struct{})
	m.hooks.lazyRead = func() {
		if holding.Load() {
			<-release
		}
	}
	defer close(release)
	if _, err := m.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var lf *lazyFetch
	m.lazyMu.Lock()
	for f := range m.lazies {
		lf = f
	}
	m.lazyMu.Unlock()
	if lf == nil {
		t.Fatal("no lazy resume under way")
	}
	holding.Store(true)
	h1 := filepath.Join(m.sbRoot(sb.ID), "tmp", "h1")
	_ = os.Remove(h1)
	cg, err := cgroup.Load(testCgroup(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	pids, err := cg.Pids()
	if err != nil || len(pids) == 0 {
		t.Fatalf("the resumed tree: %v %v", pids, err)
	}
	// The python hashes its heap: it faults on pages the lazy-pages
	// daemon has not got yet.
	py := 0
	for _, p := range pids {
		// (Its command line is in its memory, which is held back.)
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); strings.HasPrefix(string(b), "python3") {
			py = p
		}
	}
	if py == 0 {
		var names []string
		for _, p := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p))
			names = append(names, strings.TrimSpace(string(b)))
		}
		t.Fatalf("no python among the tree's processes %v %q", pids, names)
	}
	if err := unix.Kill(py, unix.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	// The daemon dies.
	lf.mu.Lock()
	lf.closed = true
	lf.ours.Close()
	g := lf.guard
	lf.mu.Unlock()
	if g == nil {
		t.Fatal("the lazy resume has no guard")
	}
	g.end(false)
	eventually(t, "the guard killed the tree", func() bool {
		p, err := cg.Pids()
		return err == nil && len(p) == 0
	})
	if b, err := os.ReadFile(h1); err == nil && string(b) != h0 {
		t.Fatalf("a task ran on memory that never came: its heap hashed to %s, it was %s", b, h0)
	}
}

// lazyHeapSandbox opens a manager whose CRIU restores lazily, with a
// heapSandbox in it.
func lazyHeapSandbox(t *testing.T) (*Manager, meta.Sandbox, string) {
	t.Helper()
	m := openManager(t)
	requireCRIU(t, m)
	if !m.criu.Probe(context.Background()).LazyPages {
		tu.Unavailable(t, "CRIU cannot restore lazily here (uffd-noncoop)")
	}
	sb, h0 := heapSandbox(t, m)
	return m, sb, h0
}

// BenchmarkLazyGuard: what a lazy resume's guard adds to the resume:
// its start (fork and exec of the daemon's binary) and its release.
func BenchmarkLazyGuard(b *testing.B) {
	m := openManager(b)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	sock := os.NewFile(uintptr(fds[0]), "page server")
	defer sock.Close()
	defer unix.Close(fds[1])
	for b.Loop() {
		g, err := m.startLazyGuard("molt-bench-none", sock)
		if err != nil {
			b.Fatal(err)
		}
		g.release()
	}
}
