// Package sbinit is the init process of a sandbox: the code that runs as
// PID 1 inside the sandbox's namespaces.
//
// It runs in two stages. Stage 1 is the molt binary re-executed by the
// daemon in fresh mount, PID, UTS, IPC and network namespaces: it reads its
// configuration from the sync socket (fd 3), makes the sandbox root the
// root of the mount namespace (pivot_root), mounts /proc, a read-only
// /sys and /dev/pts, writes the sandbox's identity (hostname, machine-id),
// brings up loopback, points stdio at the sandbox's own /dev/null, closes
// every other inherited descriptor and drops the capability bounding and
// inheritable sets to the sandbox default. It then executes stage 2 from
// the copy of the binary inside the sandbox root (/.molt/init), so that
// after setup nothing in the sandbox refers to a host file: the process
// tree can be dumped and restored by CRIU as it is.
//
// Stage 2 reaps every child (it is the PID namespace's init), keeps the
// persistent shell sessions, and serves requests from the daemon on the
// abstract unix socket "@molt-init" of the sandbox's network namespace.
// Each daemon connection carries one request and is closed after it, so no
// daemon descriptor stays inside the sandbox between requests.
//
// Invariants: stage 2 holds no descriptor that refers to anything outside
// the sandbox except a daemon connection during a request; every process
// it starts has stdio on pipes to init or on the sandbox's /dev/null.
package sbinit
