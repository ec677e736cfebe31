// Package pool provides molt's btrfs storage pool: the directory under the
// daemon's state root where images, sandboxes and checkpoints live as
// subvolumes.
//
// When the state root is on btrfs, the pool is the plain directory
// Root/pool. Otherwise the pool is a btrfs filesystem in the sparse file
// Root/pool.img, attached to a loop device and mounted on Root/pool.
//
// Invariants:
//   - Open is idempotent and serialized by an flock on Root: a pool that is
//     already mounted is reused, never mounted twice, and an image file is
//     formatted at most once (mkfs.btrfs writes Root/pool.img.tmp, which is
//     renamed into place only when complete).
//   - The loop device is attached with LO_FLAGS_AUTOCLEAR and no fd of it is
//     kept, so unmounting the pool releases the device; if the mount fails the
//     device is detached at once. Nothing leaks when Open fails.
//   - A loop pool mount is private, so mounts made inside sandbox mount
//     namespaces never propagate back to the host, or the reverse.
//   - After Open, Dir/images, Dir/sandboxes, Dir/checkpoints and Dir/tmp
//     exist with mode 0700.
//
// Space and Room report the room left for data in the pool and, for a
// loop pool, on the filesystem under it (the sparse image grows into it);
// callers check Room before work that writes, so a full disk refuses new
// work rather than failing it half-way.
//
// The package is low level: it never logs.
package pool
