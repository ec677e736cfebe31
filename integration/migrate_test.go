package integration

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/objstore/s3test"
)

// listenAddr picks a free port of 127.0.0.1 for a TLS listener.
func listenAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
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
	requireCRIU(t)
	srv := s3test.Start(t)
	creds := []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey}
	dirA, dirB := t.TempDir(), t.TempDir()
	for _, d := range []string{dirA, dirB} {
		if _, err := ckstore.LoadKeyring(filepath.Join(d, "root", "keys"), nil); err != nil {
			t.Fatal(err)
		}
	}
	flags := func(d, trust string) []string {
		return []string{"--store", "s3://" + srv.Bucket + "/it-" + strings.ToLower(t.Name()), "--store-endpoint", srv.Endpoint,
			"--trust-key", filepath.Join(trust, "root", "keys", "host.pub"), "--listen", "tcp://" + d,
			"--tls-cert", filepath.Join(env.tlsDir, "cert.pem"), "--tls-key", filepath.Join(env.tlsDir, "key.pem")}
	}
	listenA, listenB := listenAddr(t), listenAddr(t)
	a := startHost(t, "a", dirA, creds, flags(listenA, dirB)...)
	b := startHost(t, "b", dirB, creds, flags(listenB, dirA)...)
	for _, h := range []host{a, b} {
		h.must(t, "tenant", "create", "acme")
	}
	tokA := strings.TrimSpace(a.must(t, "token", "create", "--tenant", "acme", "--scope", "admin"))
	tokB := strings.TrimSpace(b.must(t, "token", "create", "--tenant", "acme", "--scope", "checkpoint"))
	ca := filepath.Join(env.tlsDir, "cert.pem")
	sb := strings.TrimSpace(a.must(t, "--endpoint", "https://"+listenA, "--token", tokA, "--tls-ca", ca, "create", image))

	a.must(t, "exec", sb, "--session", "agent", "--", "V=early; cd /tmp")
	a.must(t, "exec", "--detach", sb, "--", "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /c; sleep 0.05; done")
	early := strings.TrimSpace(a.must(t, "checkpoint", sb, "--kind", "full", "--wait", "--label", "early"))
	a.must(t, "exec", sb, "--session", "agent", "--", "V=late")

	// A target that does not answer: the sandbox runs on at the source.
	if r := a.molt(t, "migrate", sb, "--to", "https://127.0.0.1:1", "--to-token", tokB, "--to-ca", ca); r.code == 0 {
		t.Fatalf("a migration to nowhere succeeded: %s", r.stdout)
	}
	if out := a.must(t, "exec", sb, "--session", "agent", "--", "echo $V"); out != "late\n" {
		t.Fatalf("the source's session after a failed migration: %q", out)
	}

	var res v1.MigrateResult
	out := a.must(t, "--json", "migrate", sb, "--to", "https://"+listenB, "--to-token", tokB, "--to-ca", ca)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate: %q: %v", out, err)
	}
	t.Logf("migrated: %d checkpoints, downtime %.0f ms (upload %.0f ms, target's resume %.0f ms)", res.Checkpoints, res.DowntimeMS, res.UploadMS, res.ResumeMS)
	if r := a.molt(t, "inspect", sb); r.code == 0 {
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
}
