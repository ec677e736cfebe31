package integration

import (
	"bufio"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// probeScript runs one escape attempt inside a sandbox and prints one JSON
// line: whether the attempt was allowed, and the errno that refused it.
//
//go:embed testdata/probe.py
var probeScript string

type probeResult struct {
	Allowed bool   `json:"allowed"`
	Errno   string `json:"errno"`
	N       int    `json:"n"`
	MiB     int    `json:"mib"`
}

// installProbe writes the probe into the sandbox.
func installProbe(t *testing.T, sb string) {
	t.Helper()
	if r := moltIn(t, probeScript, "exec", sb, "--", "bash", "-c", "cat > /usr/local/bin/molt-probe.py"); r.code != 0 {
		t.Fatalf("install probe: %s", r.stderr)
	}
}

// probe runs one attempt and decodes its verdict.
func probe(t *testing.T, sb string, args ...string) (probeResult, result) {
	t.Helper()
	r := molt(t, append([]string{"exec", sb, "--", "python3", "/usr/local/bin/molt-probe.py"}, args...)...)
	var p probeResult
	line := strings.TrimSpace(r.stdout)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		line = line[i+1:]
	}
	if err := json.Unmarshal([]byte(line), &p); err != nil && r.code == 0 {
		t.Fatalf("probe %v: no verdict in %q (stderr %q)", args, r.stdout, r.stderr)
	}
	return p, r
}

// hostCgroupFile is the host path of file in sandbox sb's own cgroup
// (where the daemon writes its limits; its processes live below it),
// found from pid's cgroup in the hierarchy that holds controller (v1),
// or in the unified hierarchy.
func hostCgroupFile(t *testing.T, sb string, pid int, controller, file string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	var path string
	v2 := false
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == controller {
				path = f[2]
			}
		}
		if f[1] == "" && path == "" {
			path, v2 = f[2], true
		}
	}
	if path == "" {
		t.Fatalf("pid %d is in no %s cgroup:\n%s", pid, controller, b)
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer mi.Close()
	s := bufio.NewScanner(mi)
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		switch {
		case v2 && qf[0] == "cgroup2":
		case !v2 && qf[0] == "cgroup" && strings.Contains(","+qf[2]+",", ","+controller+","):
		default:
			continue
		}
		if i := strings.Index(path, "/"+sb); i >= 0 {
			path = path[:i+1+len(sb)]
		}
		return filepath.Join(pf[4], path, file)
	}
	t.Fatalf("no mount of the %s hierarchy", controller)
	return ""
}

func readTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

type limitsInfo struct {
	Pid       int `json:"pid"`
	Resources struct {
		MemoryBytes int64 `json:"memory_bytes"`
		Pids        int64 `json:"pids"`
	} `json:"resources"`
}

// TestEscapeAttempts runs, inside a sandbox, what a hostile agent tries
// without a kernel exploit, and checks that each attempt is refused or
// contained, and that a neighbour sandbox and the daemon are unaffected.
func TestEscapeAttempts(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t, "--pids", "512", "--disk", "256M")
	neighbour := newSandbox(t)
	installProbe(t, sb)
	installProbe(t, neighbour)

	// Syscalls and sockets a sandbox has no use for that open kernel
	// attack surface or reach outside it: each must be refused.
	refused := []struct{ name, why string }{
		{"unshare:0x10000000", "a user namespace gives every capability over the sandbox's own objects"},
		{"unshare:0x00020000", "mount namespace"},
		{"unshare:0x04000000", "UTS namespace"},
		{"unshare:0x08000000", "IPC namespace"},
		{"unshare:0x20000000", "PID namespace"},
		{"unshare:0x40000000", "network namespace"},
		{"unshare:0x02000000", "cgroup namespace"},
		{"unshare:0x00000080", "time namespace"},
		{"setns", "joining namespaces"},
		{"add_key", "keys are per uid, shared with the host and other sandboxes"},
		{"keyctl", "keys are per uid, shared with the host and other sandboxes"},
		{"request_key", "keys are per uid"},
		{"io_uring", "io_uring"},
		{"perf_event_open", "perf_event_open"},
		{"bpf", "bpf"},
		{"userfaultfd", "userfaultfd"},
		{"af_packet", "AF_PACKET sockets"},
		{"raw_socket", "raw IP sockets"},
		{"fsopen", "the new mount API"},
		{"open_tree", "the new mount API"},
		{"subvolume", "btrfs subvolumes in the sandbox root"},
		{"ptrace_pid1", "pid1 holds the sandbox's sessions"},
		{"forge_sigusr2", "a forged signal must not make pid1 copy itself"},
		{"kexec", "kexec"},
		{"open_by_handle_at", "open_by_handle_at reaches files outside the root"},
	}
	for _, a := range refused {
		t.Run(a.name, func(t *testing.T) {
			p, r := probe(t, sb, a.name)
			if r.code != 0 {
				t.Fatalf("probe exited %d: %s", r.code, r.stderr)
			}
			if p.Allowed {
				t.Errorf("%s was allowed (%s)", a.name, a.why)
			}
		})
	}

	t.Run("mount", func(t *testing.T) {
		for _, script := range []string{
			"mount -t tmpfs none /mnt",
			"unshare -Urm mount -t tmpfs none /mnt",
		} {
			if r := molt(t, "exec", sb, "--", "bash", "-c", script); r.code == 0 {
				t.Errorf("%q succeeded", script)
			}
		}
	})

	t.Run("cgroup-limits", func(t *testing.T) {
		info := limitsInfo{}
		mustJSON(t, &info, "inspect", sb)
		pidsMax := hostCgroupFile(t, sb, info.Pid, "pids", "pids.max")
		if got := readTrim(t, pidsMax); got != "512" {
			t.Fatalf("%s = %s before the attempt, want 512", pidsMax, got)
		}
		// Each of the ways in: a cgroup mount from a user namespace (v2,
		// then v1's pids hierarchy), and the host's files through /sys.
		molt(t, "exec", sb, "--", "bash", "-c", `
			unshare -UrmC bash -c 'mkdir -p /tmp/cg && mount -t cgroup2 none /tmp/cg && for f in /tmp/cg/pids.max /tmp/cg/*/pids.max; do echo max > $f; done'
			unshare -UrmC bash -c 'mkdir -p /tmp/cg1 && mount -t cgroup -o pids none /tmp/cg1 && for f in /tmp/cg1/pids.max /tmp/cg1/*/pids.max; do echo max > $f; done'
			for f in $(find /sys/fs/cgroup -name pids.max 2>/dev/null); do echo max > $f; done
			true`)
		if got := readTrim(t, pidsMax); got != "512" {
			t.Errorf("%s = %s after the attempt, want 512", pidsMax, got)
		}
	})

	t.Run("pool-fill", func(t *testing.T) {
		// Writes past the sandbox's quota fail inside it; the pool keeps
		// room for the neighbour's checkpoints (checked below).
		r := molt(t, "exec", sb, "--", "bash", "-c", "dd if=/dev/zero of=/root/fill bs=1M count=1024 conv=fsync 2>&1; stat -c %s /root/fill")
		if r.code == 0 && !strings.Contains(r.stdout, "quota") && !strings.Contains(r.stdout, "No space") {
			t.Errorf("1 GiB written under a 256 MiB quota: %s", r.stdout)
		}
		f := strings.Fields(r.stdout)
		if n, err := strconv.ParseInt(f[len(f)-1], 10, 64); err != nil || n > 272<<20 {
			t.Errorf("the file holds %s bytes under a 256 MiB quota (%v)", f[len(f)-1], err)
		}
		sh(t, sb, "rm -f /root/fill")
	})

	t.Run("inotify", func(t *testing.T) {
		// The attempt holds its instances while the host takes one.
		done := make(chan result, 1)
		go func() {
			done <- molt(t, "exec", sb, "--", "python3", "/usr/local/bin/molt-probe.py", "inotify", "2000", "20")
		}()
		time.Sleep(5 * time.Second)
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			t.Errorf("host root: inotify_init1 while the sandbox holds its instances: %v", err)
		} else {
			unix.Close(fd)
		}
		r := <-done
		t.Logf("sandbox: %s", strings.TrimSpace(r.stdout))
	})

	t.Run("forkbomb", func(t *testing.T) {
		var info limitsInfo
		mustJSON(t, &info, "inspect", neighbour)
		if info.Resources.Pids <= 0 {
			t.Fatalf("a sandbox created without --pids has no process limit (resources %+v)", info.Resources)
		}
		p, r := probe(t, neighbour, "forkbomb", strconv.FormatInt(info.Resources.Pids+100, 10))
		if r.code != 0 {
			t.Fatalf("probe exited %d: %s", r.code, r.stderr)
		}
		if p.Allowed || int64(p.N) >= info.Resources.Pids {
			t.Errorf("forked %d processes under a limit of %d", p.N, info.Resources.Pids)
		}
		sh(t, neighbour, "true")
	})

	t.Run("membomb", func(t *testing.T) {
		var info limitsInfo
		mustJSON(t, &info, "inspect", neighbour)
		if info.Resources.MemoryBytes <= 0 {
			t.Fatalf("a sandbox created without --memory has no memory limit (resources %+v)", info.Resources)
		}
		p, r := probe(t, neighbour, "membomb", strconv.FormatInt(info.Resources.MemoryBytes>>20+256, 10))
		if r.code == 0 && p.Allowed {
			t.Errorf("allocated %d MiB under a limit of %d MiB", p.MiB, info.Resources.MemoryBytes>>20)
		}
		sh(t, neighbour, "true")
	})

	// The neighbour's checkpoint, rollback and fork still work, and so
	// does a daemon restart.
	t.Run("neighbour", func(t *testing.T) {
		neighbourWorks(t, neighbour)
	})
	t.Run("daemon-restart", func(t *testing.T) {
		stopDaemon()
		if err := startDaemon(); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{sb, neighbour} {
			if s := inspect(t, id); s.State != "running" {
				t.Errorf("%s is %s after a daemon restart", id, s.State)
			}
		}
		neighbourWorks(t, neighbour)
	})
}

// neighbourWorks checks a full checkpoint, rollback and fork of sb.
func neighbourWorks(t *testing.T, sb string) {
	t.Helper()
	sh(t, sb, "echo before > /root/state")
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	sh(t, sb, "echo after > /root/state")
	must(t, "rollback", sb, ck)
	if got := strings.TrimSpace(sh(t, sb, "cat /root/state")); got != "before" {
		t.Errorf("after rollback: %q, want before", got)
	}
	var fork struct{ Sandboxes []struct{ ID string } }
	mustJSON(t, &fork, "fork", ck, "-n", "1")
	if len(fork.Sandboxes) != 1 {
		t.Fatalf("fork: %+v", fork)
	}
	id := fork.Sandboxes[0].ID
	defer molt(t, "rm", id)
	if got := strings.TrimSpace(sh(t, id, "cat /root/state")); got != "before" {
		t.Errorf("fork: %q, want before", got)
	}
}
