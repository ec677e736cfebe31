package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
)

// DefaultSize is the size of a new pool image when Config.Size is 0. The
// file is sparse: it takes disk space only as the pool fills.
const DefaultSize = 32 << 30

// DefaultNodeSize is the metadata node size of a new pool image when
// Config.NodeSize is 0: 8 KiB rather than mkfs.btrfs's 16 KiB. Every
// snapshot of a subvolume that keeps changing (a sandbox's root,
// checkpointed again and again) costs more the more snapshots of it
// exist, and far less so with smaller nodes: the 500th snapshot of one
// live subvolume took 31.7-32.2 ms with 16 KiB nodes, 1.7-2.0 ms with 8 KiB
// (BENCHMARKS.md, "Snapshots of a long lineage").
const DefaultNodeSize = 8 << 10

// Config says where the pool lives.
type Config struct {
	Root string // state root; created if missing
	Size int64  // size of a new loop image in bytes; 0 means DefaultSize
	// NodeSize is the btrfs metadata node size of a new loop image
	// (0: DefaultNodeSize; else a power of two from 4 KiB to 64 KiB). An
	// existing image keeps the size it was made with (Pool.NodeSize).
	NodeSize int
}

// Pool is an open storage pool.
type Pool struct {
	Dir     string // btrfs directory holding images/, sandboxes/, checkpoints/, tmp/
	Loop    bool   // Dir is a mount of a loop device
	Backing string // the loop device's backing file when Loop, else ""
	Device  string // the loop device (/dev/loopN) when Loop, else ""
	// NodeSize is the filesystem's metadata node size, in bytes.
	NodeSize int
}

var subdirs = []string{"images", "sandboxes", "checkpoints", "tmp"}

// Open prepares the pool under cfg.Root, mounting a loop image when the
// root is not on btrfs, and returns it.
func Open(ctx context.Context, cfg Config) (*Pool, error) {
	size := cfg.Size
	if size == 0 {
		size = DefaultSize
	}
	if cfg.Root == "" || size < 0 {
		return nil, fmt.Errorf("open pool: root %q, size %d: %w", cfg.Root, cfg.Size, errdefs.ErrInvalidArgument)
	}
	nodeSize := cfg.NodeSize
	if nodeSize == 0 {
		nodeSize = DefaultNodeSize
	}
	if nodeSize < 4<<10 || nodeSize > 64<<10 || nodeSize&(nodeSize-1) != 0 {
		return nil, fmt.Errorf("open pool %s: node size %d: want a power of two from 4096 to 65536: %w", cfg.Root, cfg.NodeSize, errdefs.ErrInvalidArgument)
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("open pool %s: %w", cfg.Root, err)
	}
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("open pool %s: %w", root, err)
	}
	// The kernel reports resolved paths (mountinfo, the loop backing file).
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return nil, fmt.Errorf("open pool %s: %w", cfg.Root, err)
	}
	unlock, err := lock(root)
	if err != nil {
		return nil, fmt.Errorf("open pool %s: %w", root, err)
	}
	defer unlock()

	p := &Pool{Dir: filepath.Join(root, "pool")}
	if err := os.Mkdir(p.Dir, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("open pool %s: %w", root, err)
	}
	btrfs, err := fsnap.IsBtrfs(root)
	if err != nil {
		return nil, fmt.Errorf("open pool %s: %w", root, err)
	}
	var mounted bool // by this call, so undone if Open fails
	if !btrfs {
		if mounted, err = p.mount(ctx, filepath.Join(root, "pool.img"), size, nodeSize); err != nil {
			return nil, fmt.Errorf("open pool %s: %w", root, err)
		}
	}
	fail := func(err error) (*Pool, error) {
		err = fmt.Errorf("open pool %s: %w", root, err)
		if mounted {
			err = errors.Join(err, p.Unmount())
		}
		return nil, err
	}
	if p.NodeSize, err = fsnap.NodeSize(p.Dir); err != nil {
		return fail(err)
	}
	for _, d := range subdirs {
		if err := os.Mkdir(filepath.Join(p.Dir, d), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fail(err)
		}
	}
	return p, nil
}

// Unmount unmounts a loop pool and waits for the kernel to release its loop
// device. It does nothing for a pool that is a plain directory, or one that
// is no longer mounted. It fails with EBUSY while anything in the pool is in
// use.
func (p *Pool) Unmount() error {
	if !p.Loop {
		return nil
	}
	switch err := unix.Unmount(p.Dir, 0); {
	case errors.Is(err, unix.EINVAL): // not a mount point: already unmounted
		return nil
	case err != nil:
		return fmt.Errorf("unmount pool %s: %w", p.Dir, err)
	}
	// Autoclear detaches the device on its last close; wait for it so that
	// an Open right after this does not find the image still attached.
	for deadline := time.Now().Add(2 * time.Second); attachedTo(p.Device) == p.Backing; {
		if time.Now().After(deadline) {
			return fmt.Errorf("unmount pool %s: %s still attached to %s, held open elsewhere (another mount namespace?): %w",
				p.Dir, p.Device, p.Backing, errdefs.ErrUnavailable)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// mount makes p.Dir a btrfs mount of img, creating and formatting the image
// if needed, or reuses the btrfs already mounted there. It reports whether
// it mounted p.Dir itself.
func (p *Pool) mount(ctx context.Context, img string, size int64, nodeSize int) (bool, error) {
	fstype, source, ok, err := mountAt(p.Dir)
	if err != nil {
		return false, err
	}
	if ok {
		if fstype != "btrfs" {
			return false, fmt.Errorf("%s is a %s mount, want btrfs: %w", p.Dir, fstype, errdefs.ErrFailedPrecondition)
		}
		if backing := attachedTo(source); backing != "" {
			p.Loop, p.Device, p.Backing = true, source, backing
		}
		return false, p.private()
	}

	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if err := format(ctx, img, size, nodeSize); err != nil {
			return false, err
		}
	} else if err != nil {
		return false, err
	}
	dev, fd, err := attach(ctx, img)
	if err != nil {
		return false, err
	}
	// Closing the last fd of the device lets autoclear release it, so close
	// it only once the mount holds the device.
	defer unix.Close(fd)
	if err := unix.Mount(dev, p.Dir, "btrfs", unix.MS_NOATIME, ""); err != nil {
		unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return false, fmt.Errorf("mount %s (%s) on %s: %w", dev, img, p.Dir, err)
	}
	p.Loop, p.Device, p.Backing = true, dev, img
	if err := p.private(); err != nil {
		unix.Unmount(p.Dir, 0)
		*p = Pool{Dir: p.Dir}
		return false, err
	}
	return true, nil
}

func (p *Pool) private() error {
	if err := unix.Mount("", p.Dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", p.Dir, err)
	}
	return nil
}

// format creates img as a sparse file of size bytes holding an empty btrfs
// with metadata nodes of nodeSize bytes.
func format(ctx context.Context, img string, size int64, nodeSize int) error {
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}
	tmp := img + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("create pool image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var out []byte
		// Single metadata, not DUP: a second copy on the same loop file
		// guards against little, and every transaction commit (every
		// snapshot: the checkpoint stall) would write metadata twice
		// (measured: fs checkpoint p50 5.9 ms with DUP, 4.8 ms single).
		if out, err = exec.CommandContext(ctx, mkfs, "-q", "-m", "single", "-n", strconv.Itoa(nodeSize), tmp).CombinedOutput(); err != nil {
			err = fmt.Errorf("%s -q -n %d %s: %w: %s", mkfs, nodeSize, tmp, err, bytes.TrimSpace(out))
		}
	}
	if err == nil {
		err = os.Rename(tmp, img)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("create pool image %s: %w", img, err)
	}
	return nil
}

func findMkfs() (string, error) {
	if path, err := exec.LookPath("mkfs.btrfs"); err == nil {
		return path, nil
	}
	// PATH of a non-login root shell may lack the sbin directories.
	for _, path := range []string{"/usr/sbin/mkfs.btrfs", "/sbin/mkfs.btrfs"} {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", fmt.Errorf("mkfs.btrfs not found: install btrfs-progs to create a pool on a non-btrfs root: %w", errdefs.ErrNotSupported)
}

// loFlagsAutoclear is LO_FLAGS_AUTOCLEAR from <linux/loop.h>.
const loFlagsAutoclear = 4

// attach binds img to a free loop device with autoclear set and returns the
// device path and an open fd of it.
func attach(ctx context.Context, img string) (string, int, error) {
	backing, err := unix.Open(img, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("attach %s: %w", img, err)
	}
	defer unix.Close(backing)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("attach %s: %w", img, err)
	}
	defer unix.Close(ctl)
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return "", -1, fmt.Errorf("attach %s: %w", img, err)
		}
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", -1, fmt.Errorf("attach %s: get free loop device: %w", img, err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			if err = configure(fd, backing, img); err == nil {
				return dev, fd, nil
			}
			unix.Close(fd)
		}
		// EBUSY: another process took the free device first. ENOENT: the
		// device node of a new loop device is not there yet.
		if (!errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOENT)) || attempt == 100 {
			return "", -1, fmt.Errorf("attach %s to %s: %w", img, dev, err)
		}
		time.Sleep(time.Duration(attempt) * time.Millisecond)
	}
}

func configure(fd, backing int, img string) error {
	cfg := unix.LoopConfig{Fd: uint32(backing)}
	cfg.Info.Flags = loFlagsAutoclear
	copy(cfg.Info.File_name[:unix.LO_NAME_SIZE-1], img)
	err := unix.IoctlLoopConfigure(fd, &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	// Kernels before 5.8 lack LOOP_CONFIGURE.
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_FD, backing); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(fd, &cfg.Info); err != nil {
		unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// attachedTo returns the backing file of the loop device dev, or "" if dev
// is not an attached loop device.
func attachedTo(dev string) string {
	name, ok := strings.CutPrefix(dev, "/dev/")
	if !ok || !strings.HasPrefix(name, "loop") {
		return ""
	}
	b, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// mountAt reports whether dir is a mount point and, if so, its filesystem
// type and source from /proc/self/mountinfo.
func mountAt(dir string) (fstype, source string, ok bool, err error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx); err != nil {
		return "", "", false, fmt.Errorf("statx %s: %w", dir, err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || stx.Mask&unix.STATX_MNT_ID == 0 {
		return "", "", false, fmt.Errorf("statx %s: no mount id (kernel older than 5.8): %w", dir, errdefs.ErrNotSupported)
	}
	if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return "", "", false, nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", "", false, err
	}
	// 36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw
	id := strconv.FormatUint(stx.Mnt_id, 10)
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != id {
			continue
		}
		if i := slices.Index(f, "-"); i > 0 && i+2 < len(f) {
			return f[i+1], f[i+2], true, nil
		}
	}
	return "", "", false, fmt.Errorf("mount %s of %s not in /proc/self/mountinfo", id, dir)
}

// lock takes an exclusive flock on dir until the returned func is called.
func lock(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// Space is the room left for the pool's data, in bytes.
type Space struct {
	// Size is the pool filesystem's size.
	Size int64
	// Free is what the pool filesystem says is still available to
	// unprivileged writes (btrfs's estimate for its data profile).
	Free int64
	// BackingFree, for a loop pool, is what the filesystem holding the
	// sparse image still has; the image grows into it as the pool fills,
	// so the pool can take no more than that. -1 for a plain pool.
	BackingFree int64
}

// Avail is what the pool can still take: the lesser of its own free
// space and, for a loop pool, its backing filesystem's.
func (s Space) Avail() int64 {
	if s.BackingFree >= 0 && s.BackingFree < s.Free {
		return s.BackingFree
	}
	return s.Free
}

// Space reports the room left in the pool and, for a loop pool, under
// it.
func (p *Pool) Space() (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p.Dir, &st); err != nil {
		return Space{}, fmt.Errorf("statfs %s: %w", p.Dir, err)
	}
	s := Space{Size: int64(st.Blocks) * st.Bsize, Free: int64(st.Bavail) * st.Bsize, BackingFree: -1}
	if p.Loop && p.Backing != "" {
		if err := unix.Statfs(filepath.Dir(p.Backing), &st); err != nil {
			return Space{}, fmt.Errorf("statfs %s: %w", filepath.Dir(p.Backing), err)
		}
		s.BackingFree = int64(st.Bavail) * st.Bsize
	}
	return s, nil
}

// DefaultReserve is the space kept free in a pool of size bytes when the
// daemon is not told otherwise: 1 GiB, or a twentieth of a smaller pool.
func DefaultReserve(size int64) int64 { return min(1<<30, size/20) }

// Room returns nil when need bytes fit in the pool with reserve bytes
// still free afterwards, both in the pool and under a loop pool, and an
// ErrResourceExhausted saying which is short otherwise.
func (p *Pool) Room(need, reserve int64) error {
	s, err := p.Space()
	if err != nil {
		return err
	}
	if s.Free-need < reserve {
		return fmt.Errorf("pool %s has %s free, needs %s plus a reserve of %s: %w",
			p.Dir, mib(s.Free), mib(need), mib(reserve), errdefs.ErrResourceExhausted)
	}
	if s.BackingFree >= 0 && s.BackingFree-need < reserve {
		return fmt.Errorf("the filesystem under pool %s (holding %s) has %s free, needs %s plus a reserve of %s: %w",
			p.Dir, p.Backing, mib(s.BackingFree), mib(need), mib(reserve), errdefs.ErrResourceExhausted)
	}
	return nil
}

func mib(n int64) string { return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB" }
