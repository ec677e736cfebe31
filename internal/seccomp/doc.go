// Package seccomp compiles system call filter profiles into classic BPF
// programs and installs them, without libseccomp.
//
// A Profile is data: a default action and rules naming system calls, each
// with an action and optional argument conditions. Default() is molt's
// own profile (Docker's default allowlist, tightened: see
// docs/security.md); ParseOCI reads a profile in the Docker/OCI JSON
// format. Compile turns a profile into a Program for x86-64, which the
// sandbox's stage 1 installs (Install) on the thread that executes pid1,
// after setting no_new_privs, so pid1 and every process of the sandbox
// run under it; CRIU dumps and restores the filter with the processes.
//
// The program: a system call from any other architecture than x86-64,
// or with the x32 bit set, kills the process; a number above the highest
// this package knows (zsysnum_amd64.go) fails with ENOSYS, as on a kernel
// without it; otherwise a binary search over the numbers leads to the
// call's action or to its conditional rules. The conditional rules of a
// call are tried in profile order and the first whose conditions all
// hold decides; then the call's unconditional rule, if any; then the
// profile's default action.
package seccomp
