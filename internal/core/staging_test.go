package core

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/testutil"
)

// TestStagingBounded: dump staging is a tmpfs of its own, bounded, not
// a directory of the host's /dev/shm: writing past the bound fails with
// ENOSPC and /dev/shm's free space does not move. It logs what the
// mount and unmount cost (docs/architecture.md, "Disk quotas").
func TestStagingBounded(t *testing.T) {
	testutil.RequireRoot(t)
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		testutil.Unavailable(t, "no tmpfs at /dev/shm")
	}
	m := &Manager{cfg: Config{Root: t.TempDir()}, log: slog.Default()}
	fallback := t.TempDir()
	const bound = 16 << 20
	d, err := m.stagingDir(fallback, bound)
	if err != nil {
		t.Fatal(err)
	}
	defer removeStaging(d)
	var before, in unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &before); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(d, &in); err != nil {
		t.Fatal(err)
	}
	if in.Type != unix.TMPFS_MAGIC || int64(in.Blocks)*in.Bsize != bound {
		t.Fatalf("staging %s: type %#x, %d bytes, want a tmpfs of %d", d, in.Type, int64(in.Blocks)*in.Bsize, bound)
	}
	f, err := os.Create(filepath.Join(d, "pages-1.img"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	var n int
	for range 64 {
		w, err := f.Write(buf)
		n += w
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	f.Close()
	if n > bound {
		t.Fatalf("staged %d bytes past a bound of %d", n, bound)
	}
	var after unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &after); err != nil {
		t.Fatal(err)
	}
	if used := (int64(before.Bfree) - int64(after.Bfree)) * after.Bsize; used > 4<<20 {
		t.Fatalf("/dev/shm lost %d bytes to a bounded staging", used)
	}
	removeStaging(d)
	if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("staging %s left: %v", d, err)
	}

	var mk, rm []time.Duration
	for range 50 {
		t0 := time.Now()
		d, err := m.stagingDir(fallback, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		mk = append(mk, time.Since(t0))
		t0 = time.Now()
		removeStaging(d)
		rm = append(rm, time.Since(t0))
	}
	slices.Sort(mk)
	slices.Sort(rm)
	t.Logf("staging tmpfs: make p50 %v p90 %v; remove p50 %v p90 %v", mk[25], mk[45], rm[25], rm[45])
}
