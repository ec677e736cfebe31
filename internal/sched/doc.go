// Package sched is the host-wide scheduler for checkpoint background work:
// storing captured checkpoints, preparing standbys and deleting old roots
// and snapshots, for every sandbox on the host.
//
// # Why a scheduler
//
// A molt host runs many agent sandboxes on few resources: typically 2
// vCPUs and one disk. A full checkpoint returns to its agent once its
// instant is captured; storing its pages and manifest and committing it
// happen afterwards, in the background. Left to themselves, N sandboxes
// checkpointing at once start N writers that compete for the same disk
// and CPUs, and every sandbox's stall (the time it is frozen) and commit
// latency grow with N. The scheduler turns that free-for-all into a small,
// ordered, throttled stream of jobs. Each rule below exists for a reason:
//
//   - Classes with strict priority: Rollback > Persist > Standby > GC.
//     A rollback is on an agent's critical path: the agent waits for it.
//     A persist makes a captured checkpoint durable; until it commits,
//     anything that needs the checkpoint (a rollback to it, a fork, the
//     next checkpoint's commit) waits, so it comes next. Standbys are an
//     optimisation (they make a later rollback hot) and are worth doing
//     only when nothing more urgent is pending. GC can always wait: old
//     roots and snapshots only cost space until they go. Priority is not
//     preemptive: a running job finishes (or yields at Task.Charge).
//
//   - Bounded concurrency (Config.Workers, default 1 on <= 2 CPUs, else
//     NumCPU/2): more concurrent writers than the disk can serve only
//     lengthen every job and take CPU from the agents. Per-class caps
//     (Config.ClassWorkers) keep the low classes from holding every
//     worker when a persist arrives, since priority is not preemptive.
//
//   - Foreground: a rollback takes a few milliseconds, and background I/O
//     on the same disk would make it several times slower. While any
//     Foreground holder exists (or a Rollback-class job is queued or
//     running) no background job is dispatched and running background
//     jobs block at their next Task.Charge. Foreground is a counter under
//     one mutex: cheap enough to wrap every rollback.
//
//   - Priority inheritance: a foreground holder for sandbox S does not
//     pause S's own background work, and S's queued background jobs are
//     dispatched even past the worker limit. A rollback may have to wait
//     for its sandbox's pending checkpoint to commit; pausing that commit
//     behind the rollback would deadlock. Foreground("") pauses everything
//     and boosts nothing.
//
//   - I/O budget (Config.BytesPerSec, a token bucket with a burst):
//     background writes are spread out so the disk keeps headroom for the
//     agents' own I/O and for rollbacks. Jobs call Task.Charge for the
//     bytes they write; Charge delays them to stay within budget.
//
//   - Fairness: within a class, sandboxes take turns (round robin), so a
//     sandbox with 100 queued jobs cannot starve one with 1: a busy agent
//     must not make a quiet one's checkpoints slow.
//
//   - FIFO, one at a time, per (sandbox, class): a sandbox's checkpoints
//     share pages with the one before, so its persist jobs must commit in
//     the order they were captured. The scheduler guarantees the order by
//     running a (sandbox, class) pair's jobs strictly one after another.
//
//   - Back-pressure instead of unbounded queues (Config.MaxQueuedPerSandbox
//     per (sandbox, class), Config.MaxQueued host-wide): each queued
//     persist holds a captured checkpoint's staging data. When the host
//     cannot keep up, Submit blocks (and TrySubmit fails) so the producer
//     (the checkpoint call) slows down instead of staging without bound.
//
//   - Cancellation: a sandbox being removed must not keep the disk busy,
//     so CancelSandbox drops its queued jobs and cancels its running ones;
//     Close does the same for everything at shutdown and waits.
//
// # Using it
//
// Pausing and throttling are cooperative: a job is held back only inside
// Task.Charge. Jobs should charge as they go, in chunks (say per MiB
// written) rather than once at the end, and may call Charge(ctx, 0)
// wherever they could stop for a rollback.
//
// Submit's ctx bounds only the wait for queue space; the job itself runs
// under a context of the scheduler's, canceled by CancelSandbox and Close
// (a persist must outlive the request that captured its checkpoint).
// A job may Submit further work with its own ctx (or one derived from it):
// such a nested Submit never blocks on back-pressure, since blocking a
// worker until a worker frees a queue slot could deadlock. A job must not
// Wait for a job that needs a worker (with one worker, or in its own
// (sandbox, class) pair, that job can never start), and must not call
// Close.
package sched
