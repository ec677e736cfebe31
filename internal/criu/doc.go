// Package criu checkpoints and restores process trees with one CRIU
// binary, spoken to over CRIU's RPC protocol (`criu swrk`).
//
// A Tool wraps the binary: Dump and Restore translate molt's options into
// CRIU's RPC options (DumpOptions.PostDump answers CRIU's post-dump
// notification, while the tree is still stopped), Probe reports what this
// host can do (version, `criu check`, lazy pages, dirty tracking, an
// end-to-end self-test) and CacheKerndat makes CRIU keep its kernel probe
// between calls on hosts whose /run is not a tmpfs (it halves the time of
// a small dump or restore there).
//
// The RPC transport is this package's own, as in runc: go-criu provides
// the protocol messages (rpc) and the statistics image (stats), but its
// client cannot be stopped from outside. Each call starts `PATH swrk 3` in
// a process group of its own and, when the context ends (or after
// DefaultTimeout when it has no deadline), kills that group: CRIU can hang,
// for example at parasite cure when hardware breakpoints do not work.
//
// # Invariants
//
//   - No call outlives its context (a PostDump callback runs within it),
//     except the lazy-pages daemon of a successful lazy restore: the
//     restored tasks fault their memory in through it, so it runs until
//     every page is served (RestoreResult.LazyDone reports its end).
//   - A failed call returns an *Error whose text is the first real error of
//     CRIU's log, never the harmless "Can't setup RLIMIT_NOFILE" line that
//     every log has on hosts without CAP_SYS_RESOURCE (see LogError); Log
//     names the file.
//   - Logs and statistics go to the work directory (dump.log, restore.log,
//     lazy-pages.log, stats-dump, stats-restore), so several restores of
//     one image directory need separate work directories.
//   - Directories are handed to CRIU as descriptors of the calling
//     process, opened once per call, not as paths.
//   - Probe's result is computed once per Tool; a probe cut short by its
//     context is not memoized.
//
// The package never logs. Errors carry lowercase context and wrap the
// errdefs kinds where one applies (ErrNotSupported, with the reason, for a
// feature this host lacks).
package criu
