package core

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// pidNSDepth returns how many levels below the PID namespace with inode
// ino pid lives (0: in it), or -1 if not in it or below.
func pidNSDepth(pid int, ino uint64) (int, error) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for depth := 0; depth < 8; depth++ {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return -1, err
		}
		if st.Ino == ino {
			unix.Close(fd)
			return depth, nil
		}
		parent, err := unix.IoctlRetInt(fd, unix.NS_GET_PARENT)
		unix.Close(fd)
		if err != nil {
			return -1, nil // EPERM: the top is reached
		}
		fd = parent
	}
	unix.Close(fd)
	return -1, nil
}
