package capture

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
	"golang.org/x/sys/unix"
)

// hasCap reports whether the daemon holds capability c in its effective
// set.
func hasCap(c uint) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(c%32)) != 0
}

// CheckDumpable refuses, before anything is frozen, a tree CRIU cannot
// dump on this host: without CAP_SYS_RESOURCE, CRIU cannot read the
// rlimits of a process that runs as another user than root.
func CheckDumpable(cg *cgroup.Cgroup) error {
	if hasCap(unix.CAP_SYS_RESOURCE) {
		return nil
	}
	pids, err := cg.Pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		uid, comm, ok := procUser(pid)
		if ok && uid != 0 {
			return fmt.Errorf("process %d (%s) runs as uid %d: CRIU cannot dump processes of users other than root on this host, which lacks CAP_SYS_RESOURCE (CRIU must read their resource limits); run it as root inside the sandbox, or take an fs checkpoint: %w",
				pid, comm, uid, errdefs.ErrNotSupported)
		}
	}
	return nil
}

// procUser returns the first non-root uid (real, effective, saved or
// filesystem) of pid, or 0, and its command name.
func procUser(pid int) (uid int, comm string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, "", false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, found := strings.CutPrefix(l, "Name:"); found {
			comm = strings.TrimSpace(v)
		}
		if v, found := strings.CutPrefix(l, "Uid:"); found {
			for _, f := range strings.Fields(v) {
				if n, err := strconv.Atoi(f); err == nil && n != 0 {
					uid = n
				}
			}
		}
	}
	return uid, comm, true
}

// sysvIPCInUse reports whether the IPC namespace of process pid holds
// System V objects (shared memory, semaphores, message queues), which
// live in the namespace, not in any process: a checkpoint that leaves
// the namespace out of the images would lose them.
func sysvIPCInUse(pid int) (bool, error) {
	inUse := false
	err := ns.DoPid(pid, unix.CLONE_NEWIPC, func() error {
		// The files list the reading thread's namespace's objects, one
		// per line after a header.
		for _, f := range []string{"shm", "sem", "msg"} {
			b, err := os.ReadFile("/proc/sysvipc/" + f)
			if err != nil {
				return err
			}
			if strings.Count(strings.TrimSpace(string(b)), "\n") > 0 {
				inUse = true
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("the System V IPC objects of process %d: %w", pid, err)
	}
	return inUse, nil
}
