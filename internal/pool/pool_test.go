package pool_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
	"github.com/molt-sh/molt/internal/pool"
	"github.com/molt-sh/molt/internal/testutil"
)

// loopRoot returns a fresh state root that is not on btrfs, so Open takes
// the loop path.
func loopRoot(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		testutil.Unavailable(t, "no loop device support: "+err.Error())
	}
	root := t.TempDir()
	if ok, err := fsnap.IsBtrfs(root); err != nil || ok {
		t.Skipf("temp dir is on btrfs (%v): the loop path is not exercised", err)
	}
	return root
}

func open(t *testing.T, root string) *pool.Pool {
	t.Helper()
	p, err := pool.Open(t.Context(), pool.Config{Root: root, Size: 512 << 20})
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

// mountsAt counts the mounts on dir in this mount namespace.
func mountsAt(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for s := bufio.NewScanner(f); s.Scan(); {
		if fields := strings.Fields(s.Text()); len(fields) > 4 && fields[4] == dir {
			n++
		}
	}
	return n
}

// loopsFor lists the loop devices whose backing file is img.
func loopsFor(t *testing.T, img string) []string {
	t.Helper()
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) == img {
			devs = append(devs, f)
		}
	}
	return devs
}

func TestOpenLoop(t *testing.T) {
	root := loopRoot(t)
	img := filepath.Join(root, "pool.img")

	p := open(t, root)
	if !p.Loop || p.Backing != img || !strings.HasPrefix(p.Device, "/dev/loop") || p.Dir != filepath.Join(root, "pool") {
		t.Fatalf("Open = %+v, want a loop pool backed by %s", p, img)
	}
	if ok, err := fsnap.IsBtrfs(p.Dir); err != nil || !ok {
		t.Fatalf("IsBtrfs(%s) = %v, %v; want true", p.Dir, ok, err)
	}
	for _, d := range []string{"images", "sandboxes", "checkpoints", "tmp"} {
		fi, err := os.Stat(filepath.Join(p.Dir, d))
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v; want a directory with mode 0700", d, fi, err)
		}
	}
	if _, err := os.Stat(img + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat %s.tmp: %v, want not exist", img, err)
	}
	if got := loopsFor(t, img); len(got) != 1 {
		t.Errorf("loop devices for %s: %v, want one", img, got)
	}
	keep := filepath.Join(p.Dir, "images", "keep")
	if err := os.WriteFile(keep, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}

	again := open(t, root)
	if *again != *p {
		t.Errorf("second Open = %+v, want %+v", again, p)
	}
	if n := mountsAt(t, p.Dir); n != 1 {
		t.Errorf("%d mounts on %s after two Opens, want 1", n, p.Dir)
	}

	// A file open in the pool keeps it busy.
	f, err := os.Open(keep)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Unmount(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("Unmount with an open file = %v, want EBUSY", err)
	}
	f.Close()

	if err := p.Unmount(); err != nil {
		t.Fatal(err)
	}
	if n := mountsAt(t, p.Dir); n != 0 {
		t.Errorf("%d mounts on %s after Unmount, want 0", n, p.Dir)
	}
	if got := loopsFor(t, img); len(got) != 0 {
		t.Errorf("loop devices still backed by %s after Unmount: %v", img, got)
	}
	if err := p.Unmount(); err != nil {
		t.Errorf("second Unmount = %v, want nil", err)
	}

	p = open(t, root)
	if b, err := os.ReadFile(keep); err != nil || string(b) != "kept" {
		t.Errorf("after remount, read %s = %q, %v; want %q", keep, b, err, "kept")
	}
	if n := mountsAt(t, p.Dir); n != 1 {
		t.Errorf("%d mounts on %s after remount, want 1", n, p.Dir)
	}

	// A root that is already on btrfs gets a plain pool directory.
	nested := open(t, filepath.Join(p.Dir, "tmp", "nested"))
	if nested.Loop || nested.Device != "" || nested.Backing != "" || nested.Dir != filepath.Join(p.Dir, "tmp", "nested", "pool") {
		t.Errorf("Open on a btrfs root = %+v, want a plain directory", nested)
	}
	if _, err := os.Stat(filepath.Join(nested.Dir, "sandboxes")); err != nil {
		t.Error(err)
	}
}

// A pool image that does not hold a btrfs fails to mount and leaves no loop
// device behind.
func TestOpenBadImageLeaksNothing(t *testing.T) {
	root := loopRoot(t)
	img := filepath.Join(root, "pool.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 128<<20); err != nil {
		t.Fatal(err)
	}
	p, err := pool.Open(t.Context(), pool.Config{Root: root})
	if err == nil {
		p.Unmount()
		t.Fatal("Open on an unformatted image succeeded")
	}
	t.Logf("Open on an unformatted image: %v", err)
	if got := loopsFor(t, img); len(got) != 0 {
		t.Errorf("loop devices left attached to %s: %v", img, got)
	}
	if n := mountsAt(t, filepath.Join(root, "pool")); n != 0 {
		t.Errorf("%d mounts left on the pool dir", n)
	}
}

// Concurrent Opens of one root mount it once.
func TestOpenConcurrent(t *testing.T) {
	root := loopRoot(t)
	pools := make(chan *pool.Pool, 4)
	var wg sync.WaitGroup
	for range cap(pools) {
		wg.Go(func() {
			p, err := pool.Open(t.Context(), pool.Config{Root: root, Size: 512 << 20})
			if err != nil {
				t.Error(err)
			}
			pools <- p
		})
	}
	wg.Wait()
	close(pools)
	var first *pool.Pool
	for p := range pools {
		if p == nil {
			continue
		}
		if first == nil {
			first = p
			t.Cleanup(func() {
				if err := p.Unmount(); err != nil {
					t.Error(err)
				}
			})
		} else if *p != *first {
			t.Errorf("concurrent Opens returned %+v and %+v", first, p)
		}
	}
	if n := mountsAt(t, filepath.Join(root, "pool")); n != 1 {
		t.Errorf("%d mounts after concurrent Opens, want 1", n)
	}
}

// A new pool image gets the default node size, or the one asked for;
// an existing image keeps its own; a size btrfs cannot make is refused
// before anything is made.
func TestNodeSize(t *testing.T) {
	root := loopRoot(t)
	if p := open(t, root); p.NodeSize != pool.DefaultNodeSize {
		t.Fatalf("new pool: node size %d, want %d", p.NodeSize, pool.DefaultNodeSize)
	}

	root = loopRoot(t)
	p, err := pool.Open(t.Context(), pool.Config{Root: root, Size: 512 << 20, NodeSize: 4 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeSize != 4<<10 {
		t.Fatalf("pool made with 4 KiB nodes reports %d", p.NodeSize)
	}
	if err := p.Unmount(); err != nil {
		t.Fatal(err)
	}
	p, err = pool.Open(t.Context(), pool.Config{Root: root, Size: 512 << 20, NodeSize: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			t.Error(err)
		}
	})
	if p.NodeSize != 4<<10 {
		t.Fatalf("reopened pool made with 4 KiB nodes reports %d", p.NodeSize)
	}

	for _, bad := range []int{-1, 1024, 6 << 10, 128 << 10} {
		root := loopRoot(t)
		if _, err := pool.Open(t.Context(), pool.Config{Root: root, NodeSize: bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("node size %d: %v, want ErrInvalidArgument", bad, err)
		}
		if _, err := os.Stat(filepath.Join(root, "pool.img")); err == nil {
			t.Errorf("node size %d: a pool image was made", bad)
		}
	}
}
