package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// counterScript counts in memory and writes "PID COUNT" to /tmp/count
// every 100 ms: after a restore it must go on from its value at the
// checkpoint.
const counterScript = `
import os, time
n = 0
while True:
    n += 1
    with open('/tmp/count.tmp', 'w') as f:
        f.write('%d %d' % (os.getpid(), n))
    os.rename('/tmp/count.tmp', '/tmp/count')
    time.sleep(0.1)
`

func readCounter(t *testing.T, sb string) (pid, n int) {
	t.Helper()
	f := strings.Fields(sh(t, sb, "cat /tmp/count"))
	if len(f) != 2 {
		t.Fatalf("counter file: %q", f)
	}
	pid, _ = strconv.Atoi(f[0])
	n, _ = strconv.Atoi(f[1])
	return pid, n
}

// counterAt bounds the counter's value at a checkpoint's instant: read
// just before the checkpoint call and just after it returned (with
// --wait it returns at the commit, a tick or more after the capture).
type counterAt struct{ lo, hi int }

// fullScenario sets up a session and a counter, takes a full checkpoint,
// changes everything, and returns the checkpoint and the counter's
// state at the checkpoint.
func fullScenario(t *testing.T, sb string) (ck string, pid int, count counterAt) {
	t.Helper()
	must(t, "exec", sb, "--session", "main", "--", "export X=42; cd /tmp; mkdir -p /work; echo keep > /work/f")
	must(t, "exec", "--detach", sb, "--", "python3", "-c", counterScript)
	time.Sleep(500 * time.Millisecond)
	var res struct {
		ID           string  `json:"id"`
		Kind         string  `json:"kind"`
		StallMS      float64 `json:"stall_ms"`
		BytesWritten int64   `json:"bytes_written"`
	}
	pid, count.lo = readCounter(t, sb)
	mustJSON(t, &res, "checkpoint", sb, "--kind", "full", "--wait")
	if res.Kind != "full" || res.StallMS <= 0 || res.BytesWritten <= 0 {
		t.Fatalf("full checkpoint: %+v", res)
	}
	var p2 int
	if p2, count.hi = readCounter(t, sb); p2 != pid {
		t.Fatalf("counter pid changed across the checkpoint: %d -> %d", pid, p2)
	}
	// Change everything the checkpoint holds.
	time.Sleep(1500 * time.Millisecond)
	must(t, "exec", sb, "--session", "main", "--", "export X=99; cd /; rm /work/f; echo new > /work/g")
	sh(t, sb, "kill "+strconv.Itoa(pid))
	return res.ID, pid, count
}

// checkRestored checks the state fullScenario checkpointed, in a sandbox
// whose restore began at since. The counter ticks every 100 ms: restored,
// it goes on from its value at the checkpoint (between count.lo and
// count.hi), so it may be at most one tick per 100 ms since the restore
// began (plus slack) ahead of it; a tree that was not restored, or
// restored from the wrong instant, is either another process or further
// off.
func checkRestored(t *testing.T, sb string, pid int, count counterAt, since time.Time) {
	t.Helper()
	p, n := readCounter(t, sb)
	ticks := int(time.Since(since)/(100*time.Millisecond)) + 3
	if p != pid || n < count.lo || n > count.hi+ticks {
		t.Fatalf("counter after restore: pid %d count %d; want pid %d counting on from its value at the checkpoint (%d-%d; at most %d ticks since the restore began)", p, n, pid, count.lo, count.hi, ticks)
	}
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X; pwd"); got != "42\n/tmp\n" {
		t.Fatalf("session after restore: %q; want X=42 and cwd /tmp", got)
	}
	if got := sh(t, sb, "cat /work/f; ls /work"); got != "keep\nf\n" {
		t.Fatalf("files after restore: %q", got)
	}
	// And it runs.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p2, n2 := readCounter(t, sb)
		if p2 == pid && n2 > n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counter does not run after restore: pid %d count %d, was %d", p2, n2, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func requireCRIU(t *testing.T) {
	t.Helper()
	var host struct {
		Features []struct {
			Name      string
			Supported bool
			Reason    string
		}
	}
	mustJSON(t, &host, "host")
	for _, f := range host.Features {
		if f.Name == "full-checkpoint" && !f.Supported {
			t.Fatalf("full checkpoints unsupported here: %s", f.Reason)
		}
	}
}

func TestFullCheckpointRollback(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	ck, pid, count := fullScenario(t, sb)
	var rb struct {
		Tier string `json:"tier"`
	}
	start := time.Now()
	mustJSON(t, &rb, "rollback", sb, ck)
	if rb.Tier != "warm" && rb.Tier != "hot" {
		t.Fatalf("rollback tier %q", rb.Tier)
	}
	checkRestored(t, sb, pid, count, start)
	// Twice: a checkpoint is not consumed by a rollback.
	must(t, "exec", sb, "--session", "main", "--", "export X=7")
	start = time.Now()
	must(t, "rollback", sb, ck)
	checkRestored(t, sb, pid, count, start)
}

func TestFullCheckpointFork(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	ck, pid, count := fullScenario(t, sb)
	var res struct {
		Sandboxes []struct{ ID, Hostname string }
	}
	start := time.Now()
	mustJSON(t, &res, "fork", ck, "-n", "2")
	for _, f := range res.Sandboxes {
		t.Cleanup(func() { molt(t, "rm", f.ID) })
		checkRestored(t, f.ID, pid, count, start)
		if h := strings.TrimSpace(sh(t, f.ID, "{ hostname; cat /etc/hostname; } | sort -u")); h != f.Hostname {
			t.Fatalf("fork hostname %q, want %q (uname and /etc/hostname)", h, f.Hostname)
		}
	}
	ids := map[string]bool{strings.TrimSpace(sh(t, sb, "cat /etc/machine-id")): true}
	for _, f := range res.Sandboxes {
		id := strings.TrimSpace(sh(t, f.ID, "cat /etc/machine-id"))
		if ids[id] {
			t.Fatalf("fork %s shares machine-id %s", f.ID, id)
		}
		ids[id] = true
	}
	// Independent: a change in one fork is not seen by the other.
	a, b := res.Sandboxes[0].ID, res.Sandboxes[1].ID
	must(t, "exec", a, "--session", "main", "--", "export X=1; echo a > /work/f")
	if got := must(t, "exec", b, "--session", "main", "--", "echo $X; cat /work/f"); got != "42\nkeep\n" {
		t.Fatalf("forks share state: %q", got)
	}
}

func TestHibernateResume(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", sb, "--session", "main", "--", "export X=42; cd /tmp; mkdir -p /work; echo keep > /work/f")
	must(t, "exec", "--detach", sb, "--", "python3", "-c", counterScript)
	time.Sleep(500 * time.Millisecond)
	// The CLI shows the hibernation's stages on stderr (not a terminal
	// here: plain lines) and prints its answer as ever.
	if r := molt(t, "hibernate", sb); r.code != 0 || !strings.Contains(r.stderr, "hibernate "+sb+": capturing processes and files") ||
		!strings.Contains(r.stderr, "(new pages only)") || !strings.Contains(r.stderr, "stopping the processes") || !strings.Contains(r.stdout, "hibernated") {
		t.Fatalf("hibernate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	s := inspect(t, sb)
	if s.State != "hibernated" || s.Pid != 0 {
		t.Fatalf("after hibernate: %+v", s)
	}
	_, count := func() (int, int) {
		b, err := os.ReadFile(filepath.Join(env.root, "pool", "sandboxes", s.ID, "root", "tmp", "count"))
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		p, _ := strconv.Atoi(f[0])
		n, _ := strconv.Atoi(f[1])
		return p, n
	}()
	// A daemon crash while hibernated loses nothing.
	killDaemon()
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	if st := inspect(t, sb).State; st != "hibernated" {
		t.Fatalf("after daemon restart: %s", st)
	}
	must(t, "resume", sb)
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X; pwd"); got != "42\n/tmp\n" {
		t.Fatalf("session after resume: %q", got)
	}
	time.Sleep(400 * time.Millisecond)
	_, n := readCounter(t, sb)
	if n <= count || n > count+10 {
		t.Fatalf("counter after resume: %d; want going on from %d", n, count)
	}
}

func TestFullCheckpointSurvivesDaemonKill(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	ck, pid, count := fullScenario(t, sb)
	killDaemon()
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	must(t, "checkpoint", "verify", ck)
	start := time.Now()
	must(t, "rollback", sb, ck)
	checkRestored(t, sb, pid, count, start)
}

func TestCorruptCheckpointRefused(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", sb, "--session", "main", "--", "export X=42")
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	must(t, "exec", sb, "--session", "main", "--", "export X=99")
	pages, _ := filepath.Glob(filepath.Join(env.root, "pool", "checkpoints", ck, "images", "pages-*.img"))
	if len(pages) == 0 {
		t.Fatal("no page images in the checkpoint")
	}
	f, err := os.OpenFile(pages[0], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("corrupt!"), 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, args := range [][]string{{"rollback", sb, ck}, {"checkpoint", "verify", ck}, {"fork", ck}} {
		r := molt(t, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "corrupted") || !strings.Contains(r.stderr, filepath.Base(pages[0])) {
			t.Fatalf("molt %v with a corrupted image: exit %d %q", args, r.code, r.stderr)
		}
	}
	// The sandbox runs on, untouched.
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X"); got != "99\n" {
		t.Fatalf("sandbox after refused rollback: %q", got)
	}
	// Truncation is named as such.
	if err := os.Truncate(pages[0], 4096); err != nil {
		t.Fatal(err)
	}
	if r := molt(t, "checkpoint", "verify", ck); r.code == 0 || !strings.Contains(r.stderr, "truncated") {
		t.Fatalf("truncated image: exit %d %q", r.code, r.stderr)
	}
}

// A rollback to an fs checkpoint whose ancestor is full brings back the
// fs checkpoint's files with the ancestor's processes.
func TestFSRollbackTakesFullAncestorProcesses(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", sb, "--session", "main", "--", "export X=42; mkdir -p /work; echo one > /work/f")
	must(t, "checkpoint", sb, "--kind", "full")
	sh(t, sb, "echo two > /work/f")
	fsck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "fs"))
	must(t, "exec", sb, "--session", "main", "--", "export X=99; echo three > /work/f")
	var rb struct {
		Tier               string `json:"tier"`
		ProcessesRestarted bool   `json:"processes_restarted"`
		Note               string `json:"note"`
	}
	mustJSON(t, &rb, "rollback", sb, fsck)
	if rb.Tier != "warm" || rb.ProcessesRestarted || !strings.Contains(rb.Note, "full ancestor") {
		t.Fatalf("rollback to an fs checkpoint with a full ancestor: %+v", rb)
	}
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X; cat /work/f"); got != "42\ntwo\n" {
		t.Fatalf("after rollback: %q; want the ancestor's X=42 with the fs checkpoint's file", got)
	}
}

// waitStandby waits until the sandbox has a standby for checkpoint ck.
func waitStandby(t *testing.T, sb, ck string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var s struct {
			Standby string `json:"standby"`
		}
		mustJSON(t, &s, "inspect", sb)
		if s.Standby == ck {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby for %s within 20 s (standby: %q)", ck, s.Standby)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Rollback to the same checkpoint 20 times, each from the hot tier once
// the standby pool has refilled: the session's variables and the
// in-memory counter come back every time.
func TestHotRollbackRepeated(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	ck, pid, count := fullScenario(t, sb)
	for i := 0; i < 20; i++ {
		waitStandby(t, sb, ck)
		var rb struct {
			Tier       string  `json:"tier"`
			DurationMS float64 `json:"duration_ms"`
		}
		start := time.Now()
		mustJSON(t, &rb, "rollback", sb, ck)
		if rb.Tier != "hot" {
			t.Fatalf("rollback %d: tier %q, want hot", i, rb.Tier)
		}
		checkRestored(t, sb, pid, count, start)
		// Change things again before the next rollback.
		must(t, "exec", sb, "--session", "main", "--", "export X=99; cd /; rm -f /work/f")
	}
}

// A daemon killed in the middle of a full checkpoint lists, after its
// restart, only checkpoints that verify, and the sandbox runs (is not
// left frozen).
func TestDaemonKilledDuringCheckpoint(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	startHeap(t, sb, 64)
	for _, delay := range []time.Duration{60 * time.Millisecond, 150 * time.Millisecond, 300 * time.Millisecond} {
		done := make(chan result, 1)
		go func() { done <- molt(t, "checkpoint", sb, "--kind", "full") }()
		time.Sleep(delay)
		killDaemon()
		<-done
		if err := startDaemon(); err != nil {
			t.Fatal(err)
		}
		if got := sh(t, sb, "echo alive"); got != "alive\n" {
			t.Fatalf("sandbox after a daemon killed %v into a checkpoint: %q", delay, got)
		}
		var cks []struct {
			ID           string
			Failed       bool
			FailedReason string `json:"failed_reason"`
		}
		mustJSON(t, &cks, "checkpoints", sb)
		failed := 0
		for _, c := range cks {
			if c.Failed {
				// Reported pending, then lost with the daemon: listed as
				// failed, with the reason, and refused as a target.
				failed++
				if c.FailedReason == "" {
					t.Fatalf("checkpoint %s listed failed without a reason", c.ID)
				}
				if r := molt(t, "rollback", sb, c.ID); r.code == 0 {
					t.Fatalf("rollback to failed checkpoint %s succeeded", c.ID)
				}
				must(t, "checkpoint", "rm", c.ID)
				continue
			}
			must(t, "checkpoint", "verify", c.ID)
		}
		sum := sha256.Sum256([]byte(env.root))
		if left, _ := filepath.Glob("/dev/shm/molt-dump-" + hex.EncodeToString(sum[:4]) + "-*"); len(left) > 0 {
			t.Fatalf("dump staging left in memory after the restart: %v", left)
		}
		t.Logf("killed %v in: %d checkpoint(s) listed, %d of them failed, the others verified", delay, len(cks), failed)
	}
}

// TestDaemonKilledDuringRollbacks: a daemon killed (SIGKILL) at some
// point of a run of rollbacks to a full checkpoint (hot once a standby
// is ready, warm before) leaves, after a restart, a running sandbox in
// one of the two states it moved between, which rolls back again. The
// kill lands wherever the run happens to be; internal/core's
// TestCrashRecovery kills at each step of a rollback's switch.
func TestDaemonKilledDuringRollbacks(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", sb, "--session", "main", "--", "export X=a")
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	for _, delay := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 60 * time.Millisecond, 150 * time.Millisecond} {
		must(t, "exec", sb, "--session", "main", "--", "export X=b")
		done := make(chan struct{})
		go func() {
			defer close(done)
			for molt(t, "rollback", sb, ck).code == 0 && molt(t, "exec", sb, "--session", "main", "--", "export X=b").code == 0 {
			}
		}()
		time.Sleep(delay)
		killDaemon()
		<-done
		if err := startDaemon(); err != nil {
			t.Fatal(err)
		}
		if s := inspect(t, sb); s.State != "running" {
			t.Fatalf("killed %v into the rollbacks: sandbox %s (%s)", delay, s.State, s.Reason)
		}
		got := must(t, "exec", sb, "--session", "main", "--", "echo $X")
		if got != "a\n" && got != "b\n" {
			t.Fatalf("killed %v into the rollbacks: X=%q, want a or b", delay, got)
		}
		must(t, "rollback", sb, ck)
		if got := must(t, "exec", sb, "--session", "main", "--", "echo $X"); got != "a\n" {
			t.Fatalf("rollback after the restart: X=%q, want a", got)
		}
		t.Logf("killed %v into the rollbacks: X=%s after the restart", delay, strings.TrimSpace(got))
	}
}

// A full checkpoint returns as soon as its instant is captured, pending;
// it is listed as pending until committed, and a rollback to it waits
// for the commit.
func TestPendingCheckpoint(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	startHeap(t, sb, 64)
	must(t, "exec", sb, "--session", "main", "--", "export X=42")
	var ck struct {
		ID      string `json:"id"`
		Pending bool   `json:"pending"`
	}
	mustJSON(t, &ck, "checkpoint", sb, "--kind", "full")
	if !ck.Pending {
		t.Log("the checkpoint committed before the call returned (fast machine)")
	}
	must(t, "exec", sb, "--session", "main", "--", "export X=99")
	must(t, "rollback", sb, ck.ID)
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X"); got != "42\n" {
		t.Fatalf("after rollback to a pending checkpoint: %q", got)
	}
	var cks []struct {
		ID      string `json:"id"`
		Pending bool   `json:"pending"`
	}
	mustJSON(t, &cks, "checkpoints", sb)
	if len(cks) != 1 || cks[0].ID != ck.ID || cks[0].Pending {
		t.Fatalf("after the rollback the checkpoint must be committed: %+v", cks)
	}
}

// startHeap starts a process in the sandbox holding mib MiB of random
// data and waits until it is filled.
func startHeap(t *testing.T, sb string, mib int) {
	t.Helper()
	must(t, "exec", "--detach", sb, "--", "python3", "-c",
		fmt.Sprintf("import os, time\nb = bytearray(os.urandom(%d << 20))\nopen('/tmp/ready', 'w').close()\nwhile True: time.sleep(1)", mib))
	for sh(t, sb, "test -e /tmp/ready && echo y || true") != "y\n" {
		time.Sleep(50 * time.Millisecond)
	}
}

// TestForkReseed: forks of one checkpoint draw the same $RANDOM sequence
// from their sessions unless forked with --reseed.
func TestForkReseed(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", sb, "--session", "main", "--", "RANDOM=12345")
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	draws := func(reseed bool) []string {
		args := []string{"fork", ck, "-n", "2"}
		if reseed {
			args = append(args, "--reseed")
		}
		var res struct {
			Sandboxes []struct{ ID string }
			Reseeded  int
		}
		mustJSON(t, &res, args...)
		if reseed && res.Reseeded != 2 {
			t.Fatalf("reseeded %d sessions, want 2", res.Reseeded)
		}
		var out []string
		for _, f := range res.Sandboxes {
			t.Cleanup(func() { molt(t, "rm", f.ID) })
			out = append(out, must(t, "exec", f.ID, "--session", "main", "--", "echo $RANDOM $RANDOM $RANDOM"))
		}
		return out
	}
	if d := draws(false); d[0] != d[1] {
		t.Fatalf("forks without --reseed drew %q and %q; the same seed should give the same numbers", d[0], d[1])
	}
	if d := draws(true); d[0] == d[1] {
		t.Fatalf("forks with --reseed drew the same numbers: %q", d[0])
	}
}

// TestForkFromStandby: a fork of a checkpoint with a ready standby adopts
// it (no restore), gets its own identity, runs the checkpoint's processes
// and session, and the source sandbox gets a standby again.
func TestForkFromStandby(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	ck, pid, count := fullScenario(t, sb)
	waitStandby(t, sb, ck)
	before := counter(t, "molt_forks_from_standby_total")
	var res struct {
		Sandboxes []struct{ ID, Hostname string }
	}
	start := time.Now()
	mustJSON(t, &res, "fork", ck, "-n", "2")
	if len(res.Sandboxes) != 2 {
		t.Fatalf("forks: %+v", res)
	}
	for _, f := range res.Sandboxes {
		t.Cleanup(func() { molt(t, "rm", f.ID) })
	}
	for _, f := range res.Sandboxes {
		checkRestored(t, f.ID, pid, count, start)
	}
	ids := map[string]bool{}
	for _, f := range res.Sandboxes {
		if h := strings.TrimSpace(sh(t, f.ID, "{ hostname; cat /etc/hostname; } | sort -u")); h != f.Hostname {
			t.Fatalf("fork hostname %q, want %q", h, f.Hostname)
		}
		id := strings.TrimSpace(sh(t, f.ID, "cat /etc/machine-id"))
		if ids[id] {
			t.Fatalf("forks share machine-id %s", id)
		}
		ids[id] = true
	}
	if n := counter(t, "molt_forks_from_standby_total"); n != before+1 {
		t.Fatalf("forks that adopted a standby: %v, want %v", n, before+1)
	}
	// The source still rolls back (hot again once its standby is back).
	waitStandby(t, sb, ck)
	start = time.Now()
	must(t, "rollback", sb, ck)
	checkRestored(t, sb, pid, count, start)
}

// metricsText fetches the daemon's Prometheus metrics.
func metricsText(t *testing.T) string {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", env.socket)
	}}}
	resp, err := hc.Get("http://molt/v1/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// counter returns the value of an unlabelled metric.
func counter(t *testing.T, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(metricsText(t), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, l)
			}
			return f
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
