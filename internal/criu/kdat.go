package criu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// CRIU keeps its kernel probe ("kerndat", 30-40 ms per call) in
// /run/criu.kdat, a path built into it, and writes that file only when
// /run is a tmpfs, so that it never outlives a boot. The file is read
// wherever it lives, with no check but its size and two magic numbers.
const (
	kdatPath  = "/run/criu.kdat"
	kdatMagic = 0x57023458 // KDAT_MAGIC, the file's first word
	kdatName  = "criu.kdat"
	kdatID    = "criu.kdat.id" // what the cache was made by and for
)

// CacheKerndat makes CRIU load its kernel probe from a cache on a host
// whose /run is not a tmpfs (where CRIU probes the kernel on every call).
// It does nothing when /run is a tmpfs: CRIU caches by itself there.
//
// dir must be a directory on a tmpfs, or CacheKerndat mounts a small
// private tmpfs on it (mode 0700); a tmpfs never outlives a boot, which is
// what makes the cache safe. The probe is made by the Tool's CRIU in a
// private mount namespace with a tmpfs on /run, copied to dir/criu.kdat,
// and /run/criu.kdat is made a symbolic link to it. After a reboot the
// link dangles and CRIU probes again, as without a cache. The cache is
// made again when CRIU's version, the kernel or the boot differ from the
// ones it was made for. An existing /run/criu.kdat that is not a symbolic
// link is left alone (ErrFailedPrecondition).
//
// Measured on the 2-vCPU Firecracker VM (CRIU 4.2.1, BenchmarkDumpRestore,
// Python with 20 MiB): dump 58-66 ms without the cache, 31-33 ms with it;
// restore 54 ms vs 26-29 ms; `criu check` 46-55 ms vs 10-30 ms.
//
// Preconditions: root.
func (t *Tool) CacheKerndat(ctx context.Context, dir string) error {
	if err := t.cacheKerndat(ctx, dir); err != nil {
		return fmt.Errorf("cache criu kerndat in %s: %w", dir, err)
	}
	return nil
}

func (t *Tool) cacheKerndat(ctx context.Context, dir string) error {
	if onTmpfs(filepath.Dir(kdatPath)) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if !onTmpfs(dir) {
		if err := unix.Mount("molt-criu-kdat", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
			return fmt.Errorf("mount tmpfs: %w", err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
		return fmt.Errorf("not a directory owned by root and writable only by it: %w", errdefs.ErrFailedPrecondition)
	}

	fs, err := t.features(ctx)
	if err != nil {
		return err
	}
	id := kdatIdentity(fs.version)
	cache := filepath.Join(dir, kdatName)
	if old, err := os.ReadFile(filepath.Join(dir, kdatID)); err != nil || string(old) != id || !isKdat(cache) {
		b, err := t.probeKerndat(ctx)
		if err != nil {
			return err
		}
		if err := writeAtomic(cache, b); err != nil {
			return err
		}
		if err := writeAtomic(filepath.Join(dir, kdatID), []byte(id)); err != nil {
			return err
		}
	}
	t.kdatMu.Lock()
	defer t.kdatMu.Unlock()
	if err := linkKdat(cache); err != nil {
		return err
	}
	t.kdatFile = cache
	return nil
}

// ensureKdatLink puts the link back if CRIU removed it (CRIU unlinks a
// cache it finds stale, and so does its failed attempt to write one on a
// /run that is not a tmpfs).
func (t *Tool) ensureKdatLink() {
	t.kdatMu.Lock()
	defer t.kdatMu.Unlock()
	cache := t.kdatFile
	if cache == "" {
		return
	}
	if target, err := os.Readlink(kdatPath); err == nil && target == cache {
		return
	}
	if isKdat(cache) {
		linkKdat(cache)
	}
}

// kerndatCache returns the kernel probe cache CRIU loads, or "".
func (t *Tool) kerndatCache() string {
	if onTmpfs(filepath.Dir(kdatPath)) {
		return kdatPath
	}
	if target, err := os.Readlink(kdatPath); err == nil && isKdat(target) {
		return target
	}
	return ""
}

// probeKerndat runs `criu check` in a private mount namespace whose /run
// is a fresh tmpfs, where CRIU writes its probe, and returns the probe.
// The namespace belongs to a locked OS thread that exits afterwards.
func (t *Tool) probeKerndat(ctx context.Context) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, and with it the namespace, ends with
		// this goroutine.
		runtime.LockOSThread()
		b, err := t.probeKerndatLocked(ctx)
		ch <- result{b, err}
	}()
	r := <-ch
	return r.b, r.err
}

func (t *Tool) probeKerndatLocked(ctx context.Context) ([]byte, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return nil, fmt.Errorf("unshare mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make mounts private: %w", err)
	}
	run := filepath.Dir(kdatPath)
	if err := unix.Mount("molt-criu-kdat", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0755"); err != nil {
		return nil, fmt.Errorf("mount tmpfs on %s: %w", run, err)
	}
	out, err := exec.CommandContext(ctx, t.path, "check").CombinedOutput()
	b, rerr := os.ReadFile(kdatPath)
	if rerr != nil || !bytes.HasPrefix(b, magicBytes()) {
		msg := strings.TrimSpace(string(out))
		if msg == "" && err != nil {
			msg = err.Error()
		}
		return nil, fmt.Errorf("criu check wrote no kernel probe: %s", msg)
	}
	return b, nil
}

// linkKdat makes kdatPath a symbolic link to cache, atomically; it leaves
// anything but a symbolic link alone.
func linkKdat(cache string) error {
	var st unix.Stat_t
	err := unix.Lstat(kdatPath, &st)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return fmt.Errorf("%s exists and is not a symbolic link: %w", kdatPath, errdefs.ErrFailedPrecondition)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	tmp := fmt.Sprintf("%s.molt-%d", kdatPath, os.Getpid())
	os.Remove(tmp)
	if err := os.Symlink(cache, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, kdatPath); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// kdatIdentity names what a probe depends on: the CRIU version, the
// kernel and the boot.
func kdatIdentity(version string) string {
	var u unix.Utsname
	unix.Uname(&u)
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return fmt.Sprintf("criu %s\nkernel %s %s\nboot %s\n", version,
		unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]),
		strings.TrimSpace(string(boot)))
}

func magicBytes() []byte {
	return binary.LittleEndian.AppendUint32(nil, kdatMagic)
}

// isKdat reports whether path holds a CRIU kernel probe.
func isKdat(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 0); err != nil {
		return false
	}
	return bytes.Equal(b, magicBytes())
}

func onTmpfs(path string) bool {
	var s unix.Statfs_t
	return unix.Statfs(path, &s) == nil && s.Type == unix.TMPFS_MAGIC
}

func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
