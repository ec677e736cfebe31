package seccomp

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// run executes prog in x/net/bpf's interpreter on a seccomp_data. The
// interpreter loads words big-endian where the kernel loads them in the
// host's order, so each 32-bit word is stored big-endian here.
func run(t *testing.T, vm *bpf.VM, arch, nr uint32, args ...uint64) Action {
	t.Helper()
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], nr)
	binary.BigEndian.PutUint32(b[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
	}
	r, err := vm.Run(b)
	if err != nil {
		t.Fatal(err)
	}
	return Action(uint32(r))
}

func newVM(t *testing.T, p *Profile) *bpf.VM {
	t.Helper()
	prog, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	ins := make([]bpf.Instruction, len(prog))
	for i, r := range prog {
		ins[i] = r.Disassemble()
		if _, raw := ins[i].(bpf.RawInstruction); raw {
			t.Fatalf("instruction %d (%+v) is not valid BPF", i, r)
		}
	}
	back, err := ProgramFromBytes(prog.Bytes())
	if err != nil || len(back) != len(prog) {
		t.Fatalf("round trip of the program: %v", err)
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatal(err)
	}
	return vm
}

// eval is the profile's meaning (doc.go), computed directly.
func eval(p *Profile, nr uint32, args [6]uint64) Action {
	if nr > MaxSyscall {
		return ActErrno(unix.ENOSYS)
	}
	var uncond *Action
	for _, r := range p.Rules {
		for _, n := range r.Names {
			if num, ok := sysnums[n]; !ok || num != nr {
				continue
			}
			if len(r.Conds) == 0 {
				if uncond == nil {
					a := r.Action
					uncond = &a
				}
				continue
			}
			ok := true
			for _, c := range r.Conds {
				v := args[c.Index]
				var hold bool
				switch c.Op {
				case OpEQ:
					hold = v == c.Value
				case OpNE:
					hold = v != c.Value
				case OpLT:
					hold = v < c.Value
				case OpLE:
					hold = v <= c.Value
				case OpGT:
					hold = v > c.Value
				case OpGE:
					hold = v >= c.Value
				case OpMaskedEQ:
					hold = v&c.Value == c.ValueTwo
				case OpMaskedNE:
					hold = v&c.Value != c.ValueTwo
				}
				ok = ok && hold
			}
			if ok {
				return r.Action
			}
		}
	}
	if uncond != nil {
		return *uncond
	}
	return p.Default
}

func sys(t *testing.T, name string) uint32 {
	t.Helper()
	n, ok := sysnums[name]
	if !ok {
		t.Fatalf("no system call %q on x86-64", name)
	}
	return n
}

func TestDefaultNamesExist(t *testing.T) {
	for _, n := range allowed {
		sys(t, n)
	}
}

func TestDefaultProfile(t *testing.T) {
	vm := newVM(t, Default())
	eperm, enosys := ActErrno(unix.EPERM), ActErrno(unix.ENOSYS)
	type tc struct {
		name string
		args []uint64
		want Action
	}
	cases := []tc{
		{"read", nil, ActAllow}, {"write", nil, ActAllow}, {"execve", nil, ActAllow},
		{"exit_group", nil, ActAllow}, {"ptrace", nil, ActAllow}, {"chroot", nil, ActAllow},
		{"wait4", nil, ActAllow}, {"prctl", nil, ActAllow}, {"getitimer", nil, ActAllow},
		{"set_robust_list", nil, ActAllow}, {"kill", nil, ActAllow}, {"seccomp", nil, ActAllow},
		{"clone", []uint64{uint64(unix.SIGCHLD)}, ActAllow},
		{"clone", []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID}, ActAllow},
		{"clone", []uint64{uint64(unix.SIGCHLD) | unix.CLONE_PARENT | unix.CLONE_CHILD_CLEARTID}, ActAllow},
		{"clone3", nil, enosys},
		{"unshare", []uint64{unix.CLONE_FILES | unix.CLONE_FS}, ActAllow},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC}, ActAllow},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_DGRAM}, ActAllow},
		{"socket", []uint64{unix.AF_UNIX, unix.SOCK_SEQPACKET | unix.SOCK_NONBLOCK}, ActAllow},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_DGRAM}, ActAllow},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_RAW}, eperm},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_RAW | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK}, eperm},
		{"socket", []uint64{unix.AF_INET, 1<<32 | unix.SOCK_RAW}, eperm},
		{"socket", []uint64{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC}, ActAllow},
		{"socket", []uint64{unix.AF_INET6, unix.SOCK_RAW}, eperm},
		{"socket", []uint64{unix.AF_INET, unix.SOCK_PACKET}, eperm},
		{"socket", []uint64{1<<32 | unix.AF_INET, unix.SOCK_RAW}, ActErrno(unix.EAFNOSUPPORT)},
		{"socket", []uint64{unix.AF_PACKET, unix.SOCK_DGRAM}, ActErrno(unix.EAFNOSUPPORT)},
		{"socket", []uint64{1<<32 | unix.AF_PACKET, unix.SOCK_DGRAM}, ActErrno(unix.EAFNOSUPPORT)},
		{"socket", []uint64{unix.AF_ALG, unix.SOCK_SEQPACKET}, ActErrno(unix.EAFNOSUPPORT)},
		{"socket", []uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, ActErrno(unix.EAFNOSUPPORT)},
		{"personality", []uint64{0}, ActAllow},
		{"personality", []uint64{0xffffffff}, ActAllow},
		{"personality", []uint64{8}, ActAllow},
		{"personality", []uint64{0x40000}, eperm},
		{"personality", []uint64{1 << 32}, eperm},
		{"ioctl", []uint64{0, unix.TCGETS}, ActAllow},
		{"ioctl", []uint64{0, unix.FICLONE}, ActAllow},
		{"ioctl", []uint64{0, unix.FICLONERANGE}, ActAllow},
		{"ioctl", []uint64{0, unix.FIDEDUPERANGE}, ActAllow},
		{"ioctl", []uint64{0, unix.FS_IOC_GETFLAGS}, ActAllow},
	}
	for _, n := range []string{
		"keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
		"io_uring_setup", "io_uring_enter", "io_uring_register",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
		"mount", "umount2", "pivot_root", "setns", "kexec_load", "kexec_file_load",
		"init_module", "finit_module", "delete_module", "open_by_handle_at", "name_to_handle_at",
		"acct", "ioperm", "iopl", "reboot", "swapon", "swapoff", "settimeofday", "clock_settime",
		"quotactl", "quotactl_fd", "lookup_dcookie", "kcmp", "process_vm_readv", "process_vm_writev",
		"mbind", "set_mempolicy", "get_mempolicy", "move_pages", "migrate_pages", "ustat", "sysfs", "uselib",
		"syslog", "_sysctl", "sethostname", "setdomainname", "pidfd_getfd", "process_madvise",
		"fanotify_init", "vhangup", "listns", "lsm_set_self_attr", "create_module",
	} {
		cases = append(cases, tc{n, nil, eperm})
	}
	for _, f := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET} {
		cases = append(cases, tc{"clone", []uint64{uint64(unix.SIGCHLD) | f}, eperm}, tc{"unshare", []uint64{f}, eperm})
	}
	cases = append(cases, tc{"unshare", []uint64{unix.CLONE_NEWTIME}, eperm}, tc{"unshare", []uint64{1<<32 | unix.CLONE_NEWUSER}, eperm})
	for _, c := range []uint64{
		0x50009401, // SNAP_CREATE
		0x50009417, // SNAP_CREATE_V2
		0x5000940e, // SUBVOL_CREATE
		0x50009418, // SUBVOL_CREATE_V2
		0x5000940f, // SNAP_DESTROY
		0x5000943f, // SNAP_DESTROY_V2
		0x40089413, // DEFAULT_SUBVOL
		0xc0109428, // QUOTA_CTL
		0x40189429, // QGROUP_ASSIGN
		0x4010942a, // QGROUP_CREATE
		0x8030942b, // QGROUP_LIMIT
		0x4008941b, // SUBVOL_SETFLAGS
		0x1_50009417,
	} {
		cases = append(cases, tc{"ioctl", []uint64{3, c}, eperm})
	}
	for _, c := range cases {
		var args [6]uint64
		copy(args[:], c.args)
		if got := run(t, vm, auditArchX86_64, sys(t, c.name), args[:]...); got != c.want {
			t.Errorf("%s(%#x): got %#x, want %#x", c.name, c.args, uint32(got), uint32(c.want))
		}
	}
	// Other architectures and x32 numbers: killed. Future calls: ENOSYS.
	if got := run(t, vm, 0x40000003 /* AUDIT_ARCH_I386 */, 1); got != ActKillProcess {
		t.Errorf("i386 call: got %#x", uint32(got))
	}
	if got := run(t, vm, auditArchX86_64, x32SyscallBit|sys(t, "read")); got != ActKillProcess {
		t.Errorf("x32 call: got %#x", uint32(got))
	}
	for _, nr := range []uint32{MaxSyscall + 1, 1000, x32SyscallBit - 1} {
		if got := run(t, vm, auditArchX86_64, nr); got != enosys {
			t.Errorf("call %d: got %#x, want ENOSYS", nr, uint32(got))
		}
	}
	// Every number, with random arguments, against the profile itself.
	p := Default()
	rnd := rand.New(rand.NewPCG(1, 2))
	for nr := uint32(0); nr <= MaxSyscall+2; nr++ {
		for range 8 {
			var args [6]uint64
			for i := range args {
				args[i] = rnd.Uint64() >> (rnd.IntN(4) * 16)
			}
			if got, want := run(t, vm, auditArchX86_64, nr, args[:]...), eval(p, nr, args); got != want {
				t.Fatalf("call %d %#x: got %#x, want %#x", nr, args, uint32(got), uint32(want))
			}
		}
	}
}

// TestCompileOps checks every comparison at and around its edges, on
// both 32-bit halves, in profiles large enough to need long jumps.
func TestCompileOps(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	edge := func() uint64 {
		vals := []uint64{0, 1, 0xffffffff, 1 << 32, 1<<32 | 1, ^uint64(0), 0x7fffffff, 0x80000000}
		v := vals[rnd.IntN(len(vals))]
		if rnd.IntN(3) == 0 {
			v = rnd.Uint64() >> (rnd.IntN(4) * 16)
		}
		return v
	}
	names := []string{"read", "write", "openat", "ioctl", "socket", "mmap", "clone", "futex"}
	long := 0
	for iter := 0; iter < 30; iter++ {
		p := &Profile{Default: ActErrno(unix.Errno(1 + iter%30))}
		rules := 1 + rnd.IntN(60)
		if iter%3 == 0 {
			rules = 400 // jumps beyond 255 instructions
		}
		for r := 0; r < rules; r++ {
			rule := Rule{Names: []string{names[rnd.IntN(len(names))]}, Action: ActErrno(unix.Errno(100 + r))}
			if rnd.IntN(5) == 0 {
				rule.Action = ActAllow
			}
			for c := 0; c < rnd.IntN(4); c++ {
				rule.Conds = append(rule.Conds, Cond{Index: uint(rnd.IntN(6)), Op: Op(rnd.IntN(int(OpMaskedNE) + 1)), Value: edge(), ValueTwo: edge()})
			}
			p.Rules = append(p.Rules, rule)
		}
		vm := newVM(t, p)
		if prog, _ := Compile(p); len(prog) > 1000 {
			long++
		}
		for k := 0; k < 400; k++ {
			nr := sys(t, names[rnd.IntN(len(names))])
			var args [6]uint64
			for i := range args {
				args[i] = edge()
				if rnd.IntN(2) == 0 {
					// Near a value some condition compares with.
					args[i] += uint64(rnd.IntN(3)) - 1
				}
			}
			if got, want := run(t, vm, auditArchX86_64, nr, args[:]...), eval(p, nr, args); got != want {
				t.Fatalf("profile %d, call %d %#x: got %#x, want %#x", iter, nr, args, uint32(got), uint32(want))
			}
		}
	}
	if long == 0 {
		t.Fatal("no profile needed long jumps")
	}
}

func TestParseOCI(t *testing.T) {
	prof := `{
		"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,
		"architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
		"syscalls": [
			{"names": ["read", "write", "exit_group", "no_such_call"], "action": "SCMP_ACT_ALLOW"},
			{"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]},
			{"names": ["kill"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
			{"names": ["mount"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
			{"names": ["ptrace"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "4.8"}},
			{"names": ["s390_runtime_instr"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["s390x"]}},
			{"names": ["clone"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_CHOWN"]}}
		]}`
	p, err := ParseOCI([]byte(prof), ParseOptions{Caps: []string{"CAP_CHOWN"}, Kernel: "6.18.0"})
	if err != nil {
		t.Fatal(err)
	}
	vm := newVM(t, p)
	for _, c := range []struct {
		name string
		args []uint64
		want Action
	}{
		{"read", nil, ActAllow}, {"openat", nil, ActErrno(unix.ENOSYS)},
		{"socket", []uint64{1}, ActAllow}, {"socket", []uint64{2}, ActErrno(unix.ENOSYS)},
		{"kill", nil, ActErrno(unix.EACCES)}, {"mount", nil, ActErrno(unix.ENOSYS)},
		{"ptrace", nil, ActAllow}, {"clone", nil, ActErrno(unix.ENOSYS)},
	} {
		var args [6]uint64
		copy(args[:], c.args)
		if got := run(t, vm, auditArchX86_64, sys(t, c.name), args[:]...); got != c.want {
			t.Errorf("%s: got %#x, want %#x", c.name, uint32(got), uint32(c.want))
		}
	}
	for _, bad := range []string{
		`{"defaultAction": "SCMP_ACT_WHATEVER"}`,
		`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_NOTIFY"}]}`,
		`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 6, "op": "SCMP_CMP_EQ"}]}]}`,
		`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "op": "SCMP_CMP_LIKE"}]}]}`,
		`{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"action": "SCMP_ACT_ALLOW"}]}`,
		`{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 70000}`,
		`{"defaultAction": "SCMP_ACT_ALLOW", "bogus": 1}`,
		`not json`,
	} {
		if _, err := ParseOCI([]byte(bad), ParseOptions{}); err == nil {
			t.Errorf("ParseOCI(%s): no error", bad)
		}
	}
}

func TestProgramSize(t *testing.T) {
	prog, err := Compile(Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("default profile: %d instructions", len(prog))
}
