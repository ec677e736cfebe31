package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/sbinit"
)

// IDRange is the block of host uids and gids a sandbox's user namespace
// maps its ids 0..Size-1 to (uid and gid alike). The zero range means no
// user namespace: the sandbox runs as host root, as before.
type IDRange struct {
	Base uint32 `json:"base"`
	Size uint32 `json:"size"`
}

// Enabled reports whether the range asks for a user namespace.
func (r IDRange) Enabled() bool { return r.Size > 0 }

func (r IDRange) String() string {
	if !r.Enabled() {
		return "none"
	}
	return fmt.Sprintf("%d-%d", r.Base, uint64(r.Base)+uint64(r.Size)-1)
}

func (r IDRange) uidMap() []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.Base), Size: int(r.Size)}}
}

// HoldUserNS returns a user namespace that maps ids as r does, for an
// idmapped mount made before the sandbox's own namespace exists (a
// restore: CRIU creates that one). It runs bin (a binary calling
// sbinit.RunIfInit) just long enough to open its namespace.
func HoldUserNS(bin string, r IDRange) (*os.File, error) {
	cmd := exec.Command(execPath(bin), sbinit.ArgHold)
	cmd.Env = []string{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: r.uidMap(),
		GidMappings: r.uidMap(),
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("user namespace for %s: %w", r, err)
	}
	// The maps are written before the child runs (exec.Cmd waits for
	// it), so the namespace can be opened at once; the holder exits on
	// EOF.
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	stdin.Close()
	_ = cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("user namespace for %s: %w", r, err)
	}
	return f, nil
}

// execPath is how a process that becomes an unprivileged host uid before
// it executes bin reaches it: bin may lie under directories only root can
// search (a test binary in a 0700 build directory), and /proc/self/exe
// jumps to the file without searching them. Other binaries keep their
// path.
func execPath(bin string) string {
	a, err := os.Stat(bin)
	if err != nil {
		return bin
	}
	if b, err := os.Stat("/proc/self/exe"); err == nil && os.SameFile(a, b) {
		return "/proc/self/exe"
	}
	return bin
}

// IDMappedTree returns a detached mount of dir (not recursive) whose
// files' owners are mapped through userns: a file owned by host uid 0 is
// seen as owned by root inside a sandbox whose namespace maps 0 as
// userns does, and a file the sandbox's root creates is stored as owned
// by uid 0. The caller closes the descriptor (or moves the mount).
func IDMappedTree(dir string, userns *os.File) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("idmapped mount of %s: open_tree: %w", dir, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmapped mount of %s: mount_setattr: %w", dir, err)
	}
	return fd, nil
}

// MountIDMapped mounts dir on target (an empty directory), idmapped as
// IDMappedTree does for the range r: the root CRIU restores a sandbox
// with a user namespace onto. The restored tree keeps its own copy of
// the mount; unmount the host's with the returned function once CRIU is
// done.
func MountIDMapped(bin, dir, target string, r IDRange) (unmount func() error, err error) {
	us, err := HoldUserNS(bin, r)
	if err != nil {
		return nil, err
	}
	defer us.Close()
	fd, err := IDMappedTree(dir, us)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return nil, fmt.Errorf("idmapped mount of %s on %s: %w", dir, target, err)
	}
	return func() error { return unix.Unmount(target, unix.MNT_DETACH) }, nil
}

// sendConfig writes the config line to stage 1, with fd (if >= 0) as
// SCM_RIGHTS on its first byte.
func sendConfig(sock *os.File, line []byte, fd int) error {
	if fd < 0 {
		_, err := sock.Write(line)
		return err
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(s uintptr) bool {
		serr = unix.Sendmsg(int(s), line[:1], unix.UnixRights(fd), nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	_, err = sock.Write(line[1:])
	return err
}

// devNodes are the device nodes of a sandbox's /dev (internal/sbinit
// makes them itself when it can: without a user namespace).
var devNodes = []struct {
	name         string
	major, minor uint32
}{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
	{"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

// MakeDevNodes creates the device nodes of root's /dev from the host,
// for a sandbox whose stage 1 runs in a user namespace (where mknod is
// refused). It runs before the sandbox's processes: nothing races it. The
// paths never leave root: /dev is opened beneath it without following
// links, and a node that is anything else is replaced.
func MakeDevNodes(root string) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("device nodes: open root: %w", err)
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	dfd, err := unix.Openat2(rfd, "dev", how)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(rfd, "dev", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("device nodes: mkdir /dev: %w", err)
		}
		dfd, err = unix.Openat2(rfd, "dev", how)
	}
	if err != nil {
		return fmt.Errorf("device nodes: open /dev: %w", err)
	}
	defer unix.Close(dfd)
	for _, n := range devNodes {
		dev := unix.Mkdev(n.major, n.minor)
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, n.name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev && st.Mode&0o777 == 0o666 && st.Uid == 0 {
				continue
			}
			flag := 0
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				flag = unix.AT_REMOVEDIR
			}
			if err := unix.Unlinkat(dfd, n.name, flag); err != nil {
				return fmt.Errorf("device nodes: replace /dev/%s: %w", n.name, err)
			}
		}
		if err := unix.Mknodat(dfd, n.name, unix.S_IFCHR|0o666, int(dev)); err != nil {
			return fmt.Errorf("device nodes: mknod /dev/%s: %w", n.name, err)
		}
		// The umask took bits off; the node is new and nothing runs in
		// the sandbox, so the name still refers to it.
		if err := unix.Fchmodat(dfd, n.name, 0o666, 0); err != nil {
			return fmt.Errorf("device nodes: chmod /dev/%s: %w", n.name, err)
		}
	}
	return nil
}
