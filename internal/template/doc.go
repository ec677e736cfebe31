// Package template makes copy-on-write copies of running processes by
// injecting fork-like clone(2) calls into them with ptrace: the building
// block of the template path that shrinks a checkpoint's frozen window
// from CRIU's page copy (about 0.7 ms per MiB of a process's memory here)
// to the kernel's page-table copy (about 1 ms for 100 MiB).
//
// A Tracer owns one locked OS thread (ptrace requests must come from the
// tracing thread). Seize stops a process at its next return to user mode
// (a process in a frozen cgroup stops when the cgroup is thawed); Clone
// then saves its registers, points it at a syscall instruction with the
// registers of clone(SIGCHLD), single-steps it through the call, and
// restores everything, so the interrupted system call restarts as if
// nothing happened. The copy starts stopped under the tracer with the
// original's registers as they were at the stop: it is the original at
// that instant, memory shared copy-on-write.
//
// What a copy does not have (see docs/templates.md): threads (only
// single-threaded processes are copied), its parent's place in the tree
// (it is the original's child), copies of shared kernel objects (it
// shares open file descriptions, pipes and sockets with the original),
// MAP_SHARED memory of its own, POSIX timers and fcntl locks. A signal
// that arrives during the injection is held and delivered when the
// original is released. A copy is kept from running should the tracer
// disappear: a SIGSTOP is queued for it at birth.
//
// x86-64 only: the injection writes the registers of that ABI.
package template
