// Package core is molt's engine: images, sandboxes, checkpoints, rollback
// and fork, on top of the btrfs pool, cgroups, the sandbox init and the
// metadata store. The HTTP API is a thin layer over a Manager.
//
// Layout of the pool (all below pool.Dir):
//
//	images/NAME            read-only subvolume: an image's root
//	sandboxes/ID/root      writable subvolume: a sandbox's root
//	checkpoints/ID/fs      read-only subvolume: a checkpoint's files
//	checkpoints/ID/manifest.json
//	bin/init-HASH          the init binary, reflinked into every root
//	tmp/                   staging; emptied at start
//
// Invariants:
//   - An object is listed (has a metadata record) only once it is
//     complete on disk: the record is written last, and removed first.
//   - Whatever a failed operation created is undone (revert stacks);
//     whatever a crash left half-done is found and removed at start
//     (reconcile): staging directories, and directories without records.
//   - Lifecycle operations on one sandbox (checkpoint, rollback, stop,
//     start, remove) are serialized by that sandbox's lock; exec and
//     sessions do not take it.
package core
