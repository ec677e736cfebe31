package ledger

import (
	"slices"
	"testing"
)

// TestPolicyTable: what each policy decides for each kind of effect,
// with and without a compensator and consumers.
func TestPolicyTable(t *testing.T) {
	comp := &Compensator{Method: "POST", URL: "http://pay/refund"}
	used := []Consumer{{By: "sb2"}}
	httpFx := Record{Kind: Effect, State: Completed, Request: Identity{Proto: "http", Method: "POST"}}
	opaque := Record{Kind: Opaque, State: Completed, Request: Identity{Proto: "tls"}}
	payment := Record{Kind: Effect, State: Completed, Declared: true, Type: "payment", Request: Identity{Proto: "declared"}}
	with := func(r Record, c *Compensator, cs []Consumer) Record { r.Compensator, r.Consumers = c, cs; return r }
	for _, c := range []struct {
		name   string
		policy map[string]string
		r      Record
		kind   string
		action string
	}{
		// The default: today's behaviour.
		{"default, compensator", nil, with(httpFx, comp, nil), "", ActCompensate},
		{"default, consumed", nil, with(httpFx, nil, used), "", ActBlock},
		{"default, consumed with a compensator", nil, with(httpFx, comp, used), "", ActCompensate},
		{"default, plain", nil, httpFx, "", ActOrphan},
		// refuse
		{"refuse http", map[string]string{"http": "refuse"}, httpFx, "http", ActBlock},
		{"refuse http, compensator", map[string]string{"http": "refuse"}, with(httpFx, comp, nil), "http", ActBlock},
		{"refuse http, not opaque", map[string]string{"http": "refuse"}, opaque, "", ActOrphan},
		{"refuse *", map[string]string{"*": "refuse"}, opaque, "*", ActBlock},
		// compensate
		{"compensate, compensator", map[string]string{"declared": "compensate"}, with(payment, comp, nil), "declared", ActCompensate},
		{"compensate, none", map[string]string{"declared": "compensate"}, payment, "declared", ActBlock},
		// allow
		{"allow, consumed", map[string]string{"http": "allow"}, with(httpFx, nil, used), "http", ActOrphan},
		{"allow, compensator", map[string]string{"*": "allow"}, with(httpFx, comp, nil), "*", ActOrphan},
		// The most specific kind wins.
		{"type over declared", map[string]string{"payment": "refuse", "declared": "allow"}, payment, "payment", ActBlock},
		{"declared over *", map[string]string{"*": "refuse", "declared": "allow"}, payment, "declared", ActOrphan},
		{"type over *", map[string]string{"*": "allow", "payment": "compensate"}, payment, "payment", ActBlock},
	} {
		d := Decide(c.policy, c.r)
		if d.Kind != c.kind || d.Action != c.action || (d.Action == ActBlock) != (d.Reason != "") {
			t.Errorf("%s: %+v, want kind %q action %s", c.name, d, c.kind, c.action)
		}
	}
	if k := Kinds(payment); !slices.Equal(k, []string{"payment", "declared", "*"}) {
		t.Errorf("kinds of a payment: %v", k)
	}
	for _, bad := range []map[string]string{{"http": "maybe"}, {"": "allow"}, {"Http": "allow"}, {"h*": "allow"}} {
		if CheckPolicy(bad) == nil {
			t.Errorf("policy %v accepted", bad)
		}
	}
	if err := CheckPolicy(map[string]string{"http": "refuse", "*": "allow", "payment.v2": "compensate"}); err != nil {
		t.Error(err)
	}
}
