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
//   - "v1-hybrid": the v1 freezer, memory, pids, devices, cpu and cpuacct
//     hierarchies (those that are mounted) plus the cgroup2 hierarchy
//     (usually /sys/fs/cgroup/unified) with no controllers. The cgroup2
//     directory still provides cgroup.freeze, cgroup.events and cgroup.kill,
//     which are faster and more precise than the v1 freezer, so they are
//     preferred; the v1 freezer is the fallback.
//   - "v1": like v1-hybrid without a cgroup2 mount.
//
// The primary hierarchy (v1 freezer when mounted, else the first one found)
// decides Exists and Pids.
//
// # Invariants
//
//   - New creates the primary directory first and every removal (New's undo,
//     Destroy) removes it last, so a half-created or half-removed cgroup is
//     still visible to Exists and Load and can be destroyed again.
//   - New either returns a complete cgroup or leaves nothing of it behind.
//     Shared parent directories ("molt") and the controllers enabled in their
//     cgroup.subtree_control are left in place: other sandboxes use them.
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
