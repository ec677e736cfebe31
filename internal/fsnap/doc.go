// Package fsnap creates, snapshots and deletes btrfs subvolumes with the
// kernel's ioctls, without the btrfs CLI.
//
// A subvolume is the unit of copy-on-write: an image, a sandbox root or a
// checkpoint lives in its own subvolume so that Snapshot clones it in
// constant time, whatever the number of files, and DeleteSubvolume drops it
// without walking the tree.
//
// Invariants:
//   - Paths name the subvolume itself. The last component is resolved in its
//     parent directory, opened with O_DIRECTORY|O_NOFOLLOW, so a symlink in
//     that position is never followed.
//   - A snapshot is atomic: dst either does not exist or holds the whole
//     tree of src as it was when the ioctl ran. Snapshots do not descend
//     into nested subvolumes; those appear as empty directories (callers
//     that must not lose files check NestedSubvolumes first).
//   - DeleteSubvolume deletes nested subvolumes too, found in the root
//     tree and deleted by ID, deepest first: no path inside the tree is
//     resolved, so what a sandbox put there cannot redirect it.
//   - A read-only subvolume rejects writes with EROFS until SetReadonly
//     clears the flag; it can still be deleted.
//   - Errors wrap the cause with %w: a missing path satisfies
//     errors.Is(err, fs.ErrNotExist), an existing destination
//     errors.Is(err, fs.ErrExist), and misuse (a non-subvolume source, a bad
//     name) errors.Is(err, errdefs.ErrInvalidArgument).
//
// quota.go wraps btrfs quota groups: turning simple or full quotas on,
// making, linking and limiting qgroups, reading their usage, and making
// subvolumes and snapshots that join groups as they are made.
//
// The package is low level: it never logs and holds no state.
package fsnap
