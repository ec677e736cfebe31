// Package core is molt's engine: images, sandboxes, checkpoints, rollback
// and fork, on top of the btrfs pool, cgroups, the sandbox init and the
// metadata store. The HTTP API is a thin layer over a Manager.
//
// Layout of the pool (all below pool.Dir):
//
//	images/NAME            read-only subvolume: an image's root
//	images/.NAME.json      the image's record
//	sandboxes/ID/root      writable subvolume: a sandbox's root
//	sandboxes/ID/sandbox.json  the sandbox's record
//	checkpoints/ID/fs      read-only subvolume: a checkpoint's files
//	checkpoints/ID/manifest.json  the checkpoint's record, "committed" once it is
//	bin/init-HASH          the init binary, reflinked into every root
//	tmp/                   staging; emptied at start
//	quarantine/TIME-KIND-ID  what start-up could not explain (rebuild.go)
//
// Invariants:
//   - An object is listed (has a metadata record) only once it is
//     complete on disk: the record is written last, and removed first.
//   - Whatever a failed operation created is undone (revert stacks);
//     whatever a crash left half-done is found and removed at start
//     (reconcile): staging directories, and directories that show they
//     never committed (no sandbox.json; no manifest, or one not marked
//     committed). Nothing else unlisted is deleted: a lost or corrupt
//     database is rebuilt from the on-disk records, and what nothing
//     explains is quarantined (rebuild.go), as is debris start-up cannot
//     delete: start-up never fails on what it finds in the pool.
//   - Every subvolume made for a sandbox joins its qgroup when quotas are
//     on (quota.go); a root holding nested subvolumes is never
//     checkpointed (nested.go).
//   - Lifecycle operations on one sandbox (checkpoint, rollback, stop,
//     start, remove) are serialized by that sandbox's lock; exec and
//     sessions do not take it.
package core
