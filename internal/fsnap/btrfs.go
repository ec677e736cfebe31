package fsnap

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Kernel ABI from <linux/btrfs.h>; x/sys/unix does not define the btrfs
// ioctls. The request numbers encode the 4096-byte argument size.
const (
	iocSubvolCreate   = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	iocSnapDestroy    = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	iocSnapCreateV2   = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	iocSubvolGetflags = 0x80089419 // _IOR(0x94, 25, __u64)
	iocSubvolSetflags = 0x4008941a // _IOW(0x94, 26, __u64)
	iocSnapDestroyV2  = 0x5000943f // _IOW(0x94, 63, struct btrfs_ioctl_vol_args_v2)
	iocFsInfo         = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	iocGetSubvolInfo  = 0x81f8943c // _IOR(0x94, 60, struct btrfs_ioctl_get_subvol_info_args)

	subvolReadonly = 1 << 1 // BTRFS_SUBVOL_RDONLY
	firstFreeIno   = 256    // BTRFS_FIRST_FREE_OBJECTID: the root inode of every subvolume
	volNameMax     = 255    // BTRFS_VOL_NAME_MAX
)

// struct btrfs_ioctl_vol_args
type volArgs struct {
	fd   int64
	name [4088]byte
}

// struct btrfs_ioctl_vol_args_v2, with the qgroup union left zero.
type volArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// struct btrfs_ioctl_fs_info_args, up to the fields read here.
type fsInfoArgs struct {
	maxID      uint64
	numDevices uint64
	fsid       [16]byte
	nodesize   uint32
	sectorsize uint32
	rest       [1024 - 40]byte
}

// struct btrfs_ioctl_get_subvol_info_args, up to the fields read here.
type subvolInfoArgs struct {
	treeid     uint64
	name       [256]byte
	parentID   uint64
	dirid      uint64
	generation uint64
	flags      uint64
	uuid       [16]byte
	parentUUID [16]byte
	rest       [504 - 328]byte
}

// The vol args structs must be exactly 4096 bytes, the fs info one 1024,
// the subvolume info one 504, as the request numbers say.
var (
	_ [unsafe.Sizeof(subvolInfoArgs{}) - 504]struct{}
	_ [504 - unsafe.Sizeof(subvolInfoArgs{})]struct{}
	_ [unsafe.Sizeof(fsInfoArgs{}) - 1024]struct{}
	_ [1024 - unsafe.Sizeof(fsInfoArgs{})]struct{}
	_ [unsafe.Sizeof(volArgs{}) - 4096]struct{}
	_ [4096 - unsafe.Sizeof(volArgs{})]struct{}
	_ [unsafe.Sizeof(volArgsV2{}) - 4096]struct{}
	_ [4096 - unsafe.Sizeof(volArgsV2{})]struct{}
)

// deleteBusyTimeout bounds the EBUSY retries of DeleteSubvolume: a mount
// namespace of a container that was just killed can pin the subvolume for
// a moment while the kernel tears it down.
const deleteBusyTimeout = 2 * time.Second

// destroy deletes the subvolume name in the directory parent; tests replace
// it to inject failures.
var destroy = destroyIoctl

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

// NodeSize returns the metadata node size of the btrfs filesystem that
// holds path (fixed when it was made: mkfs.btrfs -n).
func NodeSize(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("node size of %s: %w", path, err)
	}
	defer unix.Close(fd)
	var args fsInfoArgs
	if err := ioctl(fd, iocFsInfo, unsafe.Pointer(&args)); err != nil {
		return 0, fmt.Errorf("node size of %s: %w", path, err)
	}
	return int(args.nodesize), nil
}

// SubvolumeUUID returns the UUID of the subvolume whose root is path, in
// hex. Unlike the subvolume's ID, which a filesystem may give again once
// the newest subvolume is deleted, a UUID names one subvolume for good:
// it tells a directory that was renamed into place from one that was
// not.
func SubvolumeUUID(path string) (string, error) {
	args, err := subvolInfo(path, "uuid")
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(args.uuid[:]), nil
}

// SnapshotOf returns the UUID of the subvolume the subvolume at path was
// snapshotted from, in hex ("" for one that was created empty).
func SnapshotOf(path string) (string, error) {
	args, err := subvolInfo(path, "parent uuid")
	if err != nil || args.parentUUID == [16]byte{} {
		return "", err
	}
	return hex.EncodeToString(args.parentUUID[:]), nil
}

// subvolInfo reads what btrfs says of the subvolume whose root is path;
// what names the caller's question in errors.
func subvolInfo(path, what string) (subvolInfoArgs, error) {
	var args subvolInfoArgs
	fd, err := openSubvolume(path)
	if err != nil {
		return args, fmt.Errorf("%s of %s: %w", what, path, err)
	}
	defer unix.Close(fd)
	if err := ioctl(fd, iocGetSubvolInfo, unsafe.Pointer(&args)); err != nil {
		return args, fmt.Errorf("%s of %s: %w", what, path, err)
	}
	return args, nil
}

// IsBtrfs reports whether path is on a btrfs filesystem.
func IsBtrfs(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Type == unix.BTRFS_SUPER_MAGIC, nil
}

// IsSubvolume reports whether path is the root directory of a btrfs
// subvolume. A symlink is not followed and reports false.
func IsSubvolume(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Ino != firstFreeIno {
		return false, nil
	}
	return IsBtrfs(path)
}

// CreateSubvolume creates an empty subvolume at path.
//
// Preconditions: the parent directory exists on btrfs; path does not exist.
func CreateSubvolume(path string) error {
	parent, name, err := openParent(path)
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	defer unix.Close(parent)
	var args volArgs
	copy(args.name[:], name)
	if err := ioctl(parent, iocSubvolCreate, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	return nil
}

// Snapshot creates dst as a copy-on-write snapshot of the subvolume src,
// read-only when readonly is set.
//
// Preconditions: src is a subvolume; dst does not exist and its parent is
// on the same btrfs filesystem as src.
func Snapshot(src, dst string, readonly bool) error {
	return SnapshotIn(src, dst, readonly)
}

// SnapshotIn is Snapshot with dst's qgroup made a member of groups
// (already made) in the same ioctl, so that what is written to dst is
// charged to them from the start.
func SnapshotIn(src, dst string, readonly bool, groups ...uint64) error {
	fail := func(err error) error { return fmt.Errorf("snapshot %s to %s: %w", src, dst, err) }
	sfd, err := openSubvolume(src)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(sfd)
	parent, name, err := openParent(dst)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(parent)
	args := volArgsV2{fd: int64(sfd)}
	if readonly {
		args.flags = subvolReadonly
	}
	copy(args.name[:], name)
	b, err := setInherit(&args, groups)
	if err != nil {
		return fail(err)
	}
	err = ioctl(parent, iocSnapCreateV2, unsafe.Pointer(&args))
	runtime.KeepAlive(b)
	if err != nil {
		return fail(err)
	}
	return nil
}

// DeleteSubvolume deletes the subvolume at path and everything in it,
// read-only or not, nested subvolumes included (deepest first, by ID:
// see deleteNested). It retries EBUSY for up to two seconds; recent
// kernels (6.18 checked) do not return it for a subvolume that is still
// mounted, even in another mount namespace: they delete it, and those
// mounts keep the files until they go away.
func DeleteSubvolume(path string) error {
	fail := func(err error) error { return fmt.Errorf("delete subvolume %s: %w", path, err) }
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fail(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fail(fmt.Errorf("not a directory: %w", errdefs.ErrInvalidArgument))
	}
	parent, name, err := openParent(path)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(parent)
	deadline := time.Now().Add(deleteBusyTimeout)
	nested := 0
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		err := destroy(parent, name)
		if err == nil {
			return nil
		}
		// Nested subvolumes: delete them and try again. Something
		// still running in the tree may make more meanwhile, so a
		// few rounds.
		if errors.Is(err, unix.ENOTEMPTY) && nested < 3 {
			nested++
			if err := deleteNested(path); err != nil {
				return fail(fmt.Errorf("nested subvolumes: %w", err))
			}
			continue
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fail(err)
		}
		time.Sleep(wait)
	}
}

func destroyIoctl(parent int, name string) error {
	args := volArgsV2{}
	copy(args.name[:], name)
	err := ioctl(parent, iocSnapDestroyV2, unsafe.Pointer(&args))
	if !errors.Is(err, unix.ENOTTY) {
		return err
	}
	// Kernels before 5.7 lack the v2 ioctl.
	var v1 volArgs
	copy(v1.name[:], name)
	return ioctl(parent, iocSnapDestroy, unsafe.Pointer(&v1))
}

// SetReadonly sets or clears the read-only flag of the subvolume at path.
func SetReadonly(path string, ro bool) error {
	fd, err := openSubvolume(path)
	if err != nil {
		return fmt.Errorf("set readonly %s: %w", path, err)
	}
	defer unix.Close(fd)
	var flags uint64
	if err := ioctl(fd, iocSubvolGetflags, unsafe.Pointer(&flags)); err != nil {
		return fmt.Errorf("set readonly %s: %w", path, err)
	}
	want := flags &^ subvolReadonly
	if ro {
		want |= subvolReadonly
	}
	if want == flags {
		return nil
	}
	if err := ioctl(fd, iocSubvolSetflags, unsafe.Pointer(&want)); err != nil {
		return fmt.Errorf("set readonly %s: %w", path, err)
	}
	return nil
}

// Readonly reports whether the subvolume at path is read-only.
func Readonly(path string) (bool, error) {
	fd, err := openSubvolume(path)
	if err != nil {
		return false, fmt.Errorf("get readonly %s: %w", path, err)
	}
	defer unix.Close(fd)
	var flags uint64
	if err := ioctl(fd, iocSubvolGetflags, unsafe.Pointer(&flags)); err != nil {
		return false, fmt.Errorf("get readonly %s: %w", path, err)
	}
	return flags&subvolReadonly != 0, nil
}

// SyncFS flushes the whole filesystem that holds path (syncfs(2)).
func SyncFS(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", path, err)
	}
	return nil
}

func openDir(path string) (int, error) {
	return unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// openParent opens the parent directory of path and returns it with the
// last path component, which the btrfs ioctls take as a bare name.
func openParent(path string) (int, string, error) {
	dir, name := filepath.Split(filepath.Clean(path))
	switch {
	case name == "" || name == "." || name == "..":
		return -1, "", fmt.Errorf("no name in path %q: %w", path, errdefs.ErrInvalidArgument)
	case len(name) > volNameMax:
		return -1, "", fmt.Errorf("name of %d bytes: %w", len(name), unix.ENAMETOOLONG)
	}
	if dir == "" {
		dir = "."
	}
	fd, err := openDir(dir)
	if err != nil {
		return -1, "", err
	}
	return fd, name, nil
}

// openSubvolume opens path, failing unless it is the root of a btrfs
// subvolume.
func openSubvolume(path string) (int, error) {
	fd, err := openDir(path)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if err = unix.Fstat(fd, &st); err == nil {
		err = unix.Fstatfs(fd, &sfs)
	}
	if err == nil && (sfs.Type != unix.BTRFS_SUPER_MAGIC || st.Ino != firstFreeIno) {
		err = fmt.Errorf("not a btrfs subvolume: %w", errdefs.ErrInvalidArgument)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// Reflink creates dst with mode perm as a copy-on-write clone of the regular
// file src (FICLONE); src must not be a symlink. Where cloning is not possible (another filesystem, or
// one without reflinks) it copies the bytes instead. dst must not exist; on
// failure it is removed.
func Reflink(src, dst string, perm os.FileMode) (err error) {
	fail := func(err error) error { return fmt.Errorf("reflink %s to %s: %w", src, dst, err) }
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fail(err)
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil {
		return fail(err)
	} else if !fi.Mode().IsRegular() {
		return fail(fmt.Errorf("not a regular file: %w", errdefs.ErrInvalidArgument))
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fail(cerr)
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	// The umask applied at creation must not narrow perm.
	if err := out.Chmod(perm); err != nil {
		return fail(err)
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL):
		if _, err := out.ReadFrom(in); err != nil {
			return fail(err)
		}
		return nil
	default:
		return fail(err)
	}
}
