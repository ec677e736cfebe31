package fsnap_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pool"
	"github.com/molt-sh/molt/internal/testutil"
)

// freshPool opens a new loop pool of size bytes: quota modes cannot be
// switched on a filesystem that has had quotas, so each mode gets its
// own.
func freshPool(t testing.TB, size int64) *pool.Pool {
	t.Helper()
	testutil.RequireRoot(t)
	root := t.TempDir()
	p, err := pool.Open(context.Background(), pool.Config{Root: root, Size: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// writeUntil writes path in 1 MiB chunks, with a sync every chunk,
// until max bytes or an error, and returns what it wrote and the error.
func writeUntil(path string, max int64) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < max {
		for i := range buf {
			buf[i] = byte(n>>20) + byte(i)
		}
		w, err := f.Write(buf)
		n += int64(w)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// A level-1 qgroup holding a root and its read-only snapshots bounds
// what the root can write, snapshots' shared data included; a neighbour
// in its own group writes and snapshots on.
func TestQgroupLimit(t *testing.T) {
	for _, mode := range []fsnap.QuotaMode{fsnap.QuotaSimple, fsnap.QuotaFull} {
		t.Run(mode.String(), func(t *testing.T) {
			p := freshPool(t, 2<<30)
			if err := fsnap.EnableQuota(p.Dir, mode); err != nil {
				if mode == fsnap.QuotaSimple {
					testutil.Unavailable(t, err.Error())
				}
				t.Fatal(err)
			}
			if got, err := fsnap.Quota(p.Dir); err != nil || got != mode {
				t.Fatalf("Quota = %v, %v, want %v", got, err, mode)
			}
			const limit = 64 << 20
			ga, gb := fsnap.Qgroup(1, 1), fsnap.Qgroup(1, 2)
			for _, g := range []uint64{ga, gb} {
				if err := fsnap.CreateQgroup(p.Dir, g); err != nil {
					t.Fatal(err)
				}
			}
			if err := fsnap.LimitQgroup(p.Dir, ga, limit); err != nil {
				t.Fatal(err)
			}
			a, b := filepath.Join(p.Dir, "a"), filepath.Join(p.Dir, "b")
			if err := fsnap.CreateSubvolumeIn(a, ga); err != nil {
				t.Fatal(err)
			}
			if err := fsnap.CreateSubvolumeIn(b, gb); err != nil {
				t.Fatal(err)
			}
			// Half the limit, a checkpoint holding it, then overwrite: the
			// checkpoint's copy still counts.
			if _, err := writeUntil(filepath.Join(a, "f"), limit/2); err != nil {
				t.Fatal(err)
			}
			if err := fsnap.SnapshotIn(a, filepath.Join(p.Dir, "a.ck1"), true, ga); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(a, "f")); err != nil {
				t.Fatal(err)
			}
			n, err := writeUntil(filepath.Join(a, "g"), 4*limit)
			if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("wrote %d MiB past a %d MiB group limit: %v, want EDQUOT", n>>20, limit>>20, err)
			}
			t.Logf("%s: after a checkpoint holding %d MiB, the root wrote %d MiB more, then: %v", mode, limit>>21, n>>20, err)
			if n > limit/2+8<<20 {
				t.Errorf("wrote %d MiB: the checkpoint's data was not charged to the group", n>>20)
			}
			used, err := fsnap.QgroupUsage(p.Dir, ga)
			t.Logf("%s: group usage %d MiB (%v)", mode, used>>20, err)
			// The neighbour is unaffected.
			if n, err := writeUntil(filepath.Join(b, "f"), 2*limit); err != nil {
				t.Fatalf("neighbour wrote %d MiB: %v", n>>20, err)
			}
			if err := fsnap.SnapshotIn(b, filepath.Join(p.Dir, "b.ck1"), true, gb); err != nil {
				t.Fatalf("neighbour's checkpoint: %v", err)
			}
			// The full group can still be checkpointed and deleted.
			if err := fsnap.SnapshotIn(a, filepath.Join(p.Dir, "a.ck2"), true, ga); err != nil {
				t.Errorf("checkpoint of the full group: %v", err)
			}
			for _, s := range []string{"a.ck1", "a.ck2", "a"} {
				if err := fsnap.DeleteSubvolume(filepath.Join(p.Dir, s)); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Error(err)
				}
			}
		})
	}
}

// TestQuotaCost measures what quotas add to the checkpoint path: a
// read-only snapshot of a root with 1 MiB freshly written (an fs
// checkpoint's snapshot), and the deletion of a snapshot, with quotas
// off, full and simple, in one run. Numbers go to docs/architecture.md.
func TestQuotaCost(t *testing.T) {
	const rounds = 60
	for _, mode := range []fsnap.QuotaMode{fsnap.QuotaOff, fsnap.QuotaSimple, fsnap.QuotaFull} {
		p := freshPool(t, 4<<30)
		var groups []uint64
		if mode != fsnap.QuotaOff {
			if err := fsnap.EnableQuota(p.Dir, mode); err != nil {
				t.Logf("%s: %v", mode, err)
				continue
			}
			g := fsnap.Qgroup(1, 7)
			if err := fsnap.CreateQgroup(p.Dir, g); err != nil {
				t.Fatal(err)
			}
			if err := fsnap.LimitQgroup(p.Dir, g, 2<<30); err != nil {
				t.Fatal(err)
			}
			groups = []uint64{g}
		}
		root := filepath.Join(p.Dir, "root")
		if err := fsnap.CreateSubvolumeIn(root, groups...); err != nil {
			t.Fatal(err)
		}
		// A root with some files, as a small image would have.
		for i := range 2000 {
			write(t, filepath.Join(root, fmt.Sprint(i%50), fmt.Sprint(i)), "file")
		}
		if _, err := writeUntil(filepath.Join(root, "big"), 64<<20); err != nil {
			t.Fatal(err)
		}
		var snap, del, check []time.Duration
		for i := range rounds {
			if _, err := writeUntil(filepath.Join(root, "dirty"), 1<<20); err != nil {
				t.Fatal(err)
			}
			if err := fsnap.SyncFS(root); err != nil {
				t.Fatal(err)
			}
			dst := filepath.Join(p.Dir, fmt.Sprint("ck", i))
			t0 := time.Now()
			if nested, err := fsnap.NestedSubvolumes(root); err != nil || len(nested) != 0 {
				t.Fatalf("NestedSubvolumes = %q, %v", nested, err)
			}
			check = append(check, time.Since(t0))
			t0 = time.Now()
			if err := fsnap.SnapshotIn(root, dst, true, groups...); err != nil {
				t.Fatal(err)
			}
			snap = append(snap, time.Since(t0))
		}
		for i := range rounds {
			t0 := time.Now()
			if err := fsnap.DeleteSubvolume(filepath.Join(p.Dir, fmt.Sprint("ck", i))); err != nil {
				t.Fatal(err)
			}
			del = append(del, time.Since(t0))
		}
		// Deletion is lazy: the cleaner drops the trees afterwards, in
		// transaction commits that later snapshots wait for.
		t0 := time.Now()
		if err := fsnap.SyncFS(root); err != nil {
			t.Fatal(err)
		}
		t.Logf("quotas %-6s: snapshot p50 %5.2f ms p90 %5.2f ms; delete p50 %5.2f ms p90 %5.2f ms; syncfs after deletes %5.1f ms; nested-subvolume check p50 %5.3f ms",
			mode, q(snap, 50), q(snap, 90), q(del, 50), q(del, 90), float64(time.Since(t0).Microseconds())/1000, q(check, 50))
	}
}

func q(ds []time.Duration, pct int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	return float64(s[(len(s)-1)*pct/100].Microseconds()) / 1000
}
