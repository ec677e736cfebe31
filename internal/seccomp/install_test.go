package seccomp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childEnv makes the test binary a child that installs the default
// filter and reports on calls (see childMain).
const childEnv = "MOLT_SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childMain(mode))
	}
	os.Exit(m.Run())
}

type probe struct {
	name string
	nr   uintptr
	args [6]uintptr
}

var probes = []probe{
	{"getpid", unix.SYS_GETPID, [6]uintptr{}},
	{"keyctl", unix.SYS_KEYCTL, [6]uintptr{0, ^uintptr(2), 1}},
	{"add_key", unix.SYS_ADD_KEY, [6]uintptr{}},
	{"unshare_user", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWUSER}},
	{"unshare_net", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWNET}},
	{"unshare_fs", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_FS}},
	{"clone3", unix.SYS_CLONE3, [6]uintptr{}},
	{"setns", unix.SYS_SETNS, [6]uintptr{0, 0}},
	{"mount", unix.SYS_MOUNT, [6]uintptr{}},
	{"fsopen", unix.SYS_FSOPEN, [6]uintptr{}},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP, [6]uintptr{1, 0}},
	{"userfaultfd", unix.SYS_USERFAULTFD, [6]uintptr{}},
	{"bpf", unix.SYS_BPF, [6]uintptr{}},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, [6]uintptr{}},
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, [6]uintptr{}},
	{"kexec_load", unix.SYS_KEXEC_LOAD, [6]uintptr{}},
	{"socket_tcp", unix.SYS_SOCKET, [6]uintptr{unix.AF_INET, unix.SOCK_STREAM | unix.SOCK_CLOEXEC}},
	{"socket_raw", unix.SYS_SOCKET, [6]uintptr{unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP}},
	{"socket_netlink", unix.SYS_SOCKET, [6]uintptr{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE}},
	{"socket_packet", unix.SYS_SOCKET, [6]uintptr{unix.AF_PACKET, unix.SOCK_DGRAM}},
	{"personality_query", unix.SYS_PERSONALITY, [6]uintptr{0xffffffff}},
	{"personality_aslr", unix.SYS_PERSONALITY, [6]uintptr{0x40000}},
	{"btrfs_snap", unix.SYS_IOCTL, [6]uintptr{0, 0x50009417}},
	{"future", 1000, [6]uintptr{}},
}

// want is each probe's outcome under the default profile.
var want = map[string]string{
	"getpid": "ok", "keyctl": "EPERM", "add_key": "EPERM", "unshare_user": "EPERM",
	"unshare_net": "EPERM", "unshare_fs": "ok", "clone3": "ENOSYS", "setns": "EPERM",
	"mount": "EPERM", "fsopen": "EPERM", "io_uring_setup": "EPERM", "userfaultfd": "EPERM",
	"bpf": "EPERM", "perf_event_open": "EPERM", "open_by_handle_at": "EPERM", "kexec_load": "EPERM",
	"socket_tcp": "ok", "socket_raw": "EPERM", "socket_packet": "EAFNOSUPPORT", "socket_netlink": "ok",
	"personality_query": "ok", "personality_aslr": "EPERM", "btrfs_snap": "EPERM", "future": "ENOSYS",
	"Seccomp": "2", "NoNewPrivs": "1",
}

func childMain(mode string) int {
	runtime.LockOSThread()
	prog, err := Compile(Default())
	if mode == "bench-none" {
		mode, err = "bench", nil
		prog = nil
	}
	if err == nil && prog != nil {
		err = Install(prog)
	}
	if err != nil {
		fmt.Println("install:", err)
		return 1
	}
	if mode == "bench" {
		// Calls per run of a cheap allowed call (getppid: past the middle
		// of the search) and of one with argument checks (personality).
		n, _ := strconv.Atoi(os.Getenv(childEnv + "_N"))
		for _, nr := range []uintptr{unix.SYS_GETPPID, unix.SYS_PERSONALITY} {
			start := time.Now()
			for range n {
				unix.RawSyscall(nr, 0xffffffff, 0, 0)
			}
			fmt.Printf("%d\n", time.Since(start).Nanoseconds())
		}
		return 0
	}
	if mode == "x32" {
		// getpid through the x32 ABI: the filter kills the process.
		unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
		return 0
	}
	for _, p := range probes {
		_, _, e := unix.RawSyscall6(p.nr, p.args[0], p.args[1], p.args[2], p.args[3], p.args[4], p.args[5])
		res := "ok"
		if e != 0 {
			res = unix.ErrnoName(e)
		}
		fmt.Printf("%s=%s\n", p.name, res)
	}
	b, _ := os.ReadFile("/proc/thread-self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "Seccomp" || k == "NoNewPrivs") {
			fmt.Printf("%s=%s\n", k, strings.TrimSpace(v))
		}
	}
	return 0
}

// TestInstall runs a child under the default filter: the calls the
// profile denies fail with its errors in a real kernel, the others work,
// and an x32 call kills the child. It needs no privilege (no_new_privs).
func TestInstall(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=probe")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			got[k] = v
		}
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %q, want %q", k, got[k], w)
		}
	}

	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=x32")
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("x32 child: %v\n%s", err, out)
	}
	if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != unix.SIGSYS {
		t.Fatalf("x32 child ended with %v, want killed by SIGSYS\n%s", ws, out)
	}
}

// BenchmarkFilter measures what the default filter adds to a system
// call: getppid (no argument checks) and personality (argument checks),
// each in a child without and with the filter.
func BenchmarkFilter(b *testing.B) {
	measure := func(mode string) (float64, float64) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+mode, childEnv+"_N="+strconv.Itoa(b.N))
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.Fatalf("child: %v\n%s", err, out)
		}
		f := strings.Fields(string(out))
		if len(f) != 2 {
			b.Fatalf("child printed %q", out)
		}
		x, _ := strconv.ParseFloat(f[0], 64)
		y, _ := strconv.ParseFloat(f[1], 64)
		return x / float64(b.N), y / float64(b.N)
	}
	g0, p0 := measure("bench-none")
	g1, p1 := measure("bench")
	b.ReportMetric(g0, "ns/getppid-none")
	b.ReportMetric(g1, "ns/getppid-filtered")
	b.ReportMetric(p0, "ns/personality-none")
	b.ReportMetric(p1, "ns/personality-filtered")
}
