package fsnap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Quota groups. A qgroup ID is level<<48 | id: every subvolume has the
// level-0 group 0/its ID; higher levels are groups of groups, made and
// linked by hand. A limit on a group fails writes to any subvolume under
// it with EDQUOT once the group's usage reaches it.
//
// Simple quotas (kernel 6.7+) charge an extent for its whole life to the
// subvolume that wrote it, never re-counting what snapshots share, so
// they cost nearly nothing per snapshot; full qgroups track which
// subvolumes reference each extent (backref walks at every transaction
// commit). See docs/architecture.md, "Disk quotas", for the numbers.

const (
	iocQuotaCtl       = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	iocQgroupAssign   = 0x40189429 // _IOW(0x94, 41, struct btrfs_ioctl_qgroup_assign_args)
	iocQgroupCreate   = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	iocQgroupLimit    = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)
	iocSubvolCreateV2 = 0x50009418 // _IOW(0x94, 24, struct btrfs_ioctl_vol_args_v2)
	iocGetFeatures    = 0x80189439 // _IOR(0x94, 57, struct btrfs_ioctl_feature_flags[1])

	quotaCtlEnable       = 1
	quotaCtlDisable      = 2
	quotaCtlEnableSimple = 4
	subvolQgroupInherit  = 1 << 2    // BTRFS_SUBVOL_QGROUP_INHERIT
	qgroupLimitMaxRfer   = 1 << 0    // BTRFS_QGROUP_LIMIT_MAX_RFER
	qgroupLimitMaxExcl   = 1 << 1    // BTRFS_QGROUP_LIMIT_MAX_EXCL
	incompatSimpleQuota  = 1 << 16   // BTRFS_FEATURE_INCOMPAT_SIMPLE_QUOTA
	quotaTreeObjectid    = 8         // BTRFS_QUOTA_TREE_OBJECTID
	qgroupInfoKey        = 242       // BTRFS_QGROUP_INFO_KEY
	qgroupLevelShift     = 48        // level << 48 | id
	qgroupIDMask         = 1<<48 - 1 //
	qgroupInheritSize    = 72        // struct btrfs_qgroup_inherit without its qgroups[]
	maxInherit           = 8         // groups a new subvolume joins at most here
	_                    = quotaCtlDisable
)

// Qgroup returns the ID of the qgroup level/id.
func Qgroup(level int, id uint64) uint64 {
	return uint64(level)<<qgroupLevelShift | id&qgroupIDMask
}

// QgroupString formats a qgroup ID as btrfs-progs does ("1/42").
func QgroupString(q uint64) string {
	return fmt.Sprintf("%d/%d", q>>qgroupLevelShift, q&qgroupIDMask)
}

// QuotaMode is how a filesystem accounts space to qgroups.
type QuotaMode int

const (
	QuotaOff    QuotaMode = iota // quotas disabled
	QuotaFull                    // full qgroups (btrfs quota enable)
	QuotaSimple                  // simple quotas (btrfs quota enable --simple)
)

func (q QuotaMode) String() string {
	return [...]string{"off", "full", "simple"}[q]
}

func withDir(path string, f func(fd int) error) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return f(fd)
}

// EnableQuota turns quota accounting on for the filesystem holding path,
// in mode (QuotaSimple or QuotaFull); it does nothing if quotas are
// already on, in either mode. Simple quotas set an incompatible feature
// flag: kernels before 6.7 no longer mount the filesystem.
func EnableQuota(path string, mode QuotaMode) error {
	cmd := uint64(quotaCtlEnable)
	if mode == QuotaSimple {
		cmd = quotaCtlEnableSimple
	}
	err := withDir(path, func(fd int) error {
		args := [2]uint64{cmd, 0}
		return ioctl(fd, iocQuotaCtl, unsafe.Pointer(&args))
	})
	if errors.Is(err, unix.EINVAL) && mode == QuotaSimple {
		err = fmt.Errorf("%w (simple quotas need Linux 6.7): %w", err, errdefs.ErrNotSupported)
	}
	if err != nil {
		return fmt.Errorf("enable %s quotas on %s: %w", mode, path, err)
	}
	return nil
}

// Quota reports how the filesystem holding path accounts quotas.
func Quota(path string) (QuotaMode, error) {
	var feats [3]uint64 // compat, compat_ro, incompat
	err := withDir(path, func(fd int) error { return ioctl(fd, iocGetFeatures, unsafe.Pointer(&feats)) })
	if err != nil {
		return QuotaOff, fmt.Errorf("quota mode of %s: %w", path, err)
	}
	if feats[2]&incompatSimpleQuota != 0 {
		return QuotaSimple, nil
	}
	// Full qgroups have a quota tree: look for any qgroup item in it.
	_, err = QgroupUsage(path, Qgroup(0, 5))
	switch {
	case err == nil:
		return QuotaFull, nil
	case errors.Is(err, unix.ENOENT), errors.Is(err, errdefs.ErrNotFound):
		return QuotaOff, nil
	}
	return QuotaOff, err
}

// CreateQgroup creates the qgroup q on the filesystem holding path; one
// that exists is no error.
func CreateQgroup(path string, q uint64) error {
	err := withDir(path, func(fd int) error {
		args := [2]uint64{1, q}
		return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&args))
	})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create qgroup %s: %w", QgroupString(q), err)
	}
	return nil
}

// DestroyQgroup deletes the qgroup q; a missing one is no error. It fails
// with EBUSY while q has members or still holds space.
func DestroyQgroup(path string, q uint64) error {
	err := withDir(path, func(fd int) error {
		args := [2]uint64{0, q}
		return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&args))
	})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("destroy qgroup %s: %w", QgroupString(q), err)
	}
	return nil
}

// AssignQgroup makes qgroup child a member of parent (assign) or takes
// it out (!assign). Already so is no error.
func AssignQgroup(path string, child, parent uint64, assign bool) error {
	a := uint64(0)
	if assign {
		a = 1
	}
	err := withDir(path, func(fd int) error {
		args := [3]uint64{a, child, parent}
		// A positive return asks for a rescan (full qgroups moving a
		// group that holds space); its numbers are then estimates.
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocQgroupAssign, uintptr(unsafe.Pointer(&args)))
		if errno != 0 {
			return errno
		}
		return nil
	})
	if err != nil && !(assign && errors.Is(err, unix.EEXIST)) && !(!assign && errors.Is(err, unix.ENOENT)) {
		return fmt.Errorf("assign qgroup %s to %s: %w", QgroupString(child), QgroupString(parent), err)
	}
	return nil
}

// LimitQgroup limits what qgroup q may hold to max bytes (0: no limit).
// Simple quotas count what the group's subvolumes wrote, shared or not,
// so the limit applies to that.
func LimitQgroup(path string, q uint64, max int64) error {
	var args struct {
		qgroupid uint64
		flags    uint64
		maxRfer  uint64
		maxExcl  uint64
		rsvRfer  uint64
		rsvExcl  uint64
	}
	args.qgroupid = q
	// Both limits, so the group is bounded in either accounting mode
	// (full qgroups count a shared extent in rfer, not excl).
	args.flags = qgroupLimitMaxRfer | qgroupLimitMaxExcl
	if max > 0 {
		args.maxRfer, args.maxExcl = uint64(max), uint64(max)
	} else {
		args.maxRfer, args.maxExcl = ^uint64(0), ^uint64(0)
	}
	if err := withDir(path, func(fd int) error { return ioctl(fd, iocQgroupLimit, unsafe.Pointer(&args)) }); err != nil {
		return fmt.Errorf("limit qgroup %s to %d bytes: %w", QgroupString(q), max, err)
	}
	return nil
}

// QgroupUsage returns the bytes the qgroup q holds (referenced; under
// simple quotas, what its subvolumes wrote and is still allocated). It
// needs CAP_SYS_ADMIN.
func QgroupUsage(path string, q uint64) (int64, error) {
	var used int64
	err := withDir(path, func(fd int) error {
		var args searchArgs
		args.key = searchKey{
			treeID:      quotaTreeObjectid,
			minObjectid: 0, maxObjectid: 0,
			minType: qgroupInfoKey, maxType: qgroupInfoKey,
			minOffset: q, maxOffset: q,
			maxTransid: ^uint64(0),
			nrItems:    1,
		}
		if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&args)); err != nil {
			return err
		}
		if args.key.nrItems == 0 {
			return fmt.Errorf("no qgroup %s: %w", QgroupString(q), errdefs.ErrNotFound)
		}
		item := args.buf[searchHeaderSize:]
		// struct btrfs_qgroup_info_item: generation, rfer, rfer_cmpr, excl, excl_cmpr
		used = int64(binary.LittleEndian.Uint64(item[8:]))
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("usage of qgroup %s: %w", QgroupString(q), err)
	}
	return used, nil
}

// inherit returns a struct btrfs_qgroup_inherit that adds a new
// subvolume to groups.
func inherit(groups []uint64) []byte {
	b := make([]byte, qgroupInheritSize+8*len(groups))
	binary.NativeEndian.PutUint64(b[8:], uint64(len(groups))) // num_qgroups
	for i, g := range groups {
		binary.NativeEndian.PutUint64(b[qgroupInheritSize+8*i:], g)
	}
	return b
}

// setInherit points args at an inherit struct for groups, or leaves it
// unset without groups; the caller keeps b alive across the ioctl.
func setInherit(args *volArgsV2, groups []uint64) (b []byte, err error) {
	if len(groups) == 0 {
		return nil, nil
	}
	if len(groups) > maxInherit {
		return nil, fmt.Errorf("%d qgroups: %w", len(groups), errdefs.ErrInvalidArgument)
	}
	b = inherit(groups)
	args.flags |= subvolQgroupInherit
	args.unused[0] = uint64(len(b))
	args.unused[1] = uint64(uintptr(unsafe.Pointer(&b[0])))
	return b, nil
}

// CreateSubvolumeIn creates an empty subvolume at path whose qgroup is a
// member of groups (already made).
func CreateSubvolumeIn(path string, groups ...uint64) error {
	if len(groups) == 0 {
		return CreateSubvolume(path)
	}
	parent, name, err := openParent(path)
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	defer unix.Close(parent)
	var args volArgsV2
	copy(args.name[:], name)
	b, err := setInherit(&args, groups)
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	err = ioctl(parent, iocSubvolCreateV2, unsafe.Pointer(&args))
	runtime.KeepAlive(b)
	if err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	return nil
}

// Qgroups lists the qgroups of level on the filesystem holding path. It
// needs CAP_SYS_ADMIN.
func Qgroups(path string, level int) ([]uint64, error) {
	var out []uint64
	err := withDir(path, func(fd int) error {
		next := Qgroup(level, 0)
		last := Qgroup(level, qgroupIDMask)
		for {
			var args searchArgs
			args.key = searchKey{
				treeID:      quotaTreeObjectid,
				minObjectid: 0, maxObjectid: 0,
				minType: qgroupInfoKey, maxType: qgroupInfoKey,
				minOffset: next, maxOffset: last,
				maxTransid: ^uint64(0),
				nrItems:    4096,
			}
			if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&args)); err != nil {
				return err
			}
			if args.key.nrItems == 0 {
				return nil
			}
			buf := args.buf[:]
			var off uint64
			for i := uint32(0); i < args.key.nrItems && len(buf) >= searchHeaderSize; i++ {
				off = binary.LittleEndian.Uint64(buf[16:])
				typ := binary.LittleEndian.Uint32(buf[24:])
				n := int(binary.LittleEndian.Uint32(buf[28:]))
				if typ == qgroupInfoKey && off >= next && off <= last {
					out = append(out, off)
				}
				if len(buf) < searchHeaderSize+n {
					break
				}
				buf = buf[searchHeaderSize+n:]
			}
			if off >= last {
				return nil
			}
			next = off + 1
		}
	})
	if err != nil {
		return nil, fmt.Errorf("list qgroups of level %d: %w", level, err)
	}
	return out, nil
}
