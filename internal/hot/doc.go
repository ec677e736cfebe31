// Package hot keeps what makes a rollback fast, ahead of need, and
// chooses how each rollback is done.
//
//   - Standbys: full checkpoints restored ahead (processes stopped, on
//     their own writable snapshot, in the sandbox's cgroup), the table of
//     them, their admission under the per-sandbox and host budgets, and
//     the waiters that prepare them once a sandbox's head stays put.
//   - Spares: CRIUs started ahead for the next restore or dump.
//   - Retired: roots a rollback replaced, deleted once the sandbox idles.
//   - Takeovers: the records of a switch of a sandbox's live tree that a
//     crash may interrupt, and their reading at start-up.
//   - Tiers: the rollback tiers (hot, warm, cold, restart) as one ordered
//     table, each with its preconditions.
//
// The package owns no sandbox: what it needs of one (its record, its
// cgroup, CRIU, the checkpoint artifact, the job scheduler) core passes
// in as small interfaces and function values. Each table that starts
// goroutines owns a context, a WaitGroup and a Close; core's
// Manager.Close calls them in its written order.
//
// Lock order: each table has one mutex, held only around its maps; no
// hook is called with it held, so hot's locks come after every lock of
// core and never nest with each other.
package hot
