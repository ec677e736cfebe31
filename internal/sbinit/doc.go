// Package sbinit sets a sandbox up and serves the daemon's requests for it.
//
// Stage 1 is the molt binary re-executed by the daemon in fresh mount,
// PID, UTS, IPC and network namespaces: it reads its configuration from
// the sync socket (fd 3), makes the sandbox root the root of the mount
// namespace (pivot_root), mounts /proc, a read-only /sys and /dev/pts,
// writes the sandbox's identity (hostname, machine-id), brings up
// loopback, points stdio at the sandbox's own /dev/null, closes every
// other inherited descriptor, drops the capability bounding and
// inheritable sets to the sandbox default and installs the sandbox's
// seccomp filter with no_new_privs (package seccomp). It then executes pid1 (package
// pid1: a small, single-threaded C program) from its copy inside the
// sandbox root (/.molt/init), so that after setup nothing in the sandbox
// refers to a host file: the process tree can be dumped and restored by
// CRIU as it is, and pid1 costs CRIU about a millisecond.
//
// The logic runs in the daemon: an Agent per sandbox serves exec,
// sessions (persistent bash shells with per-call output, exit status and
// a digest of their state) and status. It starts processes through pid1,
// reads the sandbox's files (users, working directories) through pid1's
// root without following links out of it, and keeps the daemon's ends
// of each session's pipes; pid1 keeps copies, so a dump of the tree
// holds both ends, and a new Agent (after a restore or a daemon restart)
// takes them back from pid1's table.
//
// Invariants: pid1 holds no descriptor that refers to anything outside
// the sandbox except a daemon connection during a request; every process
// it starts has stdio on pipes to the daemon or on the sandbox's
// /dev/null; no process of the sandbox can talk to pid1 (it answers only
// peers outside the PID namespace).
package sbinit
