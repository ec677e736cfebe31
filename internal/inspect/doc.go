// Package inspect records, per agent turn, what the processes of one sandbox
// did to the operating system: files changed, processes spawned / exec'd /
// exited, sockets bound / listened / connected / accepted, and conservative
// "unknown" flags for things it cannot account for precisely (mounts, ptrace
// writes, io_uring, 32-bit syscalls, lost events, ...).
//
// # Kernel side
//
// Five BTF-enabled raw tracepoint programs (tp_btf, no tracefs needed):
// raw_syscalls sys_enter / sys_exit and sched_process_fork / _exec / _exit.
// A task is considered only if its cgroup2 id (or that of an ancestor
// cgroup) is in the "watched" map AND its pid namespace is the sandbox's live
// pid namespace or a descendant of it. Processes restored by CRIU into other
// pid namespaces of the same cgroup, and CRIU itself (host pid namespace), do
// not count until [Watch.SetTree] points the watch at their namespace.
//
// sys_enter classifies the syscall, filters, and stores the decoded
// arguments in a per-task map; sys_exit emits an event on the ring buffer if
// the call succeeded. Paths are resolved in the kernel like d_path, relative
// to the task's root (fs->root): from an fd's struct file, from the returned
// fd of open*, or, for path-based calls, from the dirfd / cwd with the user
// string appended here in user space. Write-like events are deduplicated per
// (cgroup, struct file, dentry, inode, op, turn), so a loop of 10k writes to
// one file costs one event per turn.
//
// # Turns and barriers
//
// Every turn has a generation number stored in the watched map entry; events
// carry the generation they were emitted in and are accounted to it. Cut bumps
// the generation, then asks the single ring-buffer reader to drain the ring
// until it is empty at a point after the request (ringbuf.Reader.Flush wakes
// the reader; sequence numbers under a mutex tell which requests an observed
// empty ring satisfies). Everything committed before Cut was called is
// therefore returned by that Cut; an event that straddles the boundary is
// reported in the later turn, never dropped.
//
// # Soundness notes
//
// Anything the inspector cannot resolve is reported conservatively: a path
// that could not be resolved is "?", events that could not be queued (ring
// full) and BPF program runs the kernel skipped (recursion misses) count in
// Effects.Lost, and operations whose effect is unknowable from syscall
// arguments raise an Unknown flag. See the package README-style comments on
// [Effects] for what each field means.
package inspect
