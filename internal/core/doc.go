// Package core is molt's engine: images, sandboxes, checkpoints, rollback
// and fork, on top of the btrfs pool, cgroups, the sandbox init and the
// metadata store. The HTTP API is a thin layer over a Manager.
//
// Core keeps the locks, the lifecycle verbs, reconcile and the commit
// points (the record writes that make a change visible). The rest is in
// packages of its own, which core calls: internal/capture (the frozen
// window of a full checkpoint), internal/ckstore (the checkpoint
// artifact), internal/hot (standbys, spares, retired roots, takeovers,
// the rollback tiers), internal/turn (the turn decision and log) and
// internal/meta (the records). docs/architecture.md has the map.
//
// Layout of the pool (all below pool.Dir):
//
//	images/NAME            read-only subvolume: an image's root
//	images/.NAME.json      the image's record
//	sandboxes/ID/root      writable subvolume: a sandbox's root
//	sandboxes/ID/sandbox.json  the sandbox's record
//	checkpoints/ID/        a checkpoint's artifact (internal/ckstore):
//	  fs                   read-only subvolume: the checkpoint's files
//	  images/              CRIU's images, pages stored by content
//	  manifest.json        the checkpoint's record, "committed" once it is
//	bin/pid1-HASH          pid1, reflinked into every root
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
//
// # Locks
//
// Taken in this order, never the other way:
//
//  1. A sandbox's lock (Manager.lock, lockSandbox): held for a whole
//     lifecycle operation, minutes at most (a restore, a fork). Two
//     sandboxes' locks are never held together. The same table locks a
//     name ("name/N", taken before the lock of the sandbox being made
//     with it) and an image ("image/N", while it is built or removed).
//  2. The sandbox's turn state (internal/turn, state.mu): a turn end
//     takes it under the sandbox's lock; a command waits for it without
//     the sandbox's lock (Gate), so a turn end never waits for a
//     command.
//  3. The semaphores of the frozen window, in this order: a capture slot
//     (captureSlot), then the commit gate's foreground hold
//     (commitgate.go). A background commit (persist, a standby's
//     snapshot) holds the gate's background side alone.
//  4. Leaf locks, each guarding its own table and held for a few map
//     operations, never while taking another lock or calling out
//     (CRIU, the kernel, a hook): Manager.mu (the lock table, copying),
//     streamMu, inflight.mu, rooms.mu, pipeline.mu, quotaState.mu,
//     idBlocks.mu, commitGate.mu, and those of the packages core calls
//     (meta's record copies: Copies.wmu then Copies.mu; hot's tables,
//     turn's Tracker.mu, ckstore's stamp cache, capture's frozen-window
//     watch, the scheduler).
//
// Fields a leaf lock guards carry `+checklocks:` annotations, which
// gVisor's checklocks analyzer checks in make lint.
//
// # Goroutines and Close
//
// Every goroutine core or a package it calls starts belongs to an owner
// with a context or a closing channel, a WaitGroup and a Close: the turn
// Tracker, the persist pipeline, the scheduler, hot's Spares, Standbys
// and Retired, the limits' waiters (rooms.wg), the quota loop, the
// record writer. Manager.Close closes them in one order, written there:
// turn ends first (they add pending checkpoints), then the pipeline, the
// scheduler, spares, standbys, the limits' waiters, the pipe pool,
// retired roots, the quota loop, the records' copies (meta's Copies),
// the database.
package core
