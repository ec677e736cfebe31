package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/egress/netlab"
)

// Compensation: a rollback that orphans committed effects with
// compensators runs them, dependents first, against the lab's payment
// service (POST /refund, which applies a refund once per Idempotency-Key
// and remembers the order), every step in the ledger.

var refundURL = "http://" + netlab.PayName + "/refund"

// refundKey is the key the lab sees from effect id's compensator.
func refundKey(id string) string { return "molt-compensate-" + id }

// declare records a declared effect whose compensator refunds body.
func declare(t *testing.T, c *client.Client, sb, body string, deps []string) v1.Effect {
	t.Helper()
	e, err := c.DeclareEffect(context.Background(), sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://shop.example/" + body, Status: 200,
		Type: "payment", DependsOn: deps, Compensator: &v1.Compensator{Method: "POST", URL: refundURL, Body: []byte(body)}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// rollbackJSON rolls back with the CLI and decodes its result, whatever
// its exit code.
func rollbackJSON(t *testing.T, args ...string) (v1.RollbackResult, result) {
	t.Helper()
	r := molt(t, append([]string{"--json", "rollback"}, args...)...)
	var res v1.RollbackResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		b, _ := os.ReadFile(env.log)
		t.Fatalf("rollback %v: exit %d: %q %s: %v\ndaemon log:\n%s", args, r.code, r.stdout, r.stderr, err, tail(b, 6000))
	}
	return res, r
}

func compOf(l []v1.Effect, id string) *v1.Compensation {
	for _, e := range l {
		if e.ID == id {
			return e.Compensation
		}
	}
	return nil
}

// TestCompensationOrder: five effects, one of them proxied and given its
// compensator after the fact; d's compensator always fails, f's fails
// twice. Dependents are compensated first; d fails after 3 attempts, so
// c (d depends on it) and b (c depends on it) are not compensated, and
// the independent a, e and f are.
func TestCompensationOrder(t *testing.T) {
	sb := newEgressSandbox(t)
	tag := sb[:6]
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
	c := client.New(env.socket)
	// a: a payment through the proxy; its undo is learnt afterwards.
	f := fetch(t, sb, "POST", payURL, payBody(7))
	if f.Status != 200 || f.Ledger == "" {
		t.Fatalf("pay: %+v", f)
	}
	a := f.Ledger
	must(t, "compensator", a, "--http", "POST", refundURL, "--body", tag+"-a", "--header", "X-Reason: rollback")
	b := declare(t, c, sb, tag+"-b", []string{})
	cc := declare(t, c, sb, tag+"-c", []string{b.ID})
	d := declare(t, c, sb, tag+"-d", []string{cc.ID})
	e := declare(t, c, sb, tag+"-e", []string{a})
	ff := declare(t, c, sb, tag+"-f", []string{})
	env.lab.FailRefunds(tag+"-d", -1)
	env.lab.FailRefunds(tag+"-f", 2)

	start := time.Now()
	res, r := rollbackJSON(t, sb, ck)
	took := time.Since(start)
	if r.code == 0 {
		t.Fatalf("a rollback whose compensations failed exited 0:\n%s", r.stdout)
	}
	// The order the service saw: dependents first (f, e before a); d, c
	// and b never applied.
	var order []string
	for _, x := range env.lab.RefundOrder() {
		if strings.HasPrefix(x.Body, tag) {
			order = append(order, x.Body)
		}
	}
	if want := []string{tag + "-f", tag + "-e", tag + "-a"}; !slices.Equal(order, want) {
		t.Fatalf("refunds applied in order %v, want %v", order, want)
	}
	if n := env.lab.RefundsReceived(refundKey(d.ID)); n != 3 {
		t.Errorf("d's compensator was sent %d times, want 3 (the daemon's attempts)", n)
	}
	if n := env.lab.RefundsReceived(refundKey(ff.ID)); n != 3 {
		t.Errorf("f's compensator was sent %d times, want 3 (two failures, then applied)", n)
	}
	// Two backoffs of at least 50 and 100 ms for d, and as many for f.
	if took < 300*time.Millisecond {
		t.Errorf("the rollback took %v: the retries did not back off", took)
	}
	// The result.
	rep := res.Compensation
	if rep == nil || rep.State != v1.CompensationFailed {
		t.Fatalf("result's compensation: %+v", rep)
	}
	if want := []string{ff.ID, e.ID, a}; !slices.Equal(rep.Compensated, want) {
		t.Errorf("compensated %v, want %v", rep.Compensated, want)
	}
	failed := map[string]string{}
	for _, x := range rep.Failed {
		failed[x.ID] = x.Error
	}
	if len(failed) != 3 || !strings.Contains(failed[d.ID], "3 attempt(s)") || !strings.Contains(failed[d.ID], "503") ||
		failed[cc.ID] != "dependent "+d.ID+"'s compensation failed" || failed[b.ID] != "dependent "+cc.ID+"'s compensation failed" {
		t.Errorf("failed: %v", failed)
	}
	// The ledger.
	l := effects(t, sb)
	for id, want := range map[string]string{a: "compensated", e.ID: "compensated", ff.ID: "compensated", b.ID: "failed", cc.ID: "failed", d.ID: "failed"} {
		if got := compOf(l, id); got == nil || got.State != want {
			t.Errorf("effect %s's compensation: %+v, want %s", id, got, want)
		}
	}
	if got := compOf(l, ff.ID); got == nil || got.Attempts != 3 {
		t.Errorf("f: %+v, want compensated at the third attempt", got)
	}
	human := must(t, "effects", sb)
	if !strings.Contains(human, "compensation FAILED: dependent "+d.ID+"'s compensation failed") || !strings.Contains(human, "COMPENSATED") {
		t.Errorf("molt effects:\n%s", human)
	}
	// The sandbox.
	var info v1.Sandbox
	mustJSON(t, &info, "inspect", sb)
	if info.Compensation == nil || info.Compensation.State != v1.CompensationFailed || len(info.Compensation.Failed) != 3 || info.Compensation.Checkpoint != ck {
		t.Errorf("inspect: %+v", info.Compensation)
	}
	// A compensated payment is not answered from the ledger: paying
	// again is a new payment.
	before := env.lab.PayCount()
	if f := fetch(t, sb, "POST", payURL, payBody(7)); f.Status != 200 || f.Replayed != "" || env.lab.PayCount() != before+1 {
		t.Errorf("pay again after its refund: %+v (count %d -> %d)", f, before, env.lab.PayCount())
	}
}

// TestCompensationHelperSandbox: a compensator that is a command in a
// helper sandbox.
func TestCompensationHelperSandbox(t *testing.T) {
	helper := newSandbox(t)
	sb := newSandbox(t)
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
	c := client.New(env.socket)
	ok, err := c.DeclareEffect(context.Background(), sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://crm.example/lead", Status: 201,
		Compensator: &v1.Compensator{Sandbox: helper, Command: []string{"sh", "-c", `echo "$MOLT_EFFECT $MOLT_IDEMPOTENCY_KEY" >> /tmp/undone`}}})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := c.DeclareEffect(context.Background(), sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://crm.example/other", Status: 201,
		DependsOn: []string{}, Compensator: &v1.Compensator{Sandbox: helper, Command: []string{"sh", "-c", "echo nope >&2; exit 3"}}})
	if err != nil {
		t.Fatal(err)
	}
	res, r := rollbackJSON(t, sb, ck)
	if r.code == 0 || res.Compensation == nil || !slices.Equal(res.Compensation.Compensated, []string{ok.ID}) || len(res.Compensation.Failed) != 1 ||
		res.Compensation.Failed[0].ID != bad.ID || !strings.Contains(res.Compensation.Failed[0].Error, "exit status 3") || !strings.Contains(res.Compensation.Failed[0].Error, "nope") {
		b, _ := os.ReadFile(env.log)
		t.Fatalf("exit %d, compensation %+v\n%s", r.code, res.Compensation, tail(b, 3000))
	}
	if got := strings.TrimSpace(sh(t, helper, "cat /tmp/undone")); got != ok.ID+" molt-compensate-"+ok.ID {
		t.Fatalf("the helper ran %q", got)
	}
}

// TestCompensationAfterDaemonKill: the daemon is SIGKILLed while the
// service holds a compensating request it already applied; the restarted
// daemon sends it again with the same key, and the refund is applied
// once.
func TestCompensationAfterDaemonKill(t *testing.T) {
	sb := newEgressSandbox(t)
	tag := sb[:6]
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
	c := client.New(env.socket)
	e := declare(t, c, sb, tag+"-kill", nil)
	arrived, release := env.lab.HoldRefunds()
	defer release()
	done := make(chan result, 1)
	go func() { done <- molt(t, "rollback", sb, ck) }()
	select {
	case <-arrived:
	case r := <-done:
		t.Fatalf("the rollback ended before its compensation reached the service: %+v", r)
	case <-time.After(2 * time.Minute):
		t.Fatal("the compensation never reached the service")
	}
	killDaemon()
	if r := <-done; r.code == 0 {
		t.Fatalf("the rollback's client saw success from a killed daemon: %+v", r)
	}
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	var comp *v1.Compensation
	waitFor(t, "the resumed compensation", 60*time.Second, func() bool {
		comp = compOf(effects(t, sb), e.ID)
		return comp != nil && comp.State == "compensated"
	})
	key := refundKey(e.ID)
	if applied, received := env.lab.RefundsApplied(key), env.lab.RefundsReceived(key); applied != 1 || received != 2 {
		t.Fatalf("refund %s applied %d times (want 1), received %d times (want 2: the held one and the resumed one)", key, applied, received)
	}
	if comp.Attempts != 2 {
		t.Errorf("compensation %+v: want attempt 2 (the resumed one)", comp)
	}
	var info v1.Sandbox
	mustJSON(t, &info, "inspect", sb)
	if info.Compensation == nil || info.Compensation.State != v1.CompensationDone || !slices.Equal(info.Compensation.Compensated, []string{e.ID}) {
		t.Errorf("inspect after the resume: %+v", info.Compensation)
	}
}

// TestEffectPolicies: one case per policy.
func TestEffectPolicies(t *testing.T) {
	c := client.New(env.socket)
	ctx := context.Background()
	t.Run("refuse", func(t *testing.T) {
		sb := newEgressSandbox(t, "--effect-policy", "http=refuse")
		var info v1.Sandbox
		mustJSON(t, &info, "inspect", sb)
		if info.EffectPolicy["http"] != "refuse" {
			t.Fatalf("inspect: policy %v", info.EffectPolicy)
		}
		ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
		f := fetch(t, sb, "POST", payURL, payBody(1))
		if f.Status != 200 {
			t.Fatalf("pay: %+v", f)
		}
		res, _ := rollbackJSON(t, sb, ck, "--dry-run")
		if p := res.Plan; p == nil || len(p.Decisions) != 1 || p.Decisions[0].ID != f.Ledger || p.Decisions[0].Policy != "refuse" || p.Decisions[0].Action != "block" || len(p.Block) != 1 {
			t.Fatalf("dry run: %+v", res.Plan)
		}
		if _, err := c.RollbackWith(ctx, sb, v1.RollbackRequest{Checkpoint: ck}); !errors.Is(err, v1.ErrConflict) || !strings.Contains(err.Error(), f.Ledger) {
			t.Fatalf("rollback: %v, want a conflict naming %s", err, f.Ledger)
		}
		must(t, "rollback", sb, ck, "--force")
	})
	t.Run("compensate", func(t *testing.T) {
		sb := newEgressSandbox(t, "--effect-policy", "payment=compensate")
		tag := sb[:6]
		ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
		bare, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://shop.example/x", Type: "payment", Status: 200})
		if err != nil {
			t.Fatal(err)
		}
		r := molt(t, "rollback", sb, ck)
		if r.code == 0 || !strings.Contains(r.stderr, bare.ID) || !strings.Contains(r.stderr, "no compensator") {
			t.Fatalf("a payment without a compensator: exit %d %s", r.code, r.stderr)
		}
		must(t, "compensator", bare.ID, "--http", "POST", refundURL, "--body", tag+"-bare")
		res, r := rollbackJSON(t, sb, ck)
		if r.code != 0 || res.Compensation == nil || res.Compensation.State != v1.CompensationDone || env.lab.RefundsApplied(refundKey(bare.ID)) != 1 {
			t.Fatalf("exit %d %s, compensation %+v", r.code, r.stderr, res.Compensation)
		}
	})
	t.Run("allow", func(t *testing.T) {
		sb := newEgressSandbox(t, "--effect-policy", "*=allow")
		tag := sb[:6]
		ck := strings.TrimSpace(must(t, "checkpoint", sb, "--wait"))
		e := declare(t, c, sb, tag+"-allow", nil)
		must(t, "consume", e.ID, "--by", "ops")
		res, r := rollbackJSON(t, sb, ck)
		if r.code != 0 || res.Compensation != nil || res.Plan == nil || len(res.Plan.Block) != 0 || len(res.Plan.Decisions) != 1 || res.Plan.Decisions[0].Action != "orphan" {
			t.Fatalf("exit %d %s: %+v", r.code, r.stderr, res)
		}
		if n := env.lab.RefundsReceived(refundKey(e.ID)); n != 0 {
			t.Fatalf("an allowed effect was compensated (%d refunds)", n)
		}
		if l := effects(t, sb); !slices.ContainsFunc(l, func(x v1.Effect) bool { return x.ID == e.ID && x.Orphan }) {
			t.Fatalf("not an orphan: %+v", l)
		}
	})
	if r := molt(t, "create", image, "--effect-policy", "http=maybe"); r.code == 0 {
		t.Fatal(fmt.Sprint("a bad policy was accepted: ", r.stdout))
	}
}
