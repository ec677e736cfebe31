package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/objstore/s3test"
)

// host is a daemon of its own, standing for another host: its own root
// and pool, its own cgroup parent, on an object store.
type host struct {
	root, socket string
}

// startHost starts a daemon on a fresh root with args, builds the test
// image there, and stops it (sandboxes removed, pool unmounted) when t
// ends.
func startHost(t *testing.T, name, dir string, env []string, args ...string) host {
	t.Helper()
	return startHostIn(t, name, dir, "", env, args...)
}

// startHostIn is startHost with the daemon in the network namespace
// netns (a path; "" for this one).
func startHostIn(t *testing.T, name, dir, netns string, env []string, args ...string) host {
	t.Helper()
	h := host{root: filepath.Join(dir, "root"), socket: filepath.Join(dir, "molt.sock")}
	logFile := filepath.Join(dir, "daemon.log")
	logf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{bin(), "daemon", "--root", h.root, "--socket", h.socket, "--pool-size", "8G", "--cgroup-parent", "molt-it-" + name}, args...)
	if netns != "" {
		argv = append([]string{"nsenter", "--net=" + netns, "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	logf.Close()
	t.Cleanup(func() {
		var out bytes.Buffer
		c := exec.Command(bin(), "--socket", h.socket, "--json", "ls")
		c.Stdout = &out
		if c.Run() == nil {
			for _, id := range jsonIDs(out.Bytes()) {
				if b, err := exec.Command(bin(), "--socket", h.socket, "rm", id).CombinedOutput(); err != nil {
					t.Errorf("rm %s on %s: %v: %s", id, name, err, b)
				}
			}
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = syscall.Unmount(filepath.Join(h.root, "pool"), 0)
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("daemon %s's log ends with:\n%s", name, tail(b, 3000))
		}
	})
	for deadline := time.Now().Add(60 * time.Second); exec.Command(bin(), "--socket", h.socket, "host").Run() != nil; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logFile)
			t.Fatalf("daemon %s did not come up:\n%s", name, tail(b, 3000))
		}
	}
	if r := h.molt(t, "image", "build", image); r.code != 0 {
		t.Fatalf("image build on %s: %s", name, r.stderr)
	}
	return h
}

func bin() string { return env.bin }

// jsonIDs picks the IDs of a JSON list of sandboxes.
func jsonIDs(b []byte) []string {
	var sbs []struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(b, &sbs)
	var ids []string
	for _, s := range sbs {
		ids = append(ids, s.ID)
	}
	return ids
}

func (h host) molt(t *testing.T, args ...string) result {
	t.Helper()
	return moltAt(t, h.socket, "", args...)
}

func (h host) must(t *testing.T, args ...string) string {
	t.Helper()
	r := h.molt(t, args...)
	if r.code != 0 {
		t.Fatalf("molt %v: exit %d: %s", args, r.code, r.stderr)
	}
	return r.stdout
}

// TestHibernateToStoreResumeElsewhere, through the CLI of two daemons on
// one S3 bucket of a real S3 server (credentials from the environment,
// as AWS tools take them): a sandbox with a session, a file and a
// running counter is hibernated with --offload on the first, which
// frees its local copy, and resumed on the second, which trusts the
// first's key; the first may not resume it any more.
func TestHibernateToStoreResumeElsewhere(t *testing.T) {
	requireCRIU(t)
	srv := s3test.Start(t)
	creds := []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey}
	store := []string{"--store", "s3://" + srv.Bucket + "/it-" + strings.ToLower(t.Name()), "--store-endpoint", srv.Endpoint}
	// The hosts of a fleet trust each other's keys: made first.
	dirA, dirB := t.TempDir(), t.TempDir()
	for _, d := range []string{dirA, dirB} {
		if _, err := ckstore.LoadKeyring(filepath.Join(d, "root", "keys"), nil); err != nil {
			t.Fatal(err)
		}
	}
	pub := func(d string) string { return filepath.Join(d, "root", "keys", "host.pub") }
	a := startHost(t, "a", dirA, creds, append(store, "--trust-key", pub(dirB))...)
	b := startHost(t, "b", dirB, creds, append(store, "--trust-key", pub(dirA))...)

	sb := strings.TrimSpace(a.must(t, "create", image))
	a.must(t, "exec", sb, "--session", "s", "--", "export X=42; echo stored > /root/f")
	a.must(t, "exec", sb, "-d", "--", "sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.05; done")
	time.Sleep(300 * time.Millisecond)
	// A checkpoint before the last change: the offload takes it along
	// (a rollback to it on the second host below).
	early := strings.TrimSpace(a.must(t, "checkpoint", sb, "--kind", "full", "--wait", "--label", "early"))
	a.must(t, "exec", sb, "--session", "s", "--", "echo later > /root/f")
	if out := a.must(t, "hibernate", sb, "--offload"); !strings.Contains(out, "hibernated offloaded") {
		t.Fatalf("hibernate --offload: %q", out)
	}
	ents, _ := os.ReadDir(filepath.Join(a.root, "pool", "checkpoints"))
	for _, e := range ents {
		if e.Name() == early {
			continue // in the store too, kept here as the cache allows
		}
		if _, err := os.Stat(filepath.Join(a.root, "pool", "checkpoints", e.Name(), "fs")); err == nil {
			t.Fatalf("checkpoint %s still has its files on the first host after the offload", e.Name())
		}
	}
	if r := b.molt(t, "resume", sb); r.code != 0 {
		t.Fatalf("resume on the second host: %s", r.stderr)
	}
	out := b.must(t, "exec", sb, "--session", "s", "--", "echo $X; cat /root/f; a=$(cat /tmp/n); sleep 0.3; b=$(cat /tmp/n); [ $b -gt $a ] && echo counting")
	if out != "42\nlater\ncounting\n" {
		t.Fatalf("the sandbox on the second host: %q", out)
	}
	if r := a.molt(t, "resume", sb); r.code == 0 || !strings.Contains(r.stderr, "resumed by host") {
		t.Fatalf("resume on the first host after the second: exit %d, %s", r.code, r.stderr)
	}
	b.must(t, "rollback", sb, early)
	if out := b.must(t, "exec", sb, "--session", "s", "--", "echo $X; cat /root/f"); out != "42\nstored\n" {
		t.Fatalf("after a rollback on the second host to a checkpoint the first took: %q", out)
	}
	// Back to the store from the second host, and resumed on the first,
	// which still has its own, older record of the sandbox: the state
	// resumed is the second host's.
	b.must(t, "exec", sb, "--session", "s", "--", "echo moved on > /root/f")
	b.must(t, "hibernate", sb, "--offload")
	a.must(t, "resume", sb)
	if out := a.must(t, "exec", sb, "--session", "s", "--", "echo $X; cat /root/f"); out != "42\nmoved on\n" {
		t.Fatalf("the first host resumed %q, not the state the second offloaded", out)
	}
	// The store's GC through the CLI: a dry run reads the recipes and
	// the document, and changes nothing; a grace period too short for an
	// upload is refused.
	var rep v1.StoreGCReport
	if err := json.Unmarshal([]byte(a.must(t, "--json", "store", "gc", "--dry-run")), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.DryRun || rep.Recipes < 2 || rep.Sandboxes != 1 || rep.Packs == 0 || rep.DeletedPacks != 0 {
		t.Fatalf("store gc --dry-run: %+v", rep)
	}
	if r := a.molt(t, "store", "gc", "--grace", "1s"); r.code == 0 || !strings.Contains(r.stderr, "grace") {
		t.Fatalf("store gc --grace 1s: exit %d, %s", r.code, r.stderr)
	}
}
