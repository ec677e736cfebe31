// Package cgroup creates, limits, freezes, kills and removes the control
// group of one sandbox.
//
// # Layout
//
// A sandbox cgroup has a name such as "molt/<id>", relative to the root of
// every hierarchy molt uses. The hierarchies are found once per process in
// /proc/self/mountinfo:
//
//   - "v2": /sys/fs/cgroup is cgroup2 and is the only hierarchy. The memory
//     and pids controllers are enabled in the parents' cgroup.subtree_control
//     when the parents offer them, so the shared parents (such as "molt")
//     must hold no processes themselves.
//   - "v1-hybrid": every mounted v1 hierarchy (freezer, memory, pids,
//     devices, cpu, cpuacct, cpuset, blkio, and the rest: net_cls,
//     perf_event, hugetlb, named ones such as name=systemd), so that no
//     sandbox process stays in a host cgroup of any hierarchy, plus the
//     cgroup2 hierarchy (usually /sys/fs/cgroup/unified) with no
//     controllers. The cgroup2 directory still provides cgroup.freeze,
//     cgroup.events and cgroup.kill, which are faster and more precise
//     than the v1 freezer, so they are preferred; the v1 freezer is the
//     fallback.
//   - "v1": like v1-hybrid without a cgroup2 mount.
//
// The primary hierarchy (v1 freezer when mounted, else the first one found)
// decides Exists and Pids.
//
// # Limits and the leaf
//
// The limits (memory, pids, CPU bandwidth, I/O weight, v1 devices) are
// written in the cgroup itself; its processes are added to its child
// Leaf ("molt/<id>/sandbox") in every hierarchy. Limits are
// hierarchical, so whatever the processes can write in their own cgroup
// (through a cgroup namespace rooted at the leaf and a cgroupfs mount of
// their own) only tightens them. Enforce reads the limits back, reports
// what differs from what the caller wants and writes it back. A cgroup
// made before leaves existed loads as legacy: its processes are in the
// cgroup itself.
//
// # Invariants
//
//   - New creates the primary directory first and every removal (New's undo,
//     Destroy) removes it last, so a half-created or half-removed cgroup is
//     still visible to Exists and Load and can be destroyed again.
//   - New either returns a complete cgroup or leaves nothing of it behind.
//     Shared parent directories ("molt") and the controllers enabled in their
//     cgroup.subtree_control are left in place: other sandboxes use them.
//   - No process is ever added to the cgroup itself, only to its leaf
//     (legacy cgroups aside); in a v1 cpuset hierarchy every directory
//     New makes gets its parent's cpus and mems before any task joins.
//   - On v1, the devices controller denies every device except the null,
//     zero, full, random, urandom, tty, ptmx and pts character devices. On v2
//     this package sets no device policy (v2 needs a BPF program for that).
//   - Freeze and Kill never return while the kernel still reports the group
//     as freezing or populated, unless the context ends first; a Freeze that
//     ends with its context thaws the group again.
//
// A Cgroup holds no file descriptors and is safe for concurrent use, though
// concurrent Freeze and Thaw calls race as they would on the files.
// The package never logs; errors carry lowercase context and wrap the
// errdefs kinds where one applies.
package cgroup
