package sbinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/seccomp"
)

// syncFD is the socket shared with the daemon during start-up.
const syncFD = 3

// DefaultCaps is the capability set sandbox processes keep: the common
// container default without CAP_MKNOD (molt provides the device nodes, and
// a process able to create them could reach host devices), CAP_NET_RAW
// (raw and packet sockets: spoofing on the host's side of a network),
// CAP_SETPCAP and CAP_SETFCAP (moving capabilities around, writing file
// capabilities that a user namespace would honour) and CAP_AUDIT_WRITE
// (the host's audit log). docs/security.md.
var DefaultCaps = []uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_KILL, unix.CAP_SETGID, unix.CAP_SETUID,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT,
}

// DefaultCapNames names DefaultCaps, as seccomp profiles do.
var DefaultCapNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
}

// Stage1 sets up the sandbox and executes pid1. It runs with the
// sandbox root as its working directory, in the new namespaces, and only
// returns on error (after reporting it on the sync socket).
func Stage1() {
	sync := os.NewFile(syncFD, "sync")
	err := stage1(sync)
	fmt.Fprintf(sync, "error: %v\n", err)
	os.Exit(1)
}

func stage1(sync *os.File) error {
	line, mnt, err := readConfig(int(sync.Fd()))
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var cfg Config
	if err := json.Unmarshal(line, &cfg); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	if cfg.RootMount != (mnt >= 0) {
		return fmt.Errorf("read config: root mount expected %v, received %v", cfg.RootMount, mnt >= 0)
	}
	if err := setupRoot(cfg.Root, mnt); err != nil {
		return err
	}
	if err := setupDev(); err != nil {
		return err
	}
	if err := mountSpecial(mnt < 0); err != nil {
		return err
	}
	if mnt >= 0 {
		if err := detachOldRoot(); err != nil {
			return err
		}
	}
	if err := writeIdentity(cfg); err != nil {
		return err
	}
	if err := ns.LoopbackUp(); err != nil {
		return err
	}
	if err := stdioToDevNull(); err != nil {
		return err
	}
	if err := unix.CloseRange(syncFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close inherited fds: %w", err)
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for k, v := range cfg.Env {
		env = append(env, k+"="+v)
	}
	// The bounding and inheritable sets are per thread: drop them on the
	// thread that executes pid1, so pid1 and every process it starts
	// inherit the reduced sets. pid1 reports "ok" on the sync socket (fd
	// 3) once it listens.
	runtime.LockOSThread()
	// A cgroup namespace rooted at the sandbox's leaf cgroup, which the
	// daemon put this process in before sending the config: the sandbox
	// sees its own cgroup as "/" and cannot name the one above, where
	// its limits are. Namespaces are per thread: this is the thread
	// that executes pid1.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	if err := dropCaps(); err != nil {
		return err
	}
	// Last, so that nothing above depends on what the filter allows;
	// the filter must allow execve, which every usable profile does.
	if len(cfg.Seccomp) > 0 {
		prog, err := seccomp.ProgramFromBytes(cfg.Seccomp)
		if err != nil {
			return err
		}
		if err := seccomp.Install(prog); err != nil {
			return err
		}
	}
	argv := []string{InitPath, PID1Socket}
	if mnt >= 0 {
		// A user namespace of its own: pid1 stays dumpable (pid1.c).
		argv = append(argv, "dumpable")
	}
	err = unix.Exec(InitPath, argv, env)
	return fmt.Errorf("exec %s: %w", InitPath, err)
}

// readConfig reads the config line from the daemon, and the root mount
// passed with it (-1 if none).
func readConfig(fd int) (line []byte, mnt int, err error) {
	mnt = -1
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, mnt, err
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return nil, mnt, err
			}
			for _, m := range msgs {
				fds, err := unix.ParseUnixRights(&m)
				if err != nil {
					return nil, mnt, err
				}
				for _, f := range fds {
					if mnt < 0 {
						mnt = f
					} else {
						unix.Close(f)
					}
				}
			}
		}
		if n == 0 {
			return nil, mnt, io.ErrUnexpectedEOF
		}
		line = append(line, buf[:n]...)
		if line[len(line)-1] == '\n' {
			return line, mnt, nil
		}
	}
}

// setupRoot makes root (a host path chosen by the daemon) the root of this
// mount namespace: root bound onto itself, or mnt, the root's idmapped
// mount. Nothing under the sandbox root is touched before pivot_root, so
// symlinks planted in it cannot point setup at host paths.
func setupRoot(root string, mnt int) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if mnt >= 0 {
		// In a user namespace this process is an unprivileged host uid:
		// the root's host path lies under the daemon's 0700 directories,
		// out of its reach. The mount goes on /proc instead (present on
		// every host, searchable by anyone; covered only in this mount
		// namespace, and detached with the old root below).
		root = "/proc"
		err := unix.MoveMount(mnt, "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH)
		unix.Close(mnt)
		if err != nil {
			return fmt.Errorf("mount sandbox root: %w", err)
		}
	} else if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind sandbox root: %w", err)
	}
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if mnt >= 0 {
		// In a user namespace the kernel mounts /proc and /sys only
		// while a full proc and sysfs mount is in the namespace: the old
		// root stays, on a directory of the new one, until mountSpecial
		// is done (detachOldRoot).
		// A link left there by the sandbox goes; a directory is reused.
		if fi, err := os.Lstat(oldRoot[1:]); err == nil && !fi.IsDir() {
			if err := os.Remove(oldRoot[1:]); err != nil {
				return fmt.Errorf("replace %s: %w", oldRoot, err)
			}
		}
		if err := unix.Mkdir(oldRoot[1:], 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("mkdir %s: %w", oldRoot, err)
		}
		if err := unix.PivotRoot(".", oldRoot[1:]); err != nil {
			return fmt.Errorf("pivot_root: %w", err)
		}
		return unix.Chdir("/")
	}
	// pivot_root(".", ".") stacks the old root on top of the new one; the
	// detach then removes it, without needing a directory for it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// oldRoot is where the host's root stays during a user namespace's
// set-up (setupRoot).
const oldRoot = "/.molt-oldroot"

// detachOldRoot removes the host's root from a user namespace's mount
// namespace once the sandbox's own mounts are made.
func detachOldRoot() error {
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Rmdir(oldRoot); err != nil {
		return fmt.Errorf("remove %s: %w", oldRoot, err)
	}
	return nil
}

type devNode struct {
	name         string
	major, minor uint32
}

var devNodes = []devNode{
	{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7},
	{"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0},
}

// setupDev gives the sandbox a minimal /dev made of real nodes in its own
// filesystem (a tmpfs would cost every CRIU dump and restore an archive).
func setupDev() error {
	for _, d := range []string{"/dev", "/dev/pts", "/dev/shm", "/proc", "/sys", "/tmp"} {
		if err := ensureDir(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod("/dev/shm", 0o1777|os.ModeSticky); err != nil {
		return err
	}
	for _, n := range devNodes {
		p := "/dev/" + n.name
		dev := unix.Mkdev(n.major, n.minor)
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(dev)); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := os.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	links := map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
		"/dev/ptmx": "pts/ptmx", "/dev/core": "/proc/kcore",
	}
	for name, target := range links {
		if cur, err := os.Readlink(name); err == nil && cur == target {
			continue
		}
		_ = os.RemoveAll(name)
		if err := os.Symlink(target, name); err != nil {
			return err
		}
	}
	return nil
}

func ensureDir(p string, mode os.FileMode) error {
	fi, err := os.Lstat(p)
	if err == nil && fi.IsDir() {
		return nil
	}
	if err == nil {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("replace %s with a directory: %w", p, err)
		}
	}
	if err := os.Mkdir(p, mode); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// maskedPaths hide host information and kernel interfaces a sandbox has
// no use for; readonlyPaths keep kernel knobs out of reach. Both are
// runc's defaults (libcontainer/specconv's example spec) with Docker's
// additions (/proc/interrupts, powercap's energy counters: a side
// channel). Paths this kernel lacks are skipped.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap", "/sys/devices/virtual/tpm",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// mountSpecial mounts /proc, /dev/pts and, with sys, /sys. A sandbox in
// a user namespace has no /sys: the kernel lets a user namespace mount
// sysfs only for a network namespace it owns, and a restore puts the
// tree in a fresh network namespace of the host's, so CRIU could not
// mount it back (docs/architecture.md, "User namespaces").
func mountSpecial(sys bool) error {
	const std = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("proc", "/proc", "proc", std, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if sys {
		if err := unix.Mount("sysfs", "/sys", "sysfs", std|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mount /sys: %w", err)
		}
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	return maskPaths(maskedPaths, readonlyPaths)
}

// permanentlyEmpty is a sysfs directory that the kernel keeps empty (a
// mount point made with sysfs_create_mount_point: nothing can be created
// in it) and that the sandbox's read-only /sys holds, as long as nothing
// is mounted on it yet.
const permanentlyEmpty = "/sys/fs/cgroup"

// maskPaths hides files under /dev/null and directories under an empty
// read-only directory, then makes readonly read-only.
//
// The empty directory is a read-only bind of permanentlyEmpty: CRIU
// restores a bind of sysfs as a bind, for nothing. An empty tmpfs, as
// runc mounts, costs every CRIU dump and restore a tar and gzip child
// (tens of milliseconds here, in the frozen window of a dump); it is
// used only on a host whose sysfs lacks the directory, and then once,
// with binds of it elsewhere.
func maskPaths(masked, readonly []string) error {
	const std = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	emptyDir := ""
	if ents, err := os.ReadDir(permanentlyEmpty); err == nil && len(ents) == 0 {
		emptyDir = permanentlyEmpty
	}
	for _, p := range masked {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("mask %s: %w", p, err)
		}
		var err error
		switch {
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		case emptyDir == "":
			err = unix.Mount("tmpfs", p, "tmpfs", std|unix.MS_RDONLY, "size=4k,mode=0555")
			emptyDir = p
		default:
			if err = unix.Mount(emptyDir, p, "", unix.MS_BIND, ""); err == nil {
				err = unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|std, "")
			}
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, p := range readonly {
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return fmt.Errorf("bind %s: %w", p, err)
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC|std, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", p, err)
		}
	}
	return nil
}

// writeIdentity gives the sandbox its hostname and machine-id. It runs
// after pivot_root, so the paths resolve inside the sandbox.
func writeIdentity(cfg Config) error {
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := ensureDir("/etc", 0o755); err != nil {
		return err
	}
	if err := replaceFile("/etc/hostname", cfg.Hostname+"\n"); err != nil {
		return err
	}
	if cfg.MachineID != "" {
		if err := replaceFile("/etc/machine-id", cfg.MachineID+"\n"); err != nil {
			return err
		}
	}
	hosts, _ := os.ReadFile("/etc/hosts")
	want := "127.0.1.1\t" + cfg.Hostname
	if !strings.Contains(string(hosts), want+"\n") {
		var b strings.Builder
		if len(hosts) == 0 {
			b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
		}
		for _, l := range strings.SplitAfter(string(hosts), "\n") {
			if !strings.HasPrefix(l, "127.0.1.1") {
				b.WriteString(l)
			}
		}
		b.WriteString(want + "\n")
		if err := replaceFile("/etc/hosts", b.String()); err != nil {
			return err
		}
	}
	return nil
}

func replaceFile(p, content string) error {
	tmp := p + ".molt-tmp"
	_ = os.Remove(tmp)
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func stdioToDevNull() error {
	fd, err := unix.Open("/dev/null", unix.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open /dev/null: %w", err)
	}
	for i := 0; i < 3; i++ {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return err
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
	return nil
}

// dropCaps reduces the calling thread's bounding and inheritable sets to
// DefaultCaps. Clearing the inheritable set matters as much as the
// bounding set: a file with inheritable file capabilities would otherwise
// grant capabilities outside the bounding set.
func dropCaps() error {
	keep := map[uintptr]bool{}
	var mask [2]uint32
	for _, c := range DefaultCaps {
		keep[c] = true
		mask[c/32] |= 1 << (c % 32)
	}
	last := uintptr(unix.CAP_LAST_CAP)
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = uintptr(n)
		}
	}
	for c := uintptr(0); c <= last; c++ {
		if keep[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for i := range data {
		data[i].Inheritable = mask[i]
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
