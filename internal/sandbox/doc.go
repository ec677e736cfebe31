// Package sandbox is the host side of a sandbox's processes: it starts
// the sandbox's init in fresh namespaces inside the sandbox's cgroup,
// installs the init binary into the sandbox root, and talks to a running
// init over its abstract socket.
//
// An Init is plain data (host PID and the kernel's start time of that PID)
// so it can be stored and checked again after a daemon restart: a PID
// whose start time differs belongs to another process, and the sandbox's
// init is gone.
//
// Paths inside a sandbox root are never resolved by the host: the only
// file molt writes there from the host (the init binary) is written
// through openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so a symlink
// planted by a sandbox process cannot redirect it to a host file.
package sandbox
