package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
)

// Adopt identifies a restored init (started by CRIU, not by a Launcher)
// and, when the restored process is a child of this process (CRIU
// restores as a sibling of itself), reaps it when it exits.
func Adopt(pid int) (Init, error) {
	init, err := InitOf(pid)
	if err != nil {
		return Init{}, fmt.Errorf("adopt restored init %d: %w", pid, err)
	}
	if ppid(pid) == os.Getpid() {
		go func() {
			var ws unix.WaitStatus
			for {
				_, err := unix.Wait4(pid, &ws, 0, nil)
				if err != unix.EINTR {
					return
				}
			}
		}()
	}
	return init, nil
}

func ppid(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// SetHostname sets the hostname of the UTS namespace of pid. A restored
// fork's UTS namespace comes with the hostname of the sandbox it was
// dumped from, and its init no longer has CAP_SYS_ADMIN to change it.
func SetHostname(pid int, hostname string) error {
	if err := ns.SetHostname(pid, hostname); err != nil {
		return fmt.Errorf("set hostname of %d: %w", pid, err)
	}
	return nil
}
