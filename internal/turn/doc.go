// Package turn decides which checkpoint an agent's turn needs, observes
// what a sandbox's sessions and long-lived processes did, and keeps the
// turn log.
//
// A turn is what an agent did between two of its LLM calls. At a turn's
// end molt decides from what the turn did to the OS which checkpoint it
// needs (none, fs or full) and takes it. The evidence:
//
//   - files: the eBPF inspector's record of every file the sandbox's
//     processes created, wrote, truncated, renamed, deleted or changed
//     the metadata of;
//   - long-lived processes (alive at the turn's start or end, other than
//     init and sessions): started, exited, or ran at all. A process that
//     was not scheduled during the turn cannot have changed; one that was
//     may have (CPU time and timeslices from /proc, per thread, plus
//     "runnable now");
//   - sessions: init keeps a digest of each session's shell state after
//     every call (variables, functions, aliases, options, cwd, umask,
//     traps, directory stack); a changed digest, a new or a closed session
//     is a process change.
//
// The baseline a turn is compared with is the state its previous turn
// ended in: the previous checkpoint's consistent instant. Events between
// the collection and the checkpoint's freeze are in the checkpoint, so
// inside the frozen window the inspector is cut again and those events
// dropped (for an fs checkpoint only the file events: a process change
// there is not in an fs checkpoint, so it stays for the next turn).
// Whenever something cannot be known (the inspector is missing, events
// were lost, a ptrace write, a mount, io_uring), the decision is full:
// the inspector may over-checkpoint, it never says none when state
// changed.
//
// # How the engine calls it
//
// The engine (internal/core) keeps the sandbox lock and the checkpoint;
// a [Tracker] keeps everything else. The engine calls it at three kinds
// of points:
//
//   - the tree: [Tracker.Reset] when molt (re)placed a sandbox's process
//     tree (create, start, fork, fs rollback), [Tracker.Prepare] then
//     [Pending.BaselineAsync] around a process rollback (the inspector
//     follows the new tree before it runs, the baseline is taken after it
//     is continued), [Tracker.Forget] when the tree goes, [Tracker.Force]
//     when a checkpoint was captured but not committed;
//   - each command: [Tracker.Gate] before it (a command sent while a turn
//     end captures belongs to the next turn), [Tracker.Record] or
//     [Tracker.Recording] after;
//   - the turn end: [Tracker.Begin] observes and decides, the engine
//     takes the checkpoint of that kind calling [End.Frozen] inside its
//     frozen window, then [End.Commit] (or [End.Fail], or [End.Keep]
//     when nothing ends) and [End.Close].
//
// # Concurrency
//
// Lock order: a sandbox's state.mu, then Tracker.mu. state.mu is held by
// a turn end from Begin to Close (the whole checkpoint) and by a
// baseline from Prepare to its end, possibly in another goroutine; a
// second turn end, a baseline and an LLM record of that sandbox wait for
// it. Tracker.mu guards the table and each state's commands and ending
// count, which commands touch without waiting for a turn end.
//
// The goroutines a Tracker starts (asynchronous baselines and turn ends)
// run under its context and WaitGroup; Close cancels and waits for them,
// then closes every inspector watch.
//
// /proc of a sandbox's processes is written by the sandbox: every read
// here is bounded and parsed defensively, and what cannot be read makes
// the decision full rather than none.
package turn
