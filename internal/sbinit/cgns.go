package sbinit

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// ArgCgroupNS is the argv[1] that selects CgroupNSHolder in the molt
// binary.
const ArgCgroupNS = "__molt_cgns"

// CgroupNSHolder makes a cgroup namespace rooted where the daemon put
// this process (a sandbox's leaf cgroup) and holds it until the daemon
// has opened it: the daemon writes one byte on stdin once the process is
// in place, reads "ok TID" (the thread whose namespace it is) on stdout,
// and closes stdin when done. A CRIU that restores a sandbox's processes
// runs in that namespace, so the restored tree sees its own cgroup as the
// root, as a started one does (stage 1 unshares the same way).
func CgroupNSHolder() {
	runtime.LockOSThread()
	var b [1]byte
	if n, _ := os.Stdin.Read(b[:]); n != 1 {
		os.Exit(1)
	}
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("ok %d\n", unix.Gettid())
	_, _ = os.Stdin.Read(b[:])
	os.Exit(0)
}
