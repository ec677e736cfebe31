package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/egress/netlab"
	"github.com/molt-sh/molt/internal/testutil"
)

// Egress: sandboxes reach the test internet (env.lab, a network
// namespace of this process's) through molt's router, proxy and DNS,
// and every effect lands in the ledger.

// pyFetch is a small HTTP client run inside sandboxes: fetch prints one
// JSON line with the status, body, molt's headers or the error.
const pyFetch = `
import json, socket, ssl, sys, urllib.request, urllib.error
def fetch(method, url, body=None, cafile=None, headers=None):
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    req = urllib.request.Request(url, data=body.encode() if body is not None else None, method=method, headers=headers or {})
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            out = {"status": r.status, "body": r.read().decode(), "replayed": r.headers.get("Molt-Replayed", ""), "ledger": r.headers.get("Molt-Ledger-Id", "")}
    except urllib.error.HTTPError as e:
        out = {"status": e.code, "body": e.read().decode(), "replayed": e.headers.get("Molt-Replayed", ""), "ledger": e.headers.get("Molt-Ledger-Id", "")}
    except Exception as e:
        out = {"status": 0, "error": type(e).__name__ + ": " + str(e)}
    print(json.dumps(out))
`

type fetched struct {
	Status   int    `json:"status"`
	Body     string `json:"body"`
	Replayed string `json:"replayed"`
	Ledger   string `json:"ledger"`
	Error    string `json:"error"`
}

// fetch runs one request inside sandbox sb.
func fetch(t *testing.T, sb, method, url, body string, extra ...string) fetched {
	t.Helper()
	return fetchAt(t, env.socket, sb, method, url, body, extra...)
}

// fetchAt is fetch in a sandbox of the daemon of socket.
func fetchAt(t *testing.T, socket, sb, method, url, body string, extra ...string) fetched {
	t.Helper()
	args := []string{strconv.Quote(method), strconv.Quote(url)}
	if body != "" {
		args = append(args, "body="+strconv.Quote(body))
	}
	args = append(args, extra...)
	script := pyFetch + "fetch(" + strings.Join(args, ", ") + ")\n"
	r := moltAt(t, socket, script, "exec", sb, "--", "python3", "-")
	if r.code != 0 {
		t.Fatalf("fetch %s %s in %s: exit %d: %s", method, url, sb, r.code, r.stderr)
	}
	var f fetched
	if err := json.Unmarshal([]byte(strings.TrimSpace(r.stdout)), &f); err != nil {
		t.Fatalf("fetch %s %s: %q: %v", method, url, r.stdout, err)
	}
	return f
}

// py runs a Python program in sb and returns its stdout.
func py(t *testing.T, sb, code string) string {
	t.Helper()
	r := moltIn(t, code, "exec", sb, "--", "python3", "-")
	if r.code != 0 {
		t.Fatalf("python in %s: exit %d\n%s\n%s", sb, r.code, r.stdout, r.stderr)
	}
	return strings.TrimSpace(r.stdout)
}

// labCA puts the test internet's CA at /tmp/lab-ca.pem in sb (sandboxes
// without inspection talk TLS to the lab's servers end to end).
func labCA(t *testing.T, sb string) string {
	t.Helper()
	if r := moltIn(t, string(env.lab.CAPEM), "exec", sb, "--", "sh", "-c", "cat > /tmp/lab-ca.pem"); r.code != 0 {
		t.Fatalf("copy the lab CA: %s", r.stderr)
	}
	return `cafile="/tmp/lab-ca.pem"`
}

func effects(t *testing.T, sb string, args ...string) []v1.Effect {
	t.Helper()
	return effectsAt(t, env.socket, sb, args...)
}

// effectsAt is effects of a sandbox of the daemon of socket.
func effectsAt(t *testing.T, socket, sb string, args ...string) []v1.Effect {
	t.Helper()
	r := moltAt(t, socket, "", append([]string{"--json", "effects", sb}, args...)...)
	if r.code != 0 {
		t.Fatalf("molt effects %s: exit %d: %s", sb, r.code, r.stderr)
	}
	var l []v1.Effect
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
		t.Fatalf("molt effects %s: %q: %v", sb, r.stdout, err)
	}
	return l
}

// findEffect returns the last effect matching pred.
func findEffect(l []v1.Effect, pred func(v1.Effect) bool) (v1.Effect, bool) {
	for i := len(l) - 1; i >= 0; i-- {
		if pred(l[i]) {
			return l[i], true
		}
	}
	return v1.Effect{}, false
}

// requireEgress fails or skips (testutil.Unavailable) where the host
// cannot give sandboxes egress.
func requireEgress(t *testing.T) {
	t.Helper()
	var host v1.Host
	mustJSON(t, &host, "host")
	for _, f := range host.Features {
		if f.Name == "egress" && !f.Supported {
			testutil.Unavailable(t, "egress: "+f.Reason)
		}
	}
}

func newEgressSandbox(t *testing.T, args ...string) string {
	t.Helper()
	requireEgress(t)
	return newSandbox(t, append([]string{"--network", "egress"}, args...)...)
}

var (
	helloURL = "http://" + netlab.WebName + "/hello"
	payURL   = "http://" + netlab.PayName + "/pay"
)

const hello = "hello from the lab\n"

func TestEgressHTTPAndHTTPS(t *testing.T) {
	sb := newEgressSandbox(t)
	var info v1.Sandbox
	mustJSON(t, &info, "inspect", sb)
	if info.Network != v1.NetworkEgress || info.Address == "" {
		t.Fatalf("sandbox network %q address %q, want egress and an address", info.Network, info.Address)
	}
	if f := fetch(t, sb, "GET", helloURL, ""); f.Status != 200 || f.Body != hello || f.Ledger == "" {
		t.Fatalf("GET %s: %+v", helloURL, f)
	}
	// The turn's effects count what left the sandbox.
	var turn v1.TurnResult
	mustJSON(t, &turn, "turn", sb)
	if e := turn.Effects.Egress; e == nil || e.Reads < 2 || e.Connections < 1 || e.Effects != 0 {
		t.Errorf("turn's egress effects: %+v, want the GET and its DNS lookups as reads", e)
	}
	ca := labCA(t, sb)
	if f := fetch(t, sb, "GET", "https://"+netlab.WebName+"/hello", "", ca); f.Status != 200 || f.Body != hello {
		t.Fatalf("GET https: %+v", f)
	}
	// A pip-style download: the package and its hash, over HTTPS.
	out := py(t, sb, fmt.Sprintf(`import hashlib, ssl, urllib.request
ctx = ssl.create_default_context(cafile="/tmp/lab-ca.pem")
pkg = urllib.request.urlopen("https://%[1]s/pkg/%[2]s", context=ctx, timeout=20).read()
want = urllib.request.urlopen("https://%[1]s/pkg/%[2]s.sha256", context=ctx, timeout=20).read().decode().split()[0]
print("ok" if hashlib.sha256(pkg).hexdigest() == want else "mismatch", len(pkg))
`, netlab.FilesName, netlab.DemoFile))
	if !strings.HasPrefix(out, "ok ") {
		t.Fatalf("download: %s", out)
	}
	l := effects(t, sb)
	if e, ok := findEffect(l, func(e v1.Effect) bool { return e.Proto == "http" && e.URL == helloURL }); !ok || e.Kind != "read" || e.State != "completed" || e.Status != 200 || e.Method != "GET" {
		t.Errorf("HTTP GET record: %+v (found %v)", e, ok)
	}
	if e, ok := findEffect(l, func(e v1.Effect) bool { return e.Proto == "tls" && e.Host == netlab.FilesName }); !ok || e.Kind != "opaque" || e.State != "completed" || e.BytesIn == 0 || e.BytesOut == 0 {
		t.Errorf("TLS connection record: %+v (found %v)", e, ok)
	}
	if e, ok := findEffect(l, func(e v1.Effect) bool {
		return e.Proto == "dns" && e.Method == "A" && strings.TrimSuffix(e.Host, ".") == netlab.WebName
	}); !ok || e.Kind != "read" || len(e.Answers) == 0 {
		t.Errorf("DNS record: %+v (found %v)", e, ok)
	}

	// With inspection the sandbox trusts molt's CA (installed for it),
	// and HTTPS requests are recorded like HTTP ones.
	in := newEgressSandbox(t, "--egress-inspect")
	httpsHello := "https://" + netlab.WebName + "/hello"
	if f := fetch(t, in, "GET", httpsHello, ""); f.Status != 200 || f.Body != hello || f.Ledger == "" {
		t.Fatalf("GET %s inspected: %+v", httpsHello, f)
	}
	if e, ok := findEffect(effects(t, in), func(e v1.Effect) bool { return e.Proto == "https" }); !ok || e.URL != httpsHello || e.Method != "GET" || e.Status != 200 {
		t.Errorf("inspected HTTPS record: %+v (found %v)", e, ok)
	}
}

func TestEgressPolicy(t *testing.T) {
	sb := newEgressSandbox(t, "--deny", netlab.OtherName, "--deny", netlab.FilesIP+"/32")
	out := py(t, sb, fmt.Sprintf(`import socket
def try_(fn):
    try:
        fn()
        return "ok"
    except Exception as e:
        return type(e).__name__
print(try_(lambda: socket.getaddrinfo(%q, 80)))
print(try_(lambda: socket.create_connection((%q, 80), timeout=10)))
print(try_(lambda: socket.create_connection(("169.254.169.254", 80), timeout=10)))
print(try_(lambda: socket.create_connection((%q, 80), timeout=10)))
`, netlab.OtherName, netlab.FilesIP, netlab.WebName))
	got := strings.Fields(out)
	want := []string{"gaierror", "ConnectionRefusedError", "ConnectionRefusedError", "ok"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("denied name, denied CIDR, metadata address, allowed name: %v, want %v", got, want)
	}
	// The firewall's refusals reach the ledger through the kernel's log:
	// give them a moment.
	var l []v1.Effect
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		l = effects(t, sb)
		n := 0
		for _, e := range l {
			if e.State == "denied" && e.Proto == "tcp" {
				n++
			}
		}
		if n >= 2 || time.Now().After(deadline) {
			break
		}
	}
	if e, ok := findEffect(l, func(e v1.Effect) bool { return e.State == "denied" && e.Proto == "dns" }); !ok || !strings.Contains(e.Host, netlab.OtherName) || e.Error == "" {
		t.Errorf("denied DNS record: %+v (found %v)", e, ok)
	}
	if e, ok := findEffect(l, func(e v1.Effect) bool { return e.State == "denied" && strings.HasPrefix(e.Addr, netlab.FilesIP+":") }); !ok {
		t.Errorf("no denied record for the CIDR: %+v", l)
	} else if e.Error == "" {
		t.Errorf("denied CIDR record without a reason: %+v", e)
	}

	// An allow list: only what it names.
	only := newEgressSandbox(t, "--allow", netlab.WebName)
	if f := fetch(t, only, "GET", helloURL, ""); f.Status != 200 {
		t.Fatalf("allowed name: %+v", f)
	}
	if f := fetch(t, only, "GET", "http://"+netlab.FilesName+"/hello", ""); f.Status != 0 || !strings.Contains(f.Error, "URLError") {
		t.Fatalf("name outside the allow list: %+v, want a resolution error", f)
	}
	// An allow list of one address: it, and nothing else.
	one := newEgressSandbox(t, "--allow", netlab.WebIP+"/32")
	out = py(t, one, fmt.Sprintf(`import socket
def try_(a):
    try:
        socket.create_connection((a, 80), timeout=10).close()
        return "ok"
    except Exception as e:
        return type(e).__name__
print(try_(%q), try_(%q))
`, netlab.WebIP, netlab.FilesIP))
	if out != "ok ConnectionRefusedError" {
		t.Fatalf("allowed address, other address: %s", out)
	}
}

// payBody is a payment request; a different amount is a different effect.
func payBody(amount int) string { return fmt.Sprintf(`{"amount": %d, "to": "acct-42"}`, amount) }

func TestEgressReplayAfterRollback(t *testing.T) {
	requireCRIU(t)
	sb := newEgressSandbox(t)
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	before := env.lab.PayCount()
	first := fetch(t, sb, "POST", payURL, payBody(5))
	if first.Status != 200 || env.lab.PayCount() != before+1 {
		t.Fatalf("first payment: %+v, count %d", first, env.lab.PayCount()-before)
	}
	must(t, "rollback", sb, ck)
	again := fetch(t, sb, "POST", payURL, payBody(5))
	if again.Status != 200 || again.Body != first.Body || again.Replayed == "" {
		t.Fatalf("payment after rollback: %+v, want the recorded answer %q, replayed", again, first.Body)
	}
	if n := env.lab.PayCount() - before; n != 1 {
		t.Fatalf("the payment service got %d payments, want 1", n)
	}
	l := effects(t, sb)
	orig, ok := findEffect(l, func(e v1.Effect) bool { return e.Method == "POST" && e.State == "completed" })
	if !ok || orig.Kind != "effect" || orig.Status != 200 {
		t.Fatalf("payment record: %+v", l)
	}
	rep, ok := findEffect(l, func(e v1.Effect) bool { return e.State == "replayed" })
	if !ok || rep.ReplayOf != orig.ID || again.Replayed != orig.ID {
		t.Fatalf("replay record %+v, header %q, want it to name %s", rep, again.Replayed, orig.ID)
	}
	// effects --since the checkpoint lists what came after it.
	if since := effects(t, sb, "--since", ck); len(since) == 0 || len(since) >= len(l)+1 {
		t.Errorf("effects --since %s: %d records of %d", ck, len(since), len(l))
	}
}

// Effects that do not cross molt are declared through the API, with a
// compensator; they are listed with the rest.
func TestEgressDeclaredEffect(t *testing.T) {
	sb := newSandbox(t)
	c := client.New(env.socket)
	ctx := context.Background()
	e, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://mail.example/send", Body: []byte("to=a@b"),
		IdempotencyKey: "mail-1", Status: 202, Compensator: &v1.Compensator{Method: "POST", URL: "https://mail.example/recall/1"}})
	if err != nil {
		t.Fatal(err)
	}
	if e.ID == "" || e.Kind != "effect" || e.State != "completed" || !e.Declared || e.BodyHash == "" {
		t.Fatalf("declared effect: %+v", e)
	}
	l := effects(t, sb)
	if len(l) != 1 || l[0].ID != e.ID || l[0].Compensator == nil || l[0].Compensator.URL != "https://mail.example/recall/1" || l[0].IdempotencyKey != "mail-1" {
		t.Fatalf("listed: %+v", l)
	}
	if _, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Kind: "payment"}); err == nil || !strings.Contains(err.Error(), "kind") {
		t.Fatalf("a bad kind: %v", err)
	}
	if _, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Compensator: &v1.Compensator{URL: "x"}}); err == nil {
		t.Fatal("a compensator without a method was accepted")
	}
}

func TestEgressDivergenceBlock(t *testing.T) {
	sb := newEgressSandbox(t, "--on-divergence", "block")
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
	before := env.lab.PayCount()
	if f := fetch(t, sb, "POST", payURL, payBody(7)); f.Status != 200 {
		t.Fatalf("payment: %+v", f)
	}
	must(t, "rollback", sb, ck)
	if f := fetch(t, sb, "POST", payURL, payBody(8)); f.Status != 409 || !strings.Contains(f.Body, "diverge") {
		t.Fatalf("a different payment after rollback: %+v, want 409 blocked", f)
	}
	if _, ok := findEffect(effects(t, sb), func(e v1.Effect) bool { return e.State == "blocked" && e.Method == "POST" }); !ok {
		t.Errorf("no blocked record")
	}
	// The recorded one is still answered from the ledger.
	if f := fetch(t, sb, "POST", payURL, payBody(7)); f.Status != 200 || f.Replayed == "" {
		t.Fatalf("the recorded payment after rollback: %+v", f)
	}
	if n := env.lab.PayCount() - before; n != 1 {
		t.Fatalf("the payment service got %d payments, want 1", n)
	}
	// A fork of the checkpoint has the same history and the same policy:
	// the recorded payment replays, a different one is refused.
	fork := forkIDs(t, ck, 1)[0]
	if f := fetch(t, fork, "POST", payURL, payBody(8)); f.Status != 409 {
		t.Fatalf("a different payment in a fork: %+v, want 409 blocked", f)
	}
	if f := fetch(t, fork, "POST", payURL, payBody(7)); f.Status != 200 || f.Replayed == "" {
		t.Fatalf("the recorded payment in a fork: %+v", f)
	}
	if n := env.lab.PayCount() - before; n != 1 {
		t.Fatalf("after the fork, the payment service got %d payments, want 1", n)
	}
}

func TestEgressFork(t *testing.T) {
	requireCRIU(t)
	sb := newEgressSandbox(t)
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	before := env.lab.PayCount()
	first := fetch(t, sb, "POST", payURL, payBody(9))
	if first.Status != 200 {
		t.Fatalf("payment: %+v", first)
	}
	forks := forkIDs(t, ck, 2)
	var a, b v1.Sandbox
	mustJSON(t, &a, "inspect", forks[0])
	mustJSON(t, &b, "inspect", forks[1])
	var parent v1.Sandbox
	mustJSON(t, &parent, "inspect", sb)
	if a.Address == "" || a.Address == b.Address || a.Address == parent.Address {
		t.Fatalf("fork addresses %q %q, parent %q: want their own", a.Address, b.Address, parent.Address)
	}
	for _, f := range forks {
		got := fetch(t, f, "POST", payURL, payBody(9))
		if got.Status != 200 || got.Body != first.Body || got.Replayed == "" {
			t.Fatalf("payment in fork %s: %+v, want the recorded answer", f, got)
		}
		if g := fetch(t, f, "GET", helloURL, ""); g.Status != 200 {
			t.Fatalf("GET in fork %s: %+v", f, g)
		}
	}
	if n := env.lab.PayCount() - before; n != 1 {
		t.Fatalf("the payment service got %d payments, want 1", n)
	}
}

func TestEgressDaemonCrashLeavesPending(t *testing.T) {
	sb := newEgressSandbox(t)
	before := env.lab.PayCount()
	arrived, release := env.lab.HoldPayments()
	defer release()
	script := pyFetch + "fetch(\"POST\", " + strconv.Quote(payURL) + ", body=" + strconv.Quote(payBody(11)) + ")\n"
	if r := moltIn(t, script, "exec", sb, "--", "sh", "-c", "cat > /tmp/pay.py"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	must(t, "exec", sb, "--detach", "--", "sh", "-c", "python3 /tmp/pay.py > /tmp/pay.out 2>&1")
	select {
	case <-arrived:
	case <-time.After(60 * time.Second):
		t.Fatal("the payment never reached the service")
	}
	killDaemon()
	release()
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	pending, ok := findEffect(effects(t, sb), func(e v1.Effect) bool { return e.Method == "POST" })
	if !ok || pending.State != "pending" {
		t.Fatalf("the payment's record after the crash: %+v (found %v), want pending", pending, ok)
	}
	// The sandbox runs on and its network comes back; the same payment
	// again is refused: its outcome is unknown, molt does not send it.
	got := fetch(t, sb, "POST", payURL, payBody(11))
	if got.Status != 409 || !strings.Contains(got.Body, pending.ID) {
		t.Fatalf("the same payment after the crash: %+v, want 409 naming %s", got, pending.ID)
	}
	if n := env.lab.PayCount() - before; n != 1 {
		t.Fatalf("the payment service got %d payments, want 1", n)
	}
	if f := fetch(t, sb, "GET", helloURL, ""); f.Status != 200 {
		t.Fatalf("GET after the daemon's restart: %+v", f)
	}
}

// holder keeps a connection to the lab open and waiting for data; after
// a restore it must see a reset, not hang.
const holder = `
import socket, sys, time
s = socket.create_connection((%q, 80), timeout=30)
s.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
s.recv(4096)
open("/tmp/holder.ready", "w").write("1")
s.settimeout(None)
try:
    d = s.recv(1)
    open("/tmp/holder.out", "w").write("eof" if not d else "data")
except Exception as e:
    open("/tmp/holder.out", "w").write("reset " + type(e).__name__)
time.sleep(600)
`

// waitFile waits for path in sb to hold something and returns it.
func waitFile(t *testing.T, sb, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		r := molt(t, "exec", sb, "--", "cat", path)
		if r.code == 0 && r.stdout != "" {
			return r.stdout
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s: nothing after %v", path, sb, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestEgressAcrossLifecycle(t *testing.T) {
	requireCRIU(t)
	sb := newEgressSandbox(t)
	if r := moltIn(t, fmt.Sprintf(holder, netlab.WebName), "exec", sb, "--", "sh", "-c", "cat > /tmp/holder.py"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	must(t, "exec", sb, "--detach", "--", "python3", "/tmp/holder.py")
	waitFile(t, sb, "/tmp/holder.ready", 30*time.Second)
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait", "--keep"))
	fsck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "fs", "--wait"))
	works := func(t *testing.T, box, when string) {
		t.Helper()
		if f := fetch(t, box, "GET", helloURL, ""); f.Status != 200 || f.Body != hello {
			t.Fatalf("%s: GET: %+v", when, f)
		}
	}
	reset := func(t *testing.T, box, when string) {
		t.Helper()
		if out := waitFile(t, box, "/tmp/holder.out", 20*time.Second); !strings.HasPrefix(out, "reset") && out != "eof" {
			t.Fatalf("%s: the connection open at the checkpoint: %q, want a reset", when, out)
		}
	}
	for _, tier := range []string{"hot", "warm", "cold"} {
		var res v1.RollbackResult
		args := []string{"rollback", sb, ck}
		if tier != "hot" {
			args = append(args, "--tier", tier)
		} else {
			// The standby of a kept checkpoint is prepared in the
			// background.
			waitStandbyOf(t, sb, ck)
		}
		mustJSON(t, &res, args...)
		if res.Tier != tier {
			t.Fatalf("rollback tier %s, want %s", res.Tier, tier)
		}
		reset(t, sb, tier+" rollback")
		works(t, sb, tier+" rollback")
	}
	var res v1.RollbackResult
	mustJSON(t, &res, "rollback", sb, fsck)
	works(t, sb, "fs rollback ("+res.Tier+")")

	forks := forkIDs(t, ck, 1)
	reset(t, forks[0], "fork")
	works(t, forks[0], "fork")

	mustJSON(t, &res, "rollback", sb, ck, "--tier", "warm")
	must(t, "hibernate", sb)
	must(t, "resume", sb)
	reset(t, sb, "resume")
	works(t, sb, "resume")
}

// forkIDs forks ref n times and removes the forks when the test ends.
func forkIDs(t *testing.T, ref string, n int) []string {
	t.Helper()
	var res v1.ForkResult
	mustJSON(t, &res, "fork", ref, "-n", strconv.Itoa(n))
	var ids []string
	for _, s := range res.Sandboxes {
		id := s.ID
		ids = append(ids, id)
		t.Cleanup(func() { molt(t, "rm", id) })
	}
	if len(ids) != n {
		t.Fatalf("fork -n %d made %d", n, len(ids))
	}
	return ids
}

// waitStandbyOf waits until sb has a standby of ck (kept: not
// necessarily its head's).
func waitStandbyOf(t *testing.T, sb, ck string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var info v1.Sandbox
		mustJSON(t, &info, "inspect", sb)
		for _, s := range info.Standbys {
			if s == ck {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby of %s after 60 s", ck)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// routerLinks lists the sandbox veths in the daemon's router namespace,
// by the sandbox their alias names ("" for none).
func routerLinks(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	if env.daemon == nil {
		return out
	}
	self, _ := os.Readlink("/proc/self/ns/net")
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", env.daemon.Process.Pid))
	seen := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(l, "net:") || l == self || seen[l] {
			continue
		}
		seen[l] = true
		h, err := netns.GetFromPath(fd)
		if err != nil {
			continue
		}
		nh, err := netlink.NewHandleAt(h)
		if err == nil {
			links, _ := nh.LinkList()
			for _, k := range links {
				if a := k.Attrs().Alias; strings.HasPrefix(a, "molt sandbox ") {
					out[strings.TrimPrefix(a, "molt sandbox ")]++
				}
			}
			nh.Close()
		}
		h.Close()
	}
	return out
}

// routerNS opens the daemon's router namespace (the network namespace
// other than the host's that the daemon holds a descriptor of).
func routerNS(t *testing.T) (netns.NsHandle, bool) {
	t.Helper()
	self, _ := os.Readlink("/proc/self/ns/net")
	fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", env.daemon.Process.Pid))
	for _, fd := range fds {
		l, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(l, "net:") || l == self {
			continue
		}
		h, err := netns.GetFromPath(fd)
		if err != nil {
			continue
		}
		// The router is the one with the uplink's router end.
		if nh, err := netlink.NewHandleAt(h); err == nil {
			_, err := nh.LinkByName("up0")
			nh.Close()
			if err == nil {
				return h, true
			}
		}
		h.Close()
	}
	return 0, false
}

// routerMentions counts the router's nftables rules and routes that name
// addr.
func routerMentions(t *testing.T, addr netip.Addr) (rules, routes int) {
	t.Helper()
	h, ok := routerNS(t)
	if !ok {
		return 0, 0
	}
	defer h.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseLasting()
	b := addr.As4()
	chains, err := c.ListChains()
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		rs, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			for _, e := range r.Exprs {
				if cmp, ok := e.(*expr.Cmp); ok && bytes.Equal(cmp.Data, b[:]) {
					rules++
				}
			}
		}
	}
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	rts, _ := nh.RouteList(nil, netlink.FAMILY_V4)
	for _, r := range rts {
		if r.Dst != nil && r.Dst.IP.Equal(addr.AsSlice()) {
			routes++
		}
	}
	return rules, routes
}

// uplinkLinks counts molt's uplink veths in the lab namespace.
func uplinkLinks(t *testing.T) int {
	t.Helper()
	h, err := netns.GetFromPath(env.lab.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	links, _ := nh.LinkList()
	n := 0
	for _, l := range links {
		if l.Type() == "veth" {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestEgressNothingLeftBehind(t *testing.T) {
	requireEgress(t)
	sb := strings.TrimSpace(must(t, "create", image, "--network", "egress"))
	if got := routerLinks(t)[sb]; got != 1 {
		t.Fatalf("sandbox %s has %d veths in the router, want 1", sb, got)
	}
	if uplinkLinks(t) != 1 {
		t.Fatalf("lab namespace has %d veths, want molt's uplink", uplinkLinks(t))
	}
	// A crash: the router namespace goes with the daemon, and with it
	// every veth; the restarted daemon gives the sandbox its network
	// back.
	killDaemon()
	waitFor(t, "the uplink veth gone with the crashed daemon", 10*time.Second, func() bool { return uplinkLinks(t) == 0 })
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	if f := fetch(t, sb, "GET", helloURL, ""); f.Status != 200 {
		t.Fatalf("GET after restart: %+v", f)
	}
	if got := routerLinks(t)[sb]; got != 1 {
		t.Fatalf("after restart, sandbox %s has %d veths, want 1", sb, got)
	}
	var info v1.Sandbox
	mustJSON(t, &info, "inspect", sb)
	addr := netip.MustParseAddr(info.Address)
	if rules, routes := routerMentions(t, addr); rules == 0 || routes == 0 {
		t.Fatalf("the router has %d rules and %d routes for %v, want some", rules, routes, addr)
	}
	must(t, "rm", sb)
	if got := routerLinks(t)[sb]; got != 0 {
		t.Fatalf("after rm, sandbox %s has %d veths, want 0", sb, got)
	}
	if rules, routes := routerMentions(t, addr); rules != 0 || routes != 0 {
		t.Fatalf("after rm, the router has %d rules and %d routes for %v, want none", rules, routes, addr)
	}
	// A clean stop removes the uplink too (a restart brings it back
	// with the next sandbox that needs it).
	stopDaemon()
	waitFor(t, "the uplink veth gone with the stopped daemon", 10*time.Second, func() bool { return uplinkLinks(t) == 0 })
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
}

// TestAdmissibleRollback: a rollback that would orphan an effect someone
// consumed, with nothing to compensate it, is refused (conflict) and
// listed, unless forced; --dry-run reports the plan and changes nothing.
func TestAdmissibleRollback(t *testing.T) {
	sb := newSandbox(t)
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
	c := client.New(env.socket)
	ctx := context.Background()
	charge, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://billing.example/charge", Status: 200, ResponseBody: []byte("ok")})
	if err != nil {
		t.Fatal(err)
	}
	// The recall goes nowhere (a closed port of the host's loopback): its
	// compensation fails, and the forced rollback says so.
	mail, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://mail.example/send", Status: 202,
		Compensator: &v1.Compensator{Method: "POST", URL: "http://127.0.0.1:1/recall"}})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing consumed yet: a dry run shows both orphaned, nothing blocks.
	var res v1.RollbackResult
	mustJSON(t, &res, "rollback", sb, ck, "--dry-run")
	if p := res.Plan; p == nil || !p.DryRun || len(p.Orphan) != 2 || len(p.Block) != 0 || len(p.Compensate) != 1 || p.Compensate[0] != mail.ID || len(p.Replay) != 2 {
		t.Fatalf("plan before any consumer: %+v", res.Plan)
	}
	must(t, "consume", charge.ID, "--by", "billing-agent", "--note", "invoiced")
	must(t, "consume", mail.ID, "--by", "crm")
	mustJSON(t, &res, "rollback", sb, ck, "--dry-run")
	if p := res.Plan; p == nil || len(p.Block) != 1 || p.Block[0].ID != charge.ID || len(p.Block[0].Consumers) != 1 || p.Block[0].Consumers[0] != "billing-agent" {
		t.Fatalf("plan with consumers: %+v", res.Plan)
	}
	human := must(t, "rollback", sb, ck, "--dry-run")
	if !strings.Contains(human, "dry run") || !strings.Contains(human, charge.ID+" POST https://billing.example/charge consumed by billing-agent") {
		t.Fatalf("dry run output:\n%s", human)
	}
	// The dry runs changed nothing; the rollback itself is refused.
	for _, e := range effects(t, sb) {
		if e.Orphan {
			t.Fatalf("a dry run orphaned %s", e.ID)
		}
	}
	r := molt(t, "rollback", sb, ck)
	if r.code == 0 || !strings.Contains(r.stderr, charge.ID) || !strings.Contains(r.stderr, "billing-agent") || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("rollback past a consumed effect: exit %d, %s", r.code, r.stderr)
	}
	if _, err := c.RollbackWith(ctx, sb, v1.RollbackRequest{Checkpoint: ck}); !errors.Is(err, v1.ErrConflict) {
		t.Fatalf("API: %v, want a conflict", err)
	}
	r = molt(t, "--json", "rollback", sb, ck, "--force")
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code == 0 {
		t.Fatalf("forced rollback with a failing compensator: exit %d (want non-zero), %v\n%s\n%s", r.code, err, r.stdout, r.stderr)
	}
	if res.Plan == nil || len(res.Plan.Block) != 1 || res.Compensation == nil || res.Compensation.State != v1.CompensationFailed ||
		len(res.Compensation.Failed) != 1 || res.Compensation.Failed[0].ID != mail.ID {
		t.Fatalf("forced rollback's plan %+v, compensation %+v", res.Plan, res.Compensation)
	}
	orphans := 0
	for _, e := range effects(t, sb) {
		if e.Orphan {
			orphans++
		}
	}
	if orphans != 2 {
		t.Fatalf("%d orphans after the forced rollback, want 2", orphans)
	}
	// Unknown effects and nameless consumers are refused.
	if r := molt(t, "consume", "ffffffffffffffff", "--by", "x"); r.code == 0 {
		t.Fatal("consuming an unknown effect worked")
	}
	if r := molt(t, "consume", charge.ID); r.code == 0 {
		t.Fatal("a consumer without a name was accepted")
	}
}
