package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

type sandboxInfo struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Pid      int    `json:"pid"`
	Sessions []struct {
		Name string `json:"name"`
	} `json:"sessions"`
}

func inspect(t *testing.T, sb string) sandboxInfo {
	t.Helper()
	var s sandboxInfo
	mustJSON(t, &s, "inspect", sb)
	return s
}

func TestDaemonRestart(t *testing.T) {
	sb := newSandbox(t, "--name", "survivor")
	stopped := newSandbox(t)
	must(t, "exec", sb, "--session", "main", "--", "export X=42; cd /tmp")
	sh(t, sb, "mkdir /work; echo v1 > /work/f")
	ck := strings.TrimSpace(must(t, "checkpoint", sb))
	must(t, "stop", stopped)

	killDaemon()
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	// Records survived; the running sandbox is still running, with its
	// session intact; the stopped one is reported stopped.
	s := inspect(t, "survivor")
	if s.State != "running" || len(s.Sessions) != 1 || s.Sessions[0].Name != "main" {
		t.Fatalf("after restart: %+v", s)
	}
	if r := must(t, "exec", sb, "--session", "main", "--", "echo $X; pwd"); r != "42\n/tmp\n" {
		t.Fatalf("session after daemon restart: %q", r)
	}
	if st := inspect(t, stopped).State; st != "stopped" {
		t.Fatalf("stopped sandbox reported %q", st)
	}
	// The checkpoint is still listed and usable.
	sh(t, sb, "echo v2 > /work/f")
	must(t, "rollback", sb, ck)
	if got := sh(t, sb, "cat /work/f"); got != "v1\n" {
		t.Fatalf("rollback after restart: %q", got)
	}
	// An init killed behind molt's back is reported lost, with a reason,
	// and the sandbox can be started again.
	s = inspect(t, sb)
	if err := syscall.Kill(s.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s = inspect(t, sb); s.State != "lost" && time.Now().Before(deadline); s = inspect(t, sb) {
		time.Sleep(20 * time.Millisecond)
	}
	if s.State != "lost" || !strings.Contains(s.Reason, "gone") {
		t.Fatalf("killed init: %+v", s)
	}
	if r := molt(t, "exec", sb, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "lost") {
		t.Fatalf("exec in a lost sandbox: exit %d %q", r.code, r.stderr)
	}
	must(t, "start", sb)
	if got := sh(t, sb, "cat /work/f"); got != "v1\n" {
		t.Fatalf("files after start: %q", got)
	}
	must(t, "start", stopped)
	if st := inspect(t, stopped).State; st != "running" {
		t.Fatalf("started sandbox is %q", st)
	}
}

// TestNoLeaksAfterRemove removes sandboxes with sessions, detached
// processes, checkpoints and forks, and checks that nothing of them is
// left: processes, cgroups, mounts, subvolumes, records.
func TestNoLeaksAfterRemove(t *testing.T) {
	sb := strings.TrimSpace(must(t, "create", image))
	must(t, "exec", sb, "--session", "s", "--", "sleep 1000 &")
	must(t, "exec", "--detach", sb, "--", "sleep", "1000")
	ck := strings.TrimSpace(must(t, "checkpoint", sb))
	var fork struct{ Sandboxes []struct{ ID string } }
	mustJSON(t, &fork, "fork", ck, "-n", "2")
	ids := []string{sb, fork.Sandboxes[0].ID, fork.Sandboxes[1].ID}
	var pids []int
	for _, id := range ids {
		s := inspect(t, id)
		pids = append(pids, s.Pid)
	}
	must(t, append([]string{"rm"}, ids...)...)

	for _, id := range ids {
		if r := molt(t, "inspect", id); r.code == 0 {
			t.Errorf("%s still listed", id)
		}
		for _, h := range []string{"", "freezer", "memory", "pids", "unified"} { // "": a v2 host
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h, "molt", id)); err == nil {
				t.Errorf("%s: cgroup %s left behind", id, h)
			}
		}
		if _, err := os.Stat(filepath.Join(env.root, "pool", "sandboxes", id)); err == nil {
			t.Errorf("%s: sandbox directory left behind", id)
		}
	}
	if _, err := os.Stat(filepath.Join(env.root, "pool", "checkpoints", ck)); err == nil {
		t.Errorf("checkpoint %s left behind", ck)
	}
	for _, p := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(p)); err == nil {
			t.Errorf("init %d still running", p)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, id := range ids {
		if strings.Contains(string(mounts), id) {
			t.Errorf("mount of %s left behind", id)
		}
	}
}

// hasSysResource reports whether this process holds CAP_SYS_RESOURCE.
func hasSysResource() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<24) != 0
		}
	}
	return false
}

// TestHostPool: the daemon's fresh loop pool reports its node size (the
// default, 8 KiB) through molt host, and the pool feature names it.
func TestHostPool(t *testing.T) {
	var host struct {
		Pool struct {
			Loop     bool `json:"loop"`
			NodeSize int  `json:"node_size"`
		} `json:"pool"`
		Features []struct {
			Name   string `json:"name"`
			Detail string `json:"detail"`
		} `json:"features"`
	}
	mustJSON(t, &host, "host")
	if !host.Pool.Loop {
		t.Skip("the state root is on btrfs: its node size is the host's")
	}
	if host.Pool.NodeSize != 8192 {
		t.Fatalf("pool node size %d, want 8192", host.Pool.NodeSize)
	}
	for _, f := range host.Features {
		if f.Name == "btrfs-pool" && !strings.Contains(f.Detail, "8 KiB nodes") {
			t.Fatalf("btrfs-pool feature: %q does not name the node size", f.Detail)
		}
	}
	if out := must(t, "host"); !strings.Contains(out, "8.0 KiB nodes") {
		t.Fatalf("molt host does not show the node size:\n%s", out)
	}
}

// A sandbox whose init was killed behind molt's back (lost) and that has
// only fs checkpoints: a rollback restores the files and starts its
// processes again, whatever its record still says.
func TestRollbackLostToFS(t *testing.T) {
	sb := newSandbox(t)
	sh(t, sb, "echo a > /root/f")
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "fs"))
	sh(t, sb, "echo b > /root/f")
	if err := syscall.Kill(inspect(t, sb).Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sandbox lost", 10*time.Second, func() bool { return inspect(t, sb).State == "lost" })
	var res struct {
		Tier               string `json:"tier"`
		ProcessesRestarted bool   `json:"processes_restarted"`
	}
	mustJSON(t, &res, "rollback", sb, ck)
	if res.Tier != "restart" || !res.ProcessesRestarted {
		t.Fatalf("rollback of a lost sandbox to an fs checkpoint: %+v, want its processes restarted", res)
	}
	if got := sh(t, sb, "cat /root/f"); got != "a\n" {
		t.Fatalf("/root/f = %q after the rollback", got)
	}
}
