package seccomp

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install sets no_new_privs and installs p on the calling thread (the
// caller locks it and executes the sandbox's first process from it;
// both are inherited across fork and exec). Without no_new_privs a
// process with CAP_SYS_ADMIN could install filters that a set-user-ID
// program then trips over; with it, the filter needs no privilege and
// no execve can gain privileges the sandbox did not have.
func Install(p Program) error {
	if len(p) == 0 {
		return fmt.Errorf("seccomp: empty program")
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	f := make([]unix.SockFilter, len(p))
	for i, ins := range p {
		f[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	prog := unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]}
	if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER): %w", e)
	}
	return nil
}
