package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/egress/netlab"
	"github.com/molt-sh/molt/internal/objstore/s3test"
	"github.com/molt-sh/molt/internal/testutil"
)

// TestMigrateBetweenDaemons runs two daemons on this machine as two
// hosts: their own roots, cgroups, network namespaces and TLS listeners
// on a bridge between them (netns_test.go), sharing one S3 store served
// to them over that network and trusting each other's host keys, and
// migrates a tenant's sandbox with
// a shell session and a counter running from the first to the second
// through the second's TCP API (TLS, a token of the tenant there). On
// the target the counter goes on and the session keeps its variable;
// the source no longer has the sandbox; a rollback on the target to a
// checkpoint taken on the source restores that checkpoint's session.
// It logs the migration's downtime.
func TestMigrateBetweenDaemons(t *testing.T) {
	hs := startMigrationHosts(t, nil, nil)
	a, b, fab, listenA, listenB, tokA, tokB, ca := hs.a, hs.b, hs.fab, hs.listenA, hs.listenB, hs.tokA, hs.tokB, hs.ca
	sb := strings.TrimSpace(a.must(t, "--endpoint", "https://"+listenA, "--token", tokA, "--tls-ca", ca, "create", image))

	a.must(t, "exec", sb, "--session", "agent", "--", "V=early; cd /tmp")
	a.must(t, "exec", "--detach", sb, "--", "sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /c; sleep 0.05; done")
	early := strings.TrimSpace(a.must(t, "checkpoint", sb, "--kind", "full", "--wait", "--label", "early"))

	// An LLM endpoint with a credential header, to an upstream both
	// hosts reach.
	llm := &fakeLLM{script: []string{"echo moved"}}
	var authMu sync.Mutex
	var auths []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authMu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		authMu.Unlock()
		llm.ServeHTTP(w, r)
	}))
	defer up.Close()
	upstream := "http://" + forward(t, strings.TrimPrefix(up.URL, "http://")) + "/v1"
	var ep v1.LLMEndpoint
	if err := json.Unmarshal([]byte(a.must(t, "--json", "llm", sb, "--upstream", upstream, "--header", "Authorization: Bearer up-secret")), &ep); err != nil {
		t.Fatal(err)
	}
	a.must(t, "exec", sb, "--session", "agent", "--", "V=late")

	// A target that does not answer: the sandbox runs on at the source.
	// The address is a listener on this machine's loopback, which host
	// a, in a network namespace of its own, does not reach.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	r := a.molt(t, "migrate", sb, "--to", "https://"+ln.Addr().String(), "--to-token", tokB, "--to-ca", ca)
	ln.Close()
	if r.code == 0 {
		t.Fatalf("a migration to nowhere succeeded: %s", r.stdout)
	}
	select {
	case <-accepted:
		t.Fatal("host a reached this machine's loopback: its network is not its own")
	default:
	}
	if out := a.must(t, "exec", sb, "--session", "agent", "--", "echo $V"); out != "late\n" {
		t.Fatalf("the source's session after a failed migration: %q", out)
	}

	var res v1.MigrateResult
	out := a.must(t, "--json", "migrate", sb, "--to", "https://"+listenB, "--to-token", tokB, "--to-ca", ca)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate: %q: %v", out, err)
	}
	t.Logf("migrated: %d checkpoints, downtime %.0f ms (upload %.0f ms, target's resume %.0f ms); memory sent ahead: %d bytes in %.0f ms",
		res.Checkpoints, res.DowntimeMS, res.UploadMS, res.ResumeMS, res.PrecopySentBytes, res.PrecopyMS)
	if res.PrecopyMS <= 0 {
		t.Fatalf("the migration sent no memory ahead: %+v", res)
	}
	if r := a.molt(t, "inspect", sb); r.code == 0 {
		t.Fatalf("the source still lists the migrated sandbox: %s", r.stdout)
	}
	// The endpoint moved: same token, the target's address, the source's
	// header on what reaches the upstream.
	if res.LLMEndpoint == nil || res.Note != "" {
		t.Fatalf("the LLM endpoint did not move: %+v", res)
	}
	if !strings.Contains(res.LLMEndpoint.URL, "/t/"+ep.Token+"/v1") || res.LLMEndpoint.Upstream != upstream {
		t.Fatalf("the moved endpoint %+v; it was %+v", res.LLMEndpoint, ep)
	}
	call := `import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/chat/completions", data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(), headers={"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"])`
	if out, err := exec.Command("nsenter", "--net="+fab.netns[1], testutil.Python(t), "-c", call, res.LLMEndpoint.URL).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "echo moved" {
		t.Fatalf("a call to the moved endpoint on the target: %v: %s", err, out)
	}
	authMu.Lock()
	if len(auths) != 1 || auths[0] != "Bearer up-secret" {
		t.Fatalf("the upstream saw Authorization %q", auths)
	}
	authMu.Unlock()
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

// migrationHosts are two daemons on this machine acting as two hosts
// (TestMigrateBetweenDaemons), each with tenant acme and an admin token
// of it, and the CA of their TLS certificate.
type migrationHosts struct {
	a, b             host
	fab              fabric
	listenA, listenB string
	tokA, tokB       string
	ca               string
}

// startMigrationHosts starts them, with extra daemon flags for each.
func startMigrationHosts(t *testing.T, argsA, argsB []string) migrationHosts {
	t.Helper()
	if env.tlsDir == "" {
		t.Skip("no TLS certificate in this run")
	}
	requireCRIU(t)
	fab := startFabric(t, 2)
	srv := s3test.Start(t)
	endpoint := "http://" + forward(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	creds := []string{"AWS_ACCESS_KEY_ID=" + srv.AccessKey, "AWS_SECRET_ACCESS_KEY=" + srv.SecretKey}
	dirA, dirB := t.TempDir(), t.TempDir()
	for _, d := range []string{dirA, dirB} {
		if _, err := ckstore.LoadKeyring(filepath.Join(d, "root", "keys"), nil); err != nil {
			t.Fatal(err)
		}
	}
	flags := func(d, trust string) []string {
		return []string{"--store", "s3://" + srv.Bucket + "/it-" + strings.ToLower(t.Name()), "--store-endpoint", endpoint,
			"--trust-key", filepath.Join(trust, "root", "keys", "host.pub"), "--listen", "tcp://" + d,
			"--tls-cert", filepath.Join(env.tlsDir, "cert.pem"), "--tls-key", filepath.Join(env.tlsDir, "key.pem")}
	}
	// Each host has its namespace's ports to itself.
	listenA, listenB := net.JoinHostPort(hostIPs[0].String(), "7443"), net.JoinHostPort(hostIPs[1].String(), "7443")
	a := startHostIn(t, "a", dirA, fab.netns[0], creds, append(flags(listenA, dirB), argsA...)...)
	b := startHostIn(t, "b", dirB, fab.netns[1], creds, append(flags(listenB, dirA), argsB...)...)

	for _, h := range []host{a, b} {
		h.must(t, "tenant", "create", "acme")
	}
	tokA := strings.TrimSpace(a.must(t, "token", "create", "--tenant", "acme", "--scope", "admin"))
	// The admin scope: it also sets the sandbox's LLM endpoint there.
	tokB := strings.TrimSpace(b.must(t, "token", "create", "--tenant", "acme", "--scope", "admin"))
	return migrationHosts{a: a, b: b, fab: fab, listenA: listenA, listenB: listenB, tokA: tokA, tokB: tokB,
		ca: filepath.Join(env.tlsDir, "cert.pem")}
}

// TestMigrateEgress migrates a sandbox with egress and TLS inspection
// between two hosts whose egress ranges differ, both reaching the test
// internet. What must move with it: its ledger (the payment made on the
// source is listed on the target, and after a rollback on the target to
// a checkpoint taken on the source the same payment is answered from
// the ledger, not sent again), its inspection CA (the target inspects
// its HTTPS with the CA its trust store holds: the key came over the
// migration's channel), and its network (an address of the target's
// range; a connection open to the world at the final checkpoint, bound
// to the source's address, is restored and reset, not a failed restore).
func TestMigrateEgress(t *testing.T) {
	if env.lab == nil {
		t.Skip("no test internet in this run")
	}
	requireEgress(t)
	lab := []string{"--egress-uplink", env.lab.Name, "--egress-dns", env.lab.DNSAddr().String(), "--egress-ca", env.lab.CAFile}
	hs := startMigrationHosts(t, append([]string{"--egress-range", "10.210.0.0/16"}, lab...), append([]string{"--egress-range", "10.211.0.0/16"}, lab...))
	a, b := hs.a, hs.b
	sb := strings.TrimSpace(a.must(t, "--endpoint", "https://"+hs.listenA, "--token", hs.tokA, "--tls-ca", hs.ca,
		"create", image, "--network", "egress", "--egress-inspect", "--allow", netlab.WebName, "--allow", netlab.PayName))
	address := func(h host) netip.Addr {
		t.Helper()
		var info v1.Sandbox
		if err := json.Unmarshal([]byte(h.must(t, "--json", "inspect", sb)), &info); err != nil {
			t.Fatal(err)
		}
		ip, err := netip.ParseAddr(info.Address)
		if err != nil {
			t.Fatalf("sandbox address %q: %v", info.Address, err)
		}
		return ip
	}
	if ip := address(a); !netip.MustParsePrefix("10.210.0.0/16").Contains(ip) {
		t.Fatalf("address on the source %v", ip)
	}
	httpsHello := "https://" + netlab.WebName + "/hello"
	if f := fetchAt(t, a.socket, sb, "GET", httpsHello, ""); f.Status != 200 || f.Body != hello || f.Ledger == "" {
		t.Fatalf("inspected HTTPS on the source: %+v", f)
	}
	// An address the sandbox resolved on the source, which it keeps
	// using after the move without asking again (a program's cache).
	webIP := strings.TrimSpace(pyAt(t, a, sb, "import socket; print(socket.gethostbyname('"+netlab.WebName+"'))"))
	before := strings.TrimSpace(a.must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	paid := env.lab.PayCount()
	first := fetchAt(t, a.socket, sb, "POST", payURL, payBody(13))
	if first.Status != 200 || env.lab.PayCount() != paid+1 {
		t.Fatalf("the payment on the source: %+v", first)
	}
	// A connection to the world open at the final checkpoint.
	if r := moltAt(t, a.socket, fmt.Sprintf(holder, netlab.WebName), "exec", sb, "--", "sh", "-c", "cat > /tmp/holder.py"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	a.must(t, "exec", sb, "--detach", "--", "python3", "/tmp/holder.py")
	waitFileAt(t, a, sb, "/tmp/holder.ready", 30*time.Second)

	var res v1.MigrateResult
	out := a.must(t, "--json", "migrate", sb, "--to", "https://"+hs.listenB, "--to-token", hs.tokB, "--to-ca", hs.ca)
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate: %q: %v", out, err)
	}
	t.Logf("migrated with egress: downtime %.0f ms", res.DowntimeMS)
	if ip := address(b); !netip.MustParsePrefix("10.211.0.0/16").Contains(ip) {
		t.Fatalf("address on the target %v, want one of its range", ip)
	}
	// The names the sandbox resolved moved with it: the allow list
	// names domains, and the cached address is judged by its name
	// (before anything here resolves the name again).
	if out := pyAt(t, b, sb, `import urllib.request
r = urllib.request.Request("http://`+webIP+`/hello", headers={"Host": "`+netlab.WebName+`"})
try:
    print(urllib.request.urlopen(r, timeout=10).status)
except Exception as e:
    print("refused", e)`); strings.TrimSpace(out) != "200" {
		t.Fatalf("the address %s resolved on the source, on the target: %s", webIP, out)
	}
	if out := waitFileAt(t, b, sb, "/tmp/holder.out", 20*time.Second); !strings.HasPrefix(out, "reset") && out != "eof" {
		t.Fatalf("the connection open at the migration: %q, want a reset", out)
	}
	if f := fetchAt(t, b.socket, sb, "GET", httpsHello, ""); f.Status != 200 || f.Body != hello || f.Ledger == "" {
		t.Fatalf("inspected HTTPS on the target: %+v", f)
	}

	l := effectsAt(t, b.socket, sb)
	pay, ok := findEffect(l, func(e v1.Effect) bool { return e.Method == "POST" && e.State == "completed" })
	if !ok || pay.URL != payURL {
		t.Fatalf("the source's payment is not in the target's ledger: %+v", l)
	}
	if _, ok := findEffect(l, func(e v1.Effect) bool { return e.Proto == "https" && e.URL == httpsHello }); !ok {
		t.Fatalf("the target's inspected HTTPS request is not in its ledger: %+v", l)
	}
	b.must(t, "rollback", sb, before)
	again := fetchAt(t, b.socket, sb, "POST", payURL, payBody(13))
	if again.Status != 200 || again.Body != first.Body || again.Replayed != pay.ID {
		t.Fatalf("the payment after a rollback on the target to the source's checkpoint: %+v, want %s's answer replayed", again, pay.ID)
	}
	if n := env.lab.PayCount() - paid; n != 1 {
		t.Fatalf("the payment service got %d payments, want 1", n)
	}
}

// waitFileAt waits for path in sandbox sb of host h to hold something
// and returns it.
func waitFileAt(t *testing.T, h host, sb, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		r := h.molt(t, "exec", sb, "--", "cat", path)
		if r.code == 0 && r.stdout != "" {
			return r.stdout
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s: nothing after %v", path, sb, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pyAt runs a Python program in sandbox sb of host h and returns its
// stdout.
func pyAt(t *testing.T, h host, sb, code string) string {
	t.Helper()
	r := moltAt(t, h.socket, code, "exec", sb, "--", "python3", "-")
	if r.code != 0 {
		t.Fatalf("python in %s: exit %d\n%s\n%s", sb, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}
