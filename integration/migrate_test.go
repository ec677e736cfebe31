package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/objstore/s3test"
)

// host is a daemon of a root, socket, cgroup parent and TLS listener
// of its own: another host, as far as molt can tell.
type host struct {
	name, root, socket, log, listen string
	cmd                             *exec.Cmd
}

// run runs the CLI against h's socket.
func (h *host) run(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.bin, append([]string{"--socket", h.socket}, args...)...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := result{stdout: so.String(), stderr: se.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("molt %v: %v", args, err)
	}
	return r
}

func (h *host) must(t *testing.T, args ...string) string {
	t.Helper()
	r := h.run(t, args...)
	if r.code != 0 {
		t.Fatalf("%s: molt %s: exit %d\nstdout: %s\nstderr: %s", h.name, strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// startHost starts daemon name on root (keys made already), sharing the
// store of srv, trusting the host key in file trust.
func startHost(t *testing.T, name, root string, srv s3test.Server, trust string) *host {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &host{name: name, root: root, socket: filepath.Join(root, "molt.sock"), log: filepath.Join(root, "daemon.log"), listen: l.Addr().String()}
	l.Close()
	logf, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	h.cmd = exec.Command(env.bin, "daemon", "--root", root, "--socket", h.socket, "--pool-size", "16G",
		"--cgroup-parent", "molt-it-"+name, "--store", srv.URL("migrate"), "--store-endpoint", srv.Endpoint, "--store-region", srv.Region,
		"--trust-key", trust, "--listen", "tcp://"+h.listen,
		"--tls-cert", filepath.Join(env.tlsDir, "cert.pem"), "--tls-key", filepath.Join(env.tlsDir, "key.pem"))
	h.cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+srv.AccessKey, "AWS_SECRET_ACCESS_KEY="+srv.SecretKey)
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = h.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(h.log)
			t.Logf("%s's log ends with:\n%s", name, tail(b, 3000))
		}
		// Its pool (a loop-mounted btrfs when the root is not on one).
		if err := syscall.Unmount(filepath.Join(root, "pool"), 0); err != nil && err != syscall.EINVAL {
			t.Errorf("%s: unmount its pool: %v", name, err)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if exec.Command(env.bin, "--socket", h.socket, "host").Run() == nil {
			return h
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(h.log)
			t.Fatalf("%s did not come up:\n%s", name, tail(b, 3000))
		}
	}
}

// TestMigrateBetweenDaemons runs two daemons on this machine with their
// own roots, cgroups and TLS listeners, sharing one S3 store and
// trusting each other's host keys, and migrates a tenant's sandbox with
// a shell session and a counter running from the first to the second
// through the second's TCP API (TLS, a token of the tenant there). On
// the target the counter goes on and the session keeps its variable;
// the source no longer has the sandbox; a rollback on the target to a
// checkpoint taken on the source restores that checkpoint's session.
// It logs the migration's downtime.
func TestMigrateBetweenDaemons(t *testing.T) {
	if env.tlsDir == "" {
		t.Skip("no TLS certificate in this run")
	}
	ctx := context.Background()
	p, err := s3test.StartProcess(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	tmp := t.TempDir()
	rootA, rootB := filepath.Join(tmp, "a"), filepath.Join(tmp, "b")
	for _, r := range []string{rootA, rootB} {
		if _, err := ckstore.LoadKeyring(filepath.Join(r, "keys"), nil); err != nil {
			t.Fatal(err)
		}
	}
	a := startHost(t, "a", rootA, p.Server, filepath.Join(rootB, "keys", "host.pub"))
	b := startHost(t, "b", rootB, p.Server, filepath.Join(rootA, "keys", "host.pub"))
	for _, h := range []*host{a, b} {
		h.must(t, "image", "build", image)
		h.must(t, "tenant", "create", "acme")
	}
	tokA := strings.TrimSpace(a.must(t, "token", "create", "--tenant", "acme", "--scope", "admin"))
	tokB := strings.TrimSpace(b.must(t, "token", "create", "--tenant", "acme", "--scope", "checkpoint"))
	ca := filepath.Join(env.tlsDir, "cert.pem")
	sb := strings.TrimSpace(a.must(t, "--endpoint", "https://"+a.listen, "--token", tokA, "--tls-ca", ca, "create", image))

	a.must(t, "exec", sb, "--session", "agent", "--", "V=early; cd /tmp")
	a.must(t, "exec", "--detach", sb, "--", "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /c; sleep 0.05; done")
	early := strings.TrimSpace(a.must(t, "checkpoint", sb, "--kind", "full", "--wait", "--label", "early"))
	a.must(t, "exec", sb, "--session", "agent", "--", "V=late")

	// A target that does not answer: the sandbox runs on at the source.
	if r := a.run(t, "migrate", sb, "--to", "https://127.0.0.1:1", "--to-token", tokB, "--to-ca", ca); r.code == 0 {
		t.Fatalf("a migration to nowhere succeeded: %s", r.stdout)
	}
	if out := a.must(t, "exec", sb, "--session", "agent", "--", "echo $V"); out != "late\n" {
		t.Fatalf("the source's session after a failed migration: %q", out)
	}

	var res v1.MigrateResult
	out := a.must(t, "--json", "migrate", sb, "--to", "https://"+b.listen, "--to-token", tokB, "--to-ca", ca)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate: %q: %v", out, err)
	}
	t.Logf("migrated: %d checkpoints, downtime %.0f ms (upload %.0f ms, target's resume %.0f ms)", res.Checkpoints, res.DowntimeMS, res.UploadMS, res.ResumeMS)
	if r := a.run(t, "inspect", sb); r.code == 0 {
		t.Fatalf("the source still lists the migrated sandbox: %s", r.stdout)
	}
	if out := b.must(t, "exec", sb, "--session", "agent", "--", "echo $V; pwd"); out != "late\n/tmp\n" {
		t.Fatalf("the session on the target: %q", out)
	}
	count := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(b.must(t, "exec", sb, "--", "cat", "/c")))
		return n
	}
	c1 := count()
	time.Sleep(500 * time.Millisecond)
	if c2 := count(); c2 <= c1 {
		t.Fatalf("the counter on the target stands at %d, then %d", c1, c2)
	}
	b.must(t, "rollback", sb, early)
	if out := b.must(t, "exec", sb, "--session", "agent", "--", "echo $V"); out != "early\n" {
		t.Fatalf("after a rollback on the target to the source's checkpoint %s: %q", early, out)
	}
	b.must(t, "rm", sb)
}
