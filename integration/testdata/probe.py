import ctypes, errno, json, os, signal, socket, struct, sys, time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

# x86_64 system call numbers
NR = dict(ptrace=101, add_key=248, request_key=249, keyctl=250, unshare=272,
          perf_event_open=298, rt_sigqueueinfo=129, bpf=321, userfaultfd=323,
          io_uring_setup=425, fsopen=430, open_tree=428, mount_setattr=442,
          kexec_load=246, init_module=175, open_by_handle_at=304, setns=308)


def sys_(name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(NR[name], *args)
    return r, ctypes.get_errno()


def out(allowed, err=0, **kw):
    d = dict(allowed=bool(allowed), errno=errno.errorcode.get(err, str(err)))
    d.update(kw)
    print(json.dumps(d))
    sys.exit(0)


def unshare(flags):
    pid = os.fork()
    if pid == 0:
        r, e = sys_("unshare", ctypes.c_ulong(flags))
        os._exit(0 if r == 0 else 100 + e)
    _, st = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(st)
    out(code == 0, code - 100 if code >= 100 else 0)


def buf(n):
    return ctypes.create_string_buffer(n)


def main():
    what = sys.argv[1]
    if what.startswith("unshare:"):
        unshare(int(what.split(":")[1], 0))
    if what == "add_key":
        r, e = sys_("add_key", b"user", b"molt-probe", b"secret", 6, ctypes.c_int(-4))
        out(r >= 0, e)
    if what == "keyctl":
        # KEYCTL_GET_KEYRING_ID of the user keyring
        r, e = sys_("keyctl", 0, ctypes.c_int(-4), 0)
        out(r >= 0, e)
    if what == "request_key":
        r, e = sys_("request_key", b"user", b"molt-probe", None, 0)
        out(e != errno.EPERM and e != errno.ENOSYS, e)
    if what == "io_uring":
        p = buf(120)
        r, e = sys_("io_uring_setup", 8, p)
        out(r >= 0, e)
    if what == "perf_event_open":
        attr = bytearray(128)
        struct.pack_into("<IIQ", attr, 0, 1, 128, 0)  # PERF_TYPE_SOFTWARE, size, CPU_CLOCK
        # flags: disabled | exclude_kernel | exclude_hv
        struct.pack_into("<Q", attr, 40, 1 | (1 << 5) | (1 << 6))
        a = (ctypes.c_char * 128).from_buffer(attr)
        r, e = sys_("perf_event_open", a, 0, ctypes.c_int(-1), ctypes.c_int(-1), 0)
        out(r >= 0, e)
    if what == "bpf":
        # BPF_MAP_CREATE of a small array
        attr = bytearray(72)
        struct.pack_into("<IIII", attr, 0, 2, 4, 4, 1)
        a = (ctypes.c_char * 72).from_buffer(attr)
        r, e = sys_("bpf", 0, a, 72)
        out(r >= 0, e)
    if what == "userfaultfd":
        r, e = sys_("userfaultfd", os.O_CLOEXEC | 1)  # UFFD_USER_MODE_ONLY
        out(r >= 0, e)
    if what == "af_packet":
        try:
            socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)).close()
            out(True)
        except OSError as x:
            out(False, x.errno)
    if what == "raw_socket":
        try:
            socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
            out(True)
        except OSError as x:
            out(False, x.errno)
    if what == "fsopen":
        r, e = sys_("fsopen", b"tmpfs", 0)
        out(r >= 0, e)
    if what == "open_tree":
        r, e = sys_("open_tree", ctypes.c_int(-100), b"/", 1)  # OPEN_TREE_CLONE
        out(r >= 0, e)
    if what == "setns":
        fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        r, e = sys_("setns", fd, 0)
        out(r == 0, e)
    if what == "subvolume":
        # BTRFS_IOC_SUBVOL_CREATE on the root directory
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        args = bytearray(4096)
        name = b"molt-probe-subvol"
        args[8:8 + len(name)] = name
        a = (ctypes.c_char * 4096).from_buffer(args)
        libc.ioctl.restype = ctypes.c_int
        ctypes.set_errno(0)
        r = libc.ioctl(fd, ctypes.c_ulong(0x5000940E), a)
        e = ctypes.get_errno()
        out(r == 0 and os.path.isdir("/molt-probe-subvol"), e)
    if what == "ptrace_pid1":
        # PTRACE_SEIZE: the same permission check as PTRACE_ATTACH, without
        # stopping pid1; the tracee is let go when this process exits.
        r, e = sys_("ptrace", 0x4206, 1, 0, 0)
        out(r == 0, e)
    if what == "forge_sigusr2":
        comm = open("/proc/1/stat").read().split(")")[0].split("(", 1)[1]

        def copies():
            n = 0
            for p in os.listdir("/proc"):
                if not p.isdigit() or p == "1":
                    continue
                try:
                    s = open("/proc/%s/stat" % p).read()
                except OSError:
                    continue
                c = s.split(")")[0].split("(", 1)[1]
                st = s.rsplit(")", 1)[1].split()
                if c == comm and st[1] == "1":
                    n += 1
            return n

        before = copies()
        info = bytearray(128)
        # si_signo, si_errno, si_code = SI_QUEUE (-1); si_pid = 0, si_uid = 0
        struct.pack_into("<iii", info, 0, signal.SIGUSR2, 0, -1)
        a = (ctypes.c_char * 128).from_buffer(info)
        r, e = sys_("rt_sigqueueinfo", 1, signal.SIGUSR2, a)
        time.sleep(1.0)
        after = copies()
        out(after > before, e, sent=(r == 0), before=before, after=after)
    if what == "kexec":
        r, e = sys_("kexec_load", 0, 0, 0, 0)
        out(e not in (errno.EPERM, errno.ENOSYS), e)
    if what == "open_by_handle_at":
        h = buf(16)
        r, e = sys_("open_by_handle_at", ctypes.c_int(-100), h, 0)
        out(e not in (errno.EPERM, errno.ENOSYS), e)
    if what == "inotify":
        # Take inotify instances until refused (at most want); report how many.
        want = int(sys.argv[2])
        fds = []
        err = 0
        while len(fds) < want:
            r = libc.inotify_init1(os.O_CLOEXEC)
            if r < 0:
                err = ctypes.get_errno()
                break
            fds.append(r)
        print(json.dumps(dict(allowed=len(fds) >= want, errno=errno.errorcode.get(err, str(err)), n=len(fds))), flush=True)
        time.sleep(float(sys.argv[3]))
        sys.exit(0)
    if what == "forkbomb":
        # Fork sleeping children until refused or want; report how many.
        want = int(sys.argv[2])
        kids = []
        err = 0
        r, w = os.pipe()
        while len(kids) < want:
            try:
                pid = os.fork()
            except OSError as x:
                err = x.errno
                break
            if pid == 0:
                os.close(w)
                os.read(r, 1)
                os._exit(0)
            kids.append(pid)
        os.close(w)
        for k in kids:
            os.waitpid(k, 0)
        out(len(kids) >= want, err, n=len(kids))
    if what == "membomb":
        want = int(sys.argv[2])
        chunks = []
        try:
            while len(chunks) < want:
                b = bytearray(1 << 20)
                for i in range(0, len(b), 4096):
                    b[i] = 1
                chunks.append(b)
        except MemoryError:
            out(False, errno.ENOMEM, mib=len(chunks))
        out(True, 0, mib=len(chunks))
    print("unknown probe " + what, file=sys.stderr)
    sys.exit(2)


main()
