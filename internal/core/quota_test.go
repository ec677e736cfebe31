package core

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/testutil"
	"golang.org/x/sys/unix"
)

// fillFromInside writes up to mib MiB into path inside the sandbox and
// returns dd's output and exit status line.
func fillFromInside(t *testing.T, m *Manager, sb, path string, mib int) string {
	t.Helper()
	return run(t, m, sb, "dd if=/dev/zero of="+path+" bs=1M count="+itoa(mib)+" conv=fsync 2>&1; echo rc=$?").Stdout
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		if n /= 10; n == 0 {
			return string(b[i:])
		}
	}
}

// neighbourWorks checks that checkpoints, rollback and fork of sandbox
// sb work. With writes, it writes /mark itself; else /mark must hold
// "one" already (sandboxes that filled the pool leave none to write).
func neighbourWorks(t *testing.T, m *Manager, sb string, writes bool) {
	t.Helper()
	ctx := context.Background()
	if writes {
		run(t, m, sb, "echo one > /mark")
	}
	ck, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFS})
	if err != nil {
		t.Fatalf("neighbour's fs checkpoint: %v", err)
	}
	if _, err := m.criuReady(ctx); err == nil {
		if _, err := m.Checkpoint(ctx, sb, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true}); err != nil {
			t.Fatalf("neighbour's full checkpoint: %v", err)
		}
	}
	if writes {
		run(t, m, sb, "echo two > /mark")
	}
	if _, err := m.Rollback(ctx, sb, ck.ID); err != nil {
		t.Fatalf("neighbour's rollback: %v", err)
	}
	if got := run(t, m, sb, "cat /mark").Stdout; got != "one\n" {
		t.Fatalf("neighbour after rollback: %q", got)
	}
	res, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID})
	if err != nil {
		t.Fatalf("neighbour's fork: %v", err)
	}
	for _, f := range res.Sandboxes {
		if got := run(t, m, f.ID, "cat /mark").Stdout; got != "one\n" {
			t.Fatalf("neighbour's fork: %q", got)
		}
		if err := m.Remove(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPoolFillContained: a sandbox with no quota of its own that writes
// until it can no more is stopped with EDQUOT/ENOSPC before the
// reserve, and its neighbour's checkpoints, rollback and fork still
// work (before quotas, it filled the pool and every neighbour's
// checkpoint was refused).
func TestPoolFillContained(t *testing.T) {
	m := openSmallManager(t, t.TempDir(), 2<<30, 256<<20)
	if m.quota.why != "" {
		testutil.Unavailable(t, "disk quotas: "+m.quota.why)
	}
	a, b := newSandbox(t, m), newSandbox(t, m)
	run(t, m, b.ID, "echo one > /mark")
	out := fillFromInside(t, m, a.ID, "/big", 4096)
	t.Logf("filling the pool from a sandbox: %s", out)
	if strings.Contains(out, "rc=0") || !(strings.Contains(out, "Disk quota exceeded") || strings.Contains(out, "No space left")) {
		t.Fatalf("sandbox wrote 4 GiB into a 2 GiB pool: %q", out)
	}
	s, err := m.pool.Space()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pool after the fill: %d MiB free of %d MiB (reserve %d MiB)", s.Avail()>>20, s.Size>>20, m.reserve()>>20)
	// The neighbour cannot write much (sandboxes without a quota of their
	// own share the pool), but the daemon checkpoints, rolls back and
	// forks it.
	neighbourWorks(t, m, b.ID, false)
	// The sandbox that filled it runs on, and can free what it wrote.
	run(t, m, a.ID, "rm /big")
}

// TestDiskQuota: a sandbox's quota bounds its root and its checkpoints'
// files together; at the quota its writes fail with EDQUOT, its
// neighbour writes, checkpoints, rolls back and forks on; a rollback
// frees what the abandoned root held.
func TestDiskQuota(t *testing.T) {
	m := openSmallManager(t, t.TempDir(), 4<<30, 256<<20)
	if m.quota.why != "" {
		testutil.Unavailable(t, "disk quotas: "+m.quota.why)
	}
	ctx := context.Background()
	a, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{DiskBytes: 160 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	var full *meta.Checkpoint
	if _, err := m.criuReady(ctx); err == nil {
		run(t, m, a.ID, "x=full")
		ck, err := m.Checkpoint(ctx, a.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		full = &ck
	}
	b := newSandbox(t, m)
	if _, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{DiskBytes: -2}}); err == nil {
		t.Fatal("created a sandbox with a disk quota of -2")
	}

	// 100 MiB kept by a checkpoint, then deleted from the root: the
	// checkpoint's copy still counts, so 100 MiB more do not fit.
	if out := fillFromInside(t, m, a.ID, "/one", 100); !strings.Contains(out, "rc=0") {
		t.Fatalf("first 100 MiB under a 160 MiB quota: %q", out)
	}
	ck, err := m.Checkpoint(ctx, a.ID, v1.CheckpointRequest{Kind: v1.KindFS})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, a.ID, "rm /one")
	out := fillFromInside(t, m, a.ID, "/two", 100)
	t.Logf("100 MiB more with a checkpoint holding 100 MiB: %s", out)
	if !strings.Contains(out, "Disk quota exceeded") {
		t.Fatalf("wrote past the quota (root plus checkpoint): %q", out)
	}
	info, err := m.Sandbox(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sandbox at its quota: %d MiB used of %d MiB", info.DiskUsedBytes>>20, info.Resources.DiskBytes>>20)
	if info.DiskUsedBytes < 150<<20 || info.Resources.DiskBytes != 160<<20 {
		t.Fatalf("reported disk use %d of %d", info.DiskUsedBytes, info.Resources.DiskBytes)
	}

	// The neighbour is unaffected.
	if out := fillFromInside(t, m, b.ID, "/big", 300); !strings.Contains(out, "rc=0") {
		t.Fatalf("neighbour writing 300 MiB: %q", out)
	}
	neighbourWorks(t, m, b.ID, true)

	// The full sandbox can still be checkpointed and rolled back; the
	// abandoned root's writes are freed with it.
	if _, err := m.Checkpoint(ctx, a.ID, v1.CheckpointRequest{Kind: v1.KindFS}); err != nil {
		t.Fatalf("checkpoint of a sandbox at its quota: %v", err)
	}
	if _, err := m.Rollback(ctx, a.ID, ck.ID); err != nil {
		t.Fatalf("rollback of a sandbox at its quota: %v", err)
	}
	if full != nil {
		// At its quota again, rolled back with its processes.
		if out := fillFromInside(t, m, a.ID, "/three", 200); !strings.Contains(out, "Disk quota exceeded") {
			t.Fatalf("wrote past the quota after the rollback: %q", out)
		}
		if _, err := m.Rollback(ctx, a.ID, full.ID); err != nil {
			t.Fatalf("full rollback of a sandbox at its quota: %v", err)
		}
		if got := run(t, m, a.ID, "echo $x").Stdout; got != "full\n" {
			t.Fatalf("session after the full rollback: %q", got)
		}
	}
	// Forks get a group of their own, with the same quota.
	res, err := m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID})
	if err != nil {
		t.Fatal(err)
	}
	f := res.Sandboxes[0]
	if fi, _ := m.Sandbox(ctx, f.ID); fi.Resources.DiskBytes != 160<<20 {
		t.Fatalf("fork's disk quota %d", fi.Resources.DiskBytes)
	}
	if out := fillFromInside(t, m, f.ID, "/f", 200); !strings.Contains(out, "Disk quota exceeded") {
		t.Fatalf("fork wrote 200 MiB under a 160 MiB quota: %q", out)
	}
	if err := m.Remove(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaCheckpointCost measures molt's fs checkpoint (stall and
// whole call, 1 MiB written before each) on a pool without quotas and
// on one with simple quotas and a quota on the sandbox, in one run:
// docs/architecture.md, "Disk quotas".
func TestQuotaCheckpointCost(t *testing.T) {
	ctx := context.Background()
	const rounds = 40
	for _, quota := range []bool{false, true} {
		var opts []Option
		if !quota {
			opts = append(opts, WithoutDiskQuota())
		}
		m, err := Open(ctx, Config{Root: t.TempDir(), PoolSize: 4 << 30, CacheDir: os.Getenv("MOLT_CACHE_DIR")}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		closeManager(t, m)
		if _, err := m.BuildImage(ctx, v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
			t.Fatal(err)
		}
		sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{DiskBytes: 1 << 30}})
		if quota && err != nil {
			t.Fatal(err)
		}
		if !quota {
			if sb, err = m.Create(ctx, v1.SandboxCreateRequest{Image: testImage}); err != nil {
				t.Fatal(err)
			}
		}
		var stall, total []time.Duration
		for i := range rounds {
			run(t, m, sb.ID, "head -c 1048576 /dev/urandom > /dirty"+itoa(i%4))
			t0 := time.Now()
			ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS})
			if err != nil {
				t.Fatal(err)
			}
			total = append(total, time.Since(t0))
			stall = append(stall, time.Duration(ck.StallMS*float64(time.Millisecond)))
		}
		slices.Sort(stall)
		slices.Sort(total)
		t.Logf("quotas %-5v (%s): fs checkpoint stall p50 %.2f ms p90 %.2f ms; call p50 %.2f ms p90 %.2f ms",
			quota, m.quotaFeature().Detail+m.quotaFeature().Reason, msf(stall[rounds/2]), msf(stall[rounds*9/10]), msf(total[rounds/2]), msf(total[rounds*9/10]))
	}
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// TestForkAdoptsStandbyQuota: a fork that adopts its source's standby
// (a root made in the source's group) is charged for its own writes:
// they meet the fork's quota and leave the source's use as it was.
func TestForkAdoptsStandbyQuota(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	if m.quota.why != "" {
		testutil.Unavailable(t, "disk quotas: "+m.quota.why)
	}
	m.cfg.StandbyBudget = 1 << 30
	ctx := context.Background()
	src, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Resources: v1.Resources{DiskBytes: 96 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := m.Checkpoint(ctx, src.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true, Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	waitStandbyOf(t, m, src.ID, ck.ID)
	before, err := m.Sandbox(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := m.Fork(ctx, ck.ID, v1.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	f := fr.Sandboxes[0].ID
	if m.standbyOf(src.ID) != nil {
		t.Log("the fork did not take the standby (another was made meanwhile?)")
	}
	out := fillFromInside(t, m, f, "/big", 200)
	if !strings.Contains(out, "Disk quota exceeded") {
		t.Fatalf("fork wrote 200 MiB under a 96 MiB quota: %q", out)
	}
	after, err := m.Sandbox(ctx, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := m.Sandbox(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("source %d -> %d MiB, fork %d MiB", before.DiskUsedBytes>>20, after.DiskUsedBytes>>20, fi.DiskUsedBytes>>20)
	if after.DiskUsedBytes > before.DiskUsedBytes+8<<20 || fi.DiskUsedBytes < 80<<20 {
		t.Fatalf("the fork's writes were charged to its source: source %d -> %d bytes, fork %d", before.DiskUsedBytes, after.DiskUsedBytes, fi.DiskUsedBytes)
	}
}

// TestSandboxCannotFillStateRoot: with the state root (molt.db) on a
// 1.5 GiB filesystem holding an 8 GiB sparse pool image, a sandbox
// writing 4 GiB is stopped with EDQUOT while the state root keeps its
// reserve, and the daemon goes on writing its metadata and checkpoints.
// Before quotas the sandbox filled the state root's filesystem.
func TestSandboxCannotFillStateRoot(t *testing.T) {
	dir := smallTmpfs(t)
	const reserve = 128 << 20
	m := openSmallManager(t, filepath.Join(dir, "root"), 8<<30, reserve)
	if m.quota.why != "" {
		testutil.Unavailable(t, "disk quotas: "+m.quota.why)
	}
	ctx := context.Background()
	a, b := newSandbox(t, m), newSandbox(t, m)
	run(t, m, b.ID, "echo one > /mark")
	out := fillFromInside(t, m, a.ID, "/big", 4096)
	t.Logf("filling from a sandbox: %s", out)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	left := int64(st.Bavail) * st.Bsize
	t.Logf("the state root's filesystem has %d MiB left (reserve %d MiB)", left>>20, reserve>>20)
	if strings.Contains(out, "rc=0") || left < reserve/2 {
		t.Fatalf("sandbox filled the state root's filesystem: %d MiB left; %q", left>>20, out)
	}
	// The daemon's metadata and its work on the neighbour go on.
	if _, err := m.Checkpoint(ctx, b.ID, v1.CheckpointRequest{Kind: v1.KindFS, Label: "after-fill"}); err != nil {
		t.Fatalf("checkpoint after the fill: %v", err)
	}
	if _, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage}); err != nil {
		t.Fatalf("create after the fill: %v", err)
	}
}
