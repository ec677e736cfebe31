package core

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
	"github.com/molt-sh/molt/internal/pid1"
	"golang.org/x/sys/unix"
)

// seccompProbe reports, from inside a sandbox, what its filter and
// capabilities let through: one key=value per line. Errors are errno
// names, "ok" when the call succeeded.
const seccompProbe = `python3 - <<'EOF'
import ctypes, errno, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return 'ok' if r >= 0 else errno.errorcode.get(ctypes.get_errno(), '?')
def status(pid, key):
    for l in open('/proc/%s/status' % pid):
        if l.startswith(key + ':'):
            return l.split(':', 1)[1].strip()
out = {}
out['unshare_user'] = subprocess.run(['unshare', '-U', 'true'], stderr=subprocess.DEVNULL).returncode != 0
out['keyctl'] = call(250, 0, -3, 1)          # KEYCTL_GET_KEYRING_ID, session, create
out['add_key'] = call(248, 0, 0, 0, 0, 0)
out['io_uring_setup'] = call(425, 1, 0)
out['userfaultfd'] = call(323, 0)
out['perf_event_open'] = call(298, 0, 0, -1, -1, 0)
out['bpf'] = call(321, 0, 0, 0)
out['mount'] = call(165, 0, 0, 0, 0, 0)
out['setns'] = call(308, 0, 0)
out['raw_socket'] = call(41, 2, 3, 1)        # AF_INET, SOCK_RAW, ICMP
out['packet_socket'] = call(41, 17, 2, 0)    # AF_PACKET, SOCK_DGRAM
out['clone3'] = call(435, 0, 0)
out['pid1_seccomp'] = status(1, 'Seccomp')
out['pid1_filters'] = status(1, 'Seccomp_filters')
out['pid1_nnp'] = status(1, 'NoNewPrivs')
out['self_seccomp'] = status('self', 'Seccomp')
out['net_raw_bounding'] = bool(int(status('self', 'CapBnd'), 16) & (1 << 13))
unfiltered = []
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            if status(p, 'Seccomp') != '2':
                unfiltered.append(p)
        except OSError:
            pass
out['unfiltered'] = ' '.join(sorted(unfiltered))
try:
    os.readlink('/proc/1/exe')
    out['pid1_exe'] = 'readable'
except OSError as e:
    out['pid1_exe'] = errno.errorcode[e.errno]
out['ptrace_pid1'] = call(101, 16, 1, 0, 0)  # PTRACE_ATTACH
for k in sorted(out):
    print('%s=%s' % (k, out[k]))
EOF`

// confined is what seccompProbe prints in a sandbox under the default
// profile.
var confined = map[string]string{
	"unshare_user": "True", "keyctl": "EPERM", "add_key": "EPERM", "io_uring_setup": "EPERM",
	"userfaultfd": "EPERM", "perf_event_open": "EPERM", "bpf": "EPERM", "mount": "EPERM",
	"setns": "EPERM", "raw_socket": "EPERM", "packet_socket": "EAFNOSUPPORT", "clone3": "ENOSYS",
	"pid1_seccomp": "2", "pid1_filters": "1", "pid1_nnp": "1", "self_seccomp": "2",
	"net_raw_bounding": "False", "unfiltered": "", "pid1_exe": "EACCES", "ptrace_pid1": "EPERM",
}

func probeSeccomp(t *testing.T, m *Manager, sb string) map[string]string {
	t.Helper()
	r := run(t, m, sb, seccompProbe)
	got := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			got[k] = v
		}
	}
	if len(got) == 0 {
		t.Fatalf("probe printed nothing (exit %d): %s", r.ExitCode, r.Stderr)
	}
	return got
}

// checkConfined fails the test unless the probe shows the default
// profile's filter on every process of the sandbox and pid1 not
// dumpable.
func checkConfined(t *testing.T, m *Manager, sb, when string) {
	t.Helper()
	got := probeSeccomp(t, m, sb)
	var bad []string
	for k, want := range confined {
		if got[k] != want {
			bad = append(bad, fmt.Sprintf("%s=%q (want %q)", k, got[k], want))
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%s: %s", when, strings.Join(bad, ", "))
	}
}

// TestSeccompSurvivesCheckpoints: the default filter, no_new_privs and a
// non-dumpable pid1 hold in a new sandbox and after every way molt
// captures and brings back processes: each capture mode (template,
// copy-on-write, frozen copy) with warm, hot and cold rollbacks, forks
// (adopting a standby, restoring), hibernation and resume, and an fs
// rollback. TestSeccompModes covers the paths that start init again.
func TestSeccompSurvivesCheckpoints(t *testing.T) {
	for _, mode := range []string{capture.Template, capture.COW, capture.Copy} {
		t.Run(mode, func(t *testing.T) {
			m := openManager(t)
			requireCRIU(t, m)
			m.cfg.StandbyBudget = 1 << 30
			m.opts.noTemplateCapture = mode != capture.Template
			m.opts.noCOWCapture = mode == capture.Copy
			ctx := context.Background()
			sb := pythonSandbox(t, m, cowHolder)
			checkConfined(t, m, sb.ID, "new sandbox")
			ck := fullCaptured(t, m, sb.ID, mode)
			for _, tier := range []string{v1.TierWarm, v1.TierHot, v1.TierCold} {
				if tier == v1.TierHot {
					waitStandbyOf(t, m, sb.ID, ck.ID)
				}
				res, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: tier})
				if err != nil {
					t.Fatal(err)
				}
				if res.Tier != tier {
					t.Fatalf("rollback tier %s, want %s", res.Tier, tier)
				}
				checkConfined(t, m, sb.ID, tier+" rollback")
			}
			// The restored tree is captured again the same way.
			ck2 := fullCaptured(t, m, sb.ID, mode)
			waitStandbyOf(t, m, sb.ID, ck2.ID)
			fr, err := m.Fork(ctx, ck2.ID, v1.ForkRequest{N: 2})
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range fr.Sandboxes {
				if f.Seccomp != v1.SeccompDefault {
					t.Fatalf("fork %d reports seccomp %q", i, f.Seccomp)
				}
				checkConfined(t, m, f.ID, fmt.Sprintf("fork %d", i))
			}
			if mode != capture.Copy {
				return
			}
			if _, err := m.Hibernate(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Resume(ctx, sb.ID); err != nil {
				t.Fatal(err)
			}
			checkConfined(t, m, sb.ID, "resume")
			fs, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFS})
			if err != nil {
				t.Fatal(err)
			}
			// Its processes come from the full checkpoint before it.
			if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: fs.ID}); err != nil {
				t.Fatal(err)
			}
			checkConfined(t, m, sb.ID, "fs rollback")
		})
	}
}

// TestSeccompModes: a sandbox created without a choice gets the
// default filter, --seccomp unconfined none, a custom profile is what
// its processes run under, and each is kept by an fs rollback (init
// started again) and by forks of an fs checkpoint; a profile that does
// not compile is refused.
func TestSeccompModes(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	def := newSandbox(t, m)
	if def.Seccomp != v1.SeccompDefault {
		t.Fatalf("a sandbox created without a choice reports seccomp %q", def.Seccomp)
	}
	un, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Seccomp: v1.SeccompUnconfined})
	if err != nil {
		t.Fatal(err)
	}
	const profile = `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
		{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13}]}`
	cu, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, SeccompProfile: profile})
	if err != nil {
		t.Fatal(err)
	}
	if cu.Seccomp != v1.SeccompCustom || un.Seccomp != v1.SeccompUnconfined {
		t.Fatalf("reported seccomp %q and %q", un.Seccomp, cu.Seccomp)
	}
	check := func(when string) {
		t.Helper()
		checkConfined(t, m, def.ID, when)
		for _, id := range []string{un.ID, cu.ID} {
			got := probeSeccomp(t, m, id)
			want := "0"
			if id == cu.ID {
				want = "2"
			}
			if got["pid1_seccomp"] != want || got["keyctl"] == "EPERM" {
				t.Fatalf("%s: sandbox %s: pid1 Seccomp %s, keyctl %s", when, id, got["pid1_seccomp"], got["keyctl"])
			}
		}
		if r := run(t, m, cu.ID, "mkdir /tmp/d 2>&1; rmdir /tmp/d 2>/dev/null; true"); !strings.Contains(r.Stdout, "Permission denied") {
			t.Fatalf("%s: mkdir under the custom profile: %q", when, r.Stdout)
		}
	}
	check("created")
	var forks []string
	for _, id := range []string{def.ID, un.ID, cu.ID} {
		ck, err := m.Checkpoint(ctx, id, v1.CheckpointRequest{Kind: v1.KindFS})
		if err != nil {
			t.Fatal(err)
		}
		res, err := m.RollbackWith(ctx, id, v1.RollbackRequest{Checkpoint: ck.ID})
		if err != nil {
			t.Fatal(err)
		}
		if res.Tier != v1.TierRestart {
			t.Fatalf("fs rollback tier %s, want %s", res.Tier, v1.TierRestart)
		}
		fr, err := m.Fork(ctx, ck.ID, v1.ForkRequest{N: 1})
		if err != nil {
			t.Fatal(err)
		}
		forks = append(forks, fr.Sandboxes[0].ID)
	}
	check("fs rollback")
	def.ID, un.ID, cu.ID = forks[0], forks[1], forks[2]
	check("forks")
	for _, bad := range []string{`{"defaultAction": "SCMP_ACT_NOPE"}`, `{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 9, "op": "SCMP_CMP_EQ"}]}]}`} {
		if _, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, SeccompProfile: bad}); err == nil {
			t.Fatalf("profile %s accepted", bad)
		}
	}
}

// initCopies lists the children of the sandbox's pid1 that run pid1's
// program: copies it made of itself.
func initCopies(t *testing.T, m *Manager, sb string) []int {
	t.Helper()
	rec, err := m.lookupSandbox(sb)
	if err != nil {
		t.Fatal(err)
	}
	init := rec.Init.Pid
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", init))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", init, init))
	var copies []int
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if e, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); e == exe {
			copies = append(copies, pid)
		}
	}
	return copies
}

// TestPid1FromInside: a process of the sandbox (root, with pid1's
// capabilities) can neither ptrace pid1 nor read its /proc links, and
// one that queues SIGUSR2 to pid1 with a forged si_pid of 0
// (rt_sigqueueinfo, si_code SI_QUEUE) does not make pid1 copy itself;
// the daemon's kill does.
func TestPid1FromInside(t *testing.T) {
	m := openManager(t)
	sb := newSandbox(t, m)
	r := run(t, m, sb.ID, `python3 - <<'EOF'
import ctypes
class SigInfo(ctypes.Structure):
    _fields_ = [('signo', ctypes.c_int), ('errno', ctypes.c_int), ('code', ctypes.c_int), ('pad', ctypes.c_int),
                ('pid', ctypes.c_int), ('uid', ctypes.c_uint), ('rest', ctypes.c_byte * 104)]
libc = ctypes.CDLL(None, use_errno=True)
si = SigInfo(signo=12, code=-1, pid=0, uid=0)
print(libc.syscall(ctypes.c_long(129), ctypes.c_long(1), ctypes.c_long(12), ctypes.byref(si)), ctypes.get_errno())
EOF`)
	if r.Stdout != "0 0\n" {
		t.Fatalf("rt_sigqueueinfo from inside: %q %s", r.Stdout, r.Stderr)
	}
	time.Sleep(300 * time.Millisecond)
	if c := initCopies(t, m, sb.ID); len(c) != 0 {
		t.Fatalf("a forged SIGUSR2 from inside made pid1 copy itself: %v", c)
	}
	// The check sees copies: the daemon's signal makes one.
	rec, _ := m.lookupSandbox(sb.ID)
	if err := unix.Kill(rec.Init.Pid, pid1.CopySignal); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(initCopies(t, m, sb.ID)) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("SIGUSR2 from the host made no copy")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range initCopies(t, m, sb.ID) {
		_ = unix.Kill(c, unix.SIGKILL)
	}
	// Last: an attach that worked would leave pid1 stopped.
	got := probeSeccomp(t, m, sb.ID)
	if got["ptrace_pid1"] != "EPERM" || got["pid1_exe"] != "EACCES" {
		t.Fatalf("from inside: PTRACE_ATTACH to pid1: %s, readlink /proc/1/exe: %s; want EPERM and EACCES", got["ptrace_pid1"], got["pid1_exe"])
	}
}
