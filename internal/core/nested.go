package core

import (
	"fmt"
	"strings"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/fsnap"
)

// snapshotRoot makes dst a read-only snapshot of the sandbox root root
// for a checkpoint, refusing a root that holds nested btrfs subvolumes:
// a snapshot stores each of them as an empty directory, so the
// checkpoint would silently lose their files (and a rollback or fork
// from it would restore the sandbox without them).
//
// Refusing rather than snapshotting the nested subvolumes too and
// grafting them into the checkpoint: a sandbox cannot make a subvolume
// once its seccomp filter denies the btrfs ioctls, and nothing molt puts
// in a root (images, rollbacks, forks) holds one, so a nested subvolume
// is the sandbox's own doing; grafting would add a snapshot per nested
// subvolume to the frozen window, a writable phase to every read-only
// checkpoint, and the same grafting to every path that snapshots a
// checkpoint back (rollback, fork, standby, hibernate). The check reads
// the root tree (one ioctl, no walk of the sandbox's files) and runs with
// the sandbox frozen, so it cannot race a subvolume being made.
func snapshotRoot(root, dst string, groups []uint64) error {
	nested, err := fsnap.NestedSubvolumes(root)
	if err != nil {
		return err
	}
	if len(nested) > 0 {
		q := make([]string, len(nested))
		for i, p := range nested {
			q[i] = fmt.Sprintf("%q", "/"+p)
		}
		return fmt.Errorf("the sandbox's root holds btrfs subvolumes (%s), whose files a checkpoint would store as empty directories: delete them or move their files into plain directories: %w",
			strings.Join(q, ", "), errdefs.ErrFailedPrecondition)
	}
	return fsnap.SnapshotIn(root, dst, true, groups...)
}
