package fsnap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Nested subvolumes. A process with CAP_SYS_ADMIN over a root (or, on
// kernels that allow it, any owner of a directory) can create a subvolume
// inside a sandbox's root. A snapshot does not descend into it (it shows
// up as an empty directory), and deleting the parent fails with ENOTEMPTY
// while it exists. The functions here find such subvolumes by their IDs
// in the filesystem's root tree, never by walking or resolving paths
// inside the tree (which a sandbox controls), and delete them by ID.

const (
	iocTreeSearch = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	iocInoLookup  = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)

	rootTreeObjectid = 1      // BTRFS_ROOT_TREE_OBJECTID
	rootRefKey       = 156    // BTRFS_ROOT_REF_KEY: (parent, ROOT_REF, child) -> struct btrfs_root_ref
	subvolSpecByID   = 1 << 4 // BTRFS_SUBVOL_SPEC_BY_ID
	searchHeaderSize = 32     // struct btrfs_ioctl_search_header
	rootRefSize      = 18     // struct btrfs_root_ref (packed): dirid, sequence, name_len
)

// struct btrfs_ioctl_search_key
type searchKey struct {
	treeID                   uint64
	minObjectid, maxObjectid uint64
	minOffset, maxOffset     uint64
	minTransid, maxTransid   uint64
	minType, maxType         uint32
	nrItems                  uint32
	_                        uint32
	_                        [4]uint64
}

// struct btrfs_ioctl_search_args
type searchArgs struct {
	key searchKey
	buf [4096 - 104]byte
}

// struct btrfs_ioctl_ino_lookup_args
type inoLookupArgs struct {
	treeID   uint64
	objectid uint64
	name     [4080]byte
}

var (
	_ [unsafe.Sizeof(searchKey{}) - 104]struct{}
	_ [104 - unsafe.Sizeof(searchKey{})]struct{}
	_ [unsafe.Sizeof(searchArgs{}) - 4096]struct{}
	_ [4096 - unsafe.Sizeof(searchArgs{})]struct{}
	_ [unsafe.Sizeof(inoLookupArgs{}) - 4096]struct{}
	_ [4096 - unsafe.Sizeof(inoLookupArgs{})]struct{}
)

// childRef is one subvolume directly below another.
type childRef struct {
	id    uint64
	dirid uint64 // inode, in the parent, of the directory holding it
	name  string
}

// children lists the subvolumes whose parent is the subvolume parent,
// with fd any open file of the filesystem. It needs CAP_SYS_ADMIN.
func children(fd int, parent uint64) ([]childRef, error) {
	var out []childRef
	var args searchArgs
	next := uint64(0)
	for {
		args.key = searchKey{
			treeID:      rootTreeObjectid,
			minObjectid: parent, maxObjectid: parent,
			minType: rootRefKey, maxType: rootRefKey,
			minOffset: next, maxOffset: ^uint64(0),
			maxTransid: ^uint64(0),
			nrItems:    4096,
		}
		if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&args)); err != nil {
			return nil, fmt.Errorf("search the root tree: %w", err)
		}
		if args.key.nrItems == 0 {
			return out, nil
		}
		buf := args.buf[:]
		last := next
		for i := uint32(0); i < args.key.nrItems; i++ {
			if len(buf) < searchHeaderSize {
				return nil, fmt.Errorf("search the root tree: short item header")
			}
			objectid := binary.LittleEndian.Uint64(buf[8:])
			offset := binary.LittleEndian.Uint64(buf[16:])
			typ := binary.LittleEndian.Uint32(buf[24:])
			n := int(binary.LittleEndian.Uint32(buf[28:]))
			buf = buf[searchHeaderSize:]
			if len(buf) < n {
				return nil, fmt.Errorf("search the root tree: short item")
			}
			item := buf[:n]
			buf = buf[n:]
			last = offset
			if objectid != parent || typ != rootRefKey || n < rootRefSize {
				continue
			}
			nameLen := int(binary.LittleEndian.Uint16(item[16:]))
			if rootRefSize+nameLen > n {
				return nil, fmt.Errorf("search the root tree: short root ref")
			}
			out = append(out, childRef{
				id:    offset,
				dirid: binary.LittleEndian.Uint64(item[0:]),
				name:  string(item[rootRefSize : rootRefSize+nameLen]),
			})
		}
		if last == ^uint64(0) {
			return out, nil
		}
		next = last + 1
	}
}

// subvolumeID returns the ID of the subvolume that holds the open file fd.
func subvolumeID(fd int) (uint64, error) {
	args := inoLookupArgs{objectid: firstFreeIno}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, err
	}
	return args.treeID, nil
}

// dirPath returns the path of directory dirid inside subvolume tree,
// relative to that subvolume's root ("" for the root itself, else ending
// in "/").
func dirPath(fd int, tree, dirid uint64) (string, error) {
	args := inoLookupArgs{treeID: tree, objectid: dirid}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&args)); err != nil {
		return "", err
	}
	return unix.ByteSliceToString(args.name[:]), nil
}

// NestedSubvolumes returns the paths, relative to path, of the
// subvolumes directly nested in the subvolume at path (any directory
// depth, one subvolume level), or none. It reads the filesystem's root
// tree and needs CAP_SYS_ADMIN; it does not walk the tree, so its cost
// does not grow with the number of files.
func NestedSubvolumes(path string) ([]string, error) {
	fd, err := openSubvolume(path)
	if err != nil {
		return nil, fmt.Errorf("nested subvolumes of %s: %w", path, err)
	}
	defer unix.Close(fd)
	id, err := subvolumeID(fd)
	if err != nil {
		return nil, fmt.Errorf("nested subvolumes of %s: %w", path, err)
	}
	refs, err := children(fd, id)
	if err != nil {
		return nil, fmt.Errorf("nested subvolumes of %s: %w", path, err)
	}
	var out []string
	for _, r := range refs {
		dir, err := dirPath(fd, id, r.dirid)
		if err != nil {
			// Deleted meanwhile, or a directory the lookup cannot
			// name: report the subvolume by its name alone.
			dir = "?/"
		}
		out = append(out, dir+r.name)
	}
	slices.Sort(out)
	return out, nil
}

// destroyByID deletes the subvolume id (not one with nested
// subvolumes), with fd any open file of the filesystem.
func destroyByID(fd int, id uint64) error {
	args := volArgsV2{flags: subvolSpecByID}
	binary.NativeEndian.PutUint64(args.name[:8], id)
	return ioctl(fd, iocSnapDestroyV2, unsafe.Pointer(&args))
}

// deleteNested deletes every subvolume below the subvolume at path,
// deepest first, by ID: nothing inside the tree is resolved by path, so
// a symlink or a rename there cannot redirect the deletion.
func deleteNested(path string) error {
	fd, err := openSubvolume(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	top, err := subvolumeID(fd)
	if err != nil {
		return err
	}
	// Breadth first; deleting the list backwards deletes every
	// subvolume after all of its descendants.
	var order []uint64
	queue := []uint64{top}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		refs, err := children(fd, id)
		if err != nil {
			if errors.Is(err, unix.EPERM) {
				return fmt.Errorf("%w (finding nested subvolumes needs CAP_SYS_ADMIN): %w", err, errdefs.ErrFailedPrecondition)
			}
			return err
		}
		for _, r := range refs {
			order = append(order, r.id)
			queue = append(queue, r.id)
		}
		if len(order) > maxNested {
			return fmt.Errorf("more than %d nested subvolumes: %w", maxNested, errdefs.ErrFailedPrecondition)
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		if err := destroyByID(fd, order[i]); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete nested subvolume %d: %w", order[i], err)
		}
	}
	return nil
}

// maxNested bounds the subvolumes deleteNested takes on at once: a tree
// that keeps making them is not chased for ever.
const maxNested = 100000

// SubvolumeID returns the ID of the subvolume whose root is path.
func SubvolumeID(path string) (uint64, error) {
	fd, err := openSubvolume(path)
	if err != nil {
		return 0, fmt.Errorf("subvolume id of %s: %w", path, err)
	}
	defer unix.Close(fd)
	id, err := subvolumeID(fd)
	if err != nil {
		return 0, fmt.Errorf("subvolume id of %s: %w", path, err)
	}
	return id, nil
}
