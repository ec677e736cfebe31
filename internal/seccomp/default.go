package seccomp

import "golang.org/x/sys/unix"

// allowed are the x86-64 calls Docker's default profile allows a
// container without CAP_SYS_ADMIN, CAP_SYS_PTRACE and the like, less
// name_to_handle_at (no use without open_by_handle_at, and it reveals
// file handles) and process_vm_readv/writev, plus chroot (molt keeps
// CAP_SYS_CHROOT) and ptrace (debuggers and strace; pid1 is not
// dumpable, so a process of the sandbox cannot attach to it).
var allowed = []string{
	"accept", "accept4", "access", "adjtimex", "alarm", "arch_prctl", "bind", "brk",
	"cachestat", "capget", "capset", "chdir", "chmod", "chown", "chroot",
	"clock_adjtime", "clock_getres", "clock_gettime", "clock_nanosleep", "close",
	"close_range", "connect", "copy_file_range", "creat", "dup", "dup2", "dup3",
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
	"epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve",
	"execveat", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64",
	"fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2",
	"fchown", "fchownat", "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock",
	"fork", "fremovexattr", "fsetxattr", "fstat", "fstatfs", "fsync", "ftruncate",
	"futex", "futex_requeue", "futex_wait", "futex_waitv", "futex_wake", "futimesat",
	"getcpu", "getcwd", "getdents", "getdents64", "getegid", "geteuid", "getgid",
	"getgroups", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid",
	"getppid", "getpriority", "getrandom", "getresgid", "getresuid", "getrlimit",
	"get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt",
	"get_thread_area", "gettid", "gettimeofday", "getuid", "getxattr", "getxattrat",
	"inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
	"io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "ioprio_get",
	"ioprio_set", "io_setup", "io_submit", "kill", "landlock_add_rule",
	"landlock_create_ruleset", "landlock_restrict_self", "lchown", "lgetxattr",
	"link", "linkat", "listen", "listmount", "listxattr", "listxattrat", "llistxattr",
	"lremovexattr", "lseek", "lsetxattr", "lstat", "madvise", "map_shadow_stack",
	"membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat",
	"mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "modify_ldt",
	"mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
	"mq_timedsend", "mq_unlink", "mremap", "mseal", "msgctl", "msgget", "msgrcv",
	"msgsnd", "msync", "munlock", "munlockall", "munmap", "nanosleep", "newfstatat",
	"open", "openat", "openat2", "pause", "pidfd_open", "pidfd_send_signal", "pipe",
	"pipe2", "pkey_alloc", "pkey_free", "pkey_mprotect", "poll", "ppoll", "prctl",
	"pread64", "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6",
	"ptrace", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink",
	"readlinkat", "readv", "recvfrom", "recvmmsg", "recvmsg", "remap_file_pages",
	"removexattr", "removexattrat", "rename", "renameat", "renameat2",
	"restart_syscall", "rmdir", "rseq", "rt_sigaction", "rt_sigpending",
	"rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
	"rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
	"sched_getparam", "sched_get_priority_max", "sched_get_priority_min",
	"sched_getscheduler", "sched_rr_get_interval", "sched_setaffinity",
	"sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield", "seccomp",
	"select", "semctl", "semget", "semop", "semtimedop", "sendfile", "sendmmsg",
	"sendmsg", "sendto", "setfsgid", "setfsuid", "setgid", "setgroups", "setitimer",
	"setpgid", "setpriority", "setregid", "setresgid", "setresuid", "setreuid",
	"setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
	"set_tid_address", "setuid", "setxattr", "setxattrat", "shmat", "shmctl", "shmdt",
	"shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "socketpair",
	"splice", "stat", "statfs", "statmount", "statx", "symlink", "symlinkat", "sync",
	"sync_file_range", "syncfs", "sysinfo", "tee", "tgkill", "time", "timer_create",
	"timer_delete", "timer_getoverrun", "timer_gettime", "timer_settime",
	"timerfd_create", "timerfd_gettime", "timerfd_settime", "times", "tkill",
	"truncate", "umask", "uname", "unlink", "unlinkat", "uretprobe", "utime",
	"utimensat", "utimes", "vfork", "vmsplice", "wait4", "waitid", "write", "writev",
	// Newer than Docker's list: the fsxattr ioctls as calls.
	"file_getattr", "file_setattr",
}

// Flags whose calls make namespaces: a user namespace gives its creator
// every capability inside it, and the rest of the kernel's attack
// surface with them. clone's low byte is the exit signal, so
// CLONE_NEWTIME only counts for unshare.
const (
	cloneNewMask   = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
	unshareNewMask = cloneNewMask | unix.CLONE_NEWTIME
)

// socketFamilies are the address families a sandbox may open sockets
// of: its network namespace has loopback only. Others fail with
// EAFNOSUPPORT, as on a kernel built without them.
var socketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// The btrfs ioctl type byte, and the three of its ioctls the VFS made
// generic (cp --reflink, deduplication), which stay allowed.
const (
	btrfsIoctlType = 0x94
	ioctlFICLONE   = 0x40049409
	ioctlFICLONER  = 0x4020940d
	ioctlFIDEDUPE  = 0xc0189436
)

// Default returns molt's default profile: Docker's default as the floor,
// tightened (docs/security.md lists the differences and why).
func Default() *Profile {
	eperm := ActErrno(unix.EPERM)
	p := &Profile{Default: eperm}
	p.Rules = append(p.Rules, Rule{Names: allowed, Action: ActAllow})
	p.Rules = append(p.Rules,
		Rule{Names: []string{"clone"}, Action: ActAllow, Conds: []Cond{{Index: 0, Op: OpMaskedEQ, Value: cloneNewMask, ValueTwo: 0}}},
		// glibc and musl fall back to clone on ENOSYS; clone3's flags
		// are in memory, out of the filter's reach.
		Rule{Names: []string{"clone3"}, Action: ActErrno(unix.ENOSYS)},
		Rule{Names: []string{"unshare"}, Action: ActAllow, Conds: []Cond{{Index: 0, Op: OpMaskedEQ, Value: unshareNewMask, ValueTwo: 0}}},
	)
	// personality: Linux, 32-bit and UNAME26 personalities, and the query.
	for _, v := range []uint64{0, 8, 0x20000, 0x20008, 0xffffffff} {
		p.Rules = append(p.Rules, Rule{Names: []string{"personality"}, Action: ActAllow, Conds: []Cond{{Index: 0, Op: OpEQ, Value: v}}})
	}
	// socket: no raw or packet IP sockets (the type's low four bits;
	// the rest are SOCK_NONBLOCK and SOCK_CLOEXEC), then the families
	// above. Netlink's SOCK_RAW is its ordinary type (ip, ss, glibc's
	// getaddrinfo use it), and AF_UNIX makes SOCK_RAW a datagram socket.
	for _, f := range []uint64{unix.AF_INET, unix.AF_INET6} {
		for _, t := range []uint64{unix.SOCK_RAW, unix.SOCK_PACKET} {
			p.Rules = append(p.Rules, Rule{Names: []string{"socket"}, Action: eperm, Conds: []Cond{
				{Index: 0, Op: OpEQ, Value: f}, {Index: 1, Op: OpMaskedEQ, Value: 0xf, ValueTwo: t}}})
		}
	}
	for _, f := range socketFamilies {
		p.Rules = append(p.Rules, Rule{Names: []string{"socket"}, Action: ActAllow, Conds: []Cond{{Index: 0, Op: OpEQ, Value: f}}})
	}
	p.Rules = append(p.Rules, Rule{Names: []string{"socket"}, Action: ActErrno(unix.EAFNOSUPPORT)})
	// ioctl: nothing of btrfs's (subvolumes, snapshots, quotas, the
	// default subvolume, send, scrub...) but the generic three. The
	// kernel reads cmd as 32 bits: masks below 2^32 ignore the rest.
	for _, c := range []uint64{ioctlFICLONE, ioctlFICLONER, ioctlFIDEDUPE} {
		p.Rules = append(p.Rules, Rule{Names: []string{"ioctl"}, Action: ActAllow, Conds: []Cond{{Index: 1, Op: OpMaskedEQ, Value: 0xffffffff, ValueTwo: c}}})
	}
	p.Rules = append(p.Rules,
		Rule{Names: []string{"ioctl"}, Action: eperm, Conds: []Cond{{Index: 1, Op: OpMaskedEQ, Value: 0xff00, ValueTwo: btrfsIoctlType << 8}}},
		Rule{Names: []string{"ioctl"}, Action: ActAllow},
	)
	return p
}
