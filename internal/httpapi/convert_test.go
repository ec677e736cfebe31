package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/testutil"
)

// TestConvertCoversEveryField fills every field of a domain value, each
// with a value of its own, converts it to the wire type and checks every
// field of the wire value, at every depth: it must be set, from the
// domain field of the same name (a wire field with no such field has no
// mapping and fails here, as does one the conversion forgot or swapped).
// The conversions go one way (the engine never takes these types from the
// wire), so there is no round trip to check.
func TestConvertCoversEveryField(t *testing.T) {
	cases := []struct {
		name    string
		domain  any
		convert func(any) any
	}{
		{"Image", meta.Image{}, func(v any) any { return toImage(v.(meta.Image)) }},
		{"Sandbox", meta.Sandbox{}, func(v any) any { return toSandbox(v.(meta.Sandbox)) }},
		{"Checkpoint", meta.Checkpoint{}, func(v any) any { return toCheckpoint(v.(meta.Checkpoint)) }},
		{"TurnResult", meta.TurnResult{}, func(v any) any { return toTurnResult(v.(meta.TurnResult)) }},
		{"TurnRecord", meta.TurnRecord{}, func(v any) any { return toTurnRecord(v.(meta.TurnRecord)) }},
		{"Host", meta.Host{}, func(v any) any { return toHost(v.(meta.Host)) }},
		{"SessionRunResult", meta.SessionRunResult{}, func(v any) any { return toSessionRunResult(v.(meta.SessionRunResult)) }},
		{"RollbackResult", meta.RollbackResult{}, func(v any) any { return toRollbackResult(v.(meta.RollbackResult)) }},
		{"ChainVerification", meta.ChainVerification{}, func(v any) any { return toChainVerification(v.(meta.ChainVerification)) }},
		{"MigrateResult", meta.Migration{}, func(v any) any { return toMigrateResult(v.(meta.Migration)) }},
		{"RecoverResult", meta.RecoverResult{}, func(v any) any { return toRecoverResult(v.(meta.RecoverResult)) }},
		{"RecoveryStatus", meta.RecoveryStatus{}, func(v any) any { return toRecoveryStatus(v.(meta.RecoveryStatus)) }},
		{"ForkResult", meta.ForkResult{}, func(v any) any { return toForkResult(v.(meta.ForkResult)) }},
	}
	for _, c := range cases {
		d := reflect.New(reflect.TypeOf(c.domain)).Elem()
		n := 0
		testutil.Fill(d, c.name, &n)
		w := reflect.ValueOf(c.convert(d.Interface()))
		for _, p := range mismatches(d, w, c.name) {
			t.Errorf("%s", p)
		}
	}
}

// derived are wire fields made from differently shaped domain fields,
// or by the handler (a migration's LLM endpoint, which the engine does
// not own); each has a test of its own (TestConvertEgress,
// TestMigrateBetweenDaemons).
var derived = map[reflect.Type]map[string]bool{
	reflect.TypeOf(v1.Sandbox{}):       {"Address": true, "Egress": true, "EnvNames": true},
	reflect.TypeOf(v1.MigrateResult{}): {"LLMEndpoint": true, "Note": true},
}

// TestConvertEnvNamesOnly: a sandbox's environment reaches the wire as
// names, never values, and its secrets as names.
func TestConvertEnvNamesOnly(t *testing.T) {
	sb := meta.Sandbox{Env: map[string]string{"B_TOKEN": "tok-value-1", "A": "plain-value-2"}, Secrets: []string{"DB_PASSWORD"}}
	w := toSandbox(sb)
	if !reflect.DeepEqual(w.EnvNames, []string{"A", "B_TOKEN"}) || !reflect.DeepEqual(w.Secrets, []string{"DB_PASSWORD"}) {
		t.Errorf("env names %q secrets %q", w.EnvNames, w.Secrets)
	}
	b, _ := json.Marshal(w)
	if bytes.Contains(b, []byte("tok-value-1")) || bytes.Contains(b, []byte("plain-value-2")) {
		t.Errorf("an env value is on the wire: %s", b)
	}
}

// TestConvertEgress: a sandbox's egress (an address and a policy in the
// record) reaches the wire whole.
func TestConvertEgress(t *testing.T) {
	var sb meta.Sandbox
	n := 0
	testutil.Fill(reflect.ValueOf(&sb).Elem(), "Sandbox", &n)
	w := toSandbox(sb)
	p := sb.Egress.Policy
	if w.Address != sb.Egress.Addr.String() || w.Egress == nil {
		t.Fatalf("address %q egress %+v", w.Address, w.Egress)
	}
	e := *w.Egress
	if !reflect.DeepEqual(e.AllowDomains, p.AllowDomains) || !reflect.DeepEqual(e.DenyDomains, p.DenyDomains) ||
		len(e.AllowCIDRs) != 2 || e.AllowCIDRs[1] != p.AllowCIDRs[1].String() || len(e.DenyCIDRs) != 2 || e.DenyCIDRs[0] != p.DenyCIDRs[0].String() ||
		!reflect.DeepEqual(e.HTTPPorts, p.HTTPPorts) || !e.Inspect || e.OnDivergence != string(p.Divergence) ||
		!reflect.DeepEqual(e.IgnoreHeaders, p.IgnoreHeaders) || !reflect.DeepEqual(e.IgnoreJSONFields, p.IgnoreJSONFields) {
		t.Errorf("egress policy %+v, from %+v", e, p)
	}
	// The CA's key never leaves the daemon.
	if b, _ := json.Marshal(w); bytes.Contains(b, []byte(sb.Egress.CAKey)) {
		t.Error("the sandbox's CA key is on the wire")
	}
	if toSandbox(meta.Sandbox{}).Egress != nil || toSandbox(meta.Sandbox{}).Address != "" {
		t.Error("a sandbox without egress reports some")
	}
}

// TestConvertKeepsNil: an empty list stays null on the wire, as the
// engine's value was before the conversion existed.
func TestConvertKeepsNil(t *testing.T) {
	if toSandboxes(nil) != nil || toSandbox(meta.Sandbox{}).Sessions != nil {
		t.Error("nil list converted to an empty one")
	}
	if l := toSandboxes([]meta.Sandbox{}); l == nil || len(l) != 0 {
		t.Errorf("empty list converted to %#v", l)
	}
}

// TestCoverageCheckFails: the check above sees a field left unmapped.
func TestCoverageCheckFails(t *testing.T) {
	var sb meta.Sandbox
	n := 0
	testutil.Fill(reflect.ValueOf(&sb).Elem(), "Sandbox", &n)
	w := toSandbox(sb)
	w.ForkedFrom = ""
	w.Resources.DiskBytes = 0
	if p := mismatches(reflect.ValueOf(sb), reflect.ValueOf(w), "Sandbox"); len(p) != 2 {
		t.Errorf("two fields dropped, check found %q", p)
	}
}

// mismatches walks the wire value w against the domain value d.
func mismatches(d, w reflect.Value, path string) []string {
	if w.Type() == reflect.TypeOf(time.Time{}) {
		if d.Type() != w.Type() || !d.Interface().(time.Time).Equal(w.Interface().(time.Time)) || w.IsZero() {
			return []string{fmt.Sprintf("%s: %v, want %v", path, w, d)}
		}
		return nil
	}
	if w.Kind() != d.Kind() {
		return []string{fmt.Sprintf("%s: wire %s, domain %s", path, w.Kind(), d.Kind())}
	}
	switch w.Kind() {
	case reflect.Struct:
		var out []string
		for i := 0; i < w.NumField(); i++ {
			f := w.Type().Field(i)
			if derived[w.Type()][f.Name] {
				continue
			}
			df := d.FieldByName(f.Name)
			if !df.IsValid() {
				out = append(out, fmt.Sprintf("%s.%s: no domain field of that name", path, f.Name))
				continue
			}
			out = append(out, mismatches(df, w.Field(i), path+"."+f.Name)...)
		}
		return out
	case reflect.Pointer:
		if w.IsNil() || d.IsNil() {
			return []string{fmt.Sprintf("%s: nil", path)}
		}
		return mismatches(d.Elem(), w.Elem(), path)
	case reflect.Slice:
		if w.Len() == 0 || w.Len() != d.Len() {
			return []string{fmt.Sprintf("%s: %d elements, want %d", path, w.Len(), d.Len())}
		}
		var out []string
		for i := 0; i < w.Len(); i++ {
			out = append(out, mismatches(d.Index(i), w.Index(i), fmt.Sprintf("%s[%d]", path, i))...)
		}
		return out
	case reflect.Map:
		if w.Len() == 0 || !reflect.DeepEqual(w.Interface(), d.Interface()) {
			return []string{fmt.Sprintf("%s: %v, want %v", path, w, d)}
		}
		return nil
	default:
		if w.IsZero() || !reflect.DeepEqual(w.Interface(), d.Interface()) {
			return []string{fmt.Sprintf("%s: %v, want %v", path, w, d)}
		}
		return nil
	}
}

// TestConvertEffect: a ledger record reaches the wire whole (the wire
// flattens its request and response).
func TestConvertEffect(t *testing.T) {
	var r ledger.Record
	n := 0
	testutil.Fill(reflect.ValueOf(&r).Elem(), "R", &n)
	e := toEffect(r, true)
	checks := []struct {
		name      string
		got, want any
	}{
		{"ID", e.ID, r.ID}, {"Seq", e.Seq, r.Seq}, {"Prev", e.Prev, r.Prev}, {"Sandbox", e.Sandbox, r.Sandbox},
		{"Origin", e.Origin, r.Origin}, {"Turn", e.Turn, r.Turn}, {"Checkpoint", e.Checkpoint, r.Checkpoint},
		{"Kind", e.Kind, string(r.Kind)}, {"State", e.State, string(r.State)}, {"Proto", e.Proto, r.Request.Proto},
		{"Method", e.Method, r.Request.Method}, {"URL", e.URL, r.Request.URL}, {"Host", e.Host, r.Request.Host},
		{"Addr", e.Addr, r.Request.Addr}, {"BodyHash", e.BodyHash, r.Request.BodyHash},
		{"IdempotencyKey", e.IdempotencyKey, r.Request.IdempotencyKey}, {"Status", e.Status, r.Response.Status},
		{"ResponseBytes", e.ResponseBytes, r.Response.BodySize}, {"BytesOut", e.BytesOut, r.Response.BytesOut},
		{"BytesIn", e.BytesIn, r.Response.BytesIn}, {"Error", e.Error, r.Error}, {"ReplayOf", e.ReplayOf, r.ReplayOf},
		{"Orphan", e.Orphan, true}, {"Declared", e.Declared, r.Declared}, {"Started", e.Started, r.Started},
		{"Finished", e.Finished, r.Finished}, {"Compensator.URL", e.Compensator.URL, r.Compensator.URL},
		{"Answers", e.Answers, r.Response.Answers}, {"ResponseBody", e.ResponseBody, r.Response.Body},
		{"ResponseHeader", e.ResponseHeader, r.Response.Header}, {"Type", e.Type, r.Type},
		{"DependsOn", e.DependsOn, *r.DependsOn}, {"Compensator.Command", e.Compensator.Command, r.Compensator.Command},
		{"Compensator.Sandbox", e.Compensator.Sandbox, r.Compensator.Sandbox},
		{"Compensation.State", e.Compensation.State, string(r.Compensation.State)},
		{"Compensation.Error", e.Compensation.Error, r.Compensation.Error}, {"Compensation.Attempts", e.Compensation.Attempts, r.Compensation.Attempts},
		{"Compensation.Rollback", e.Compensation.Rollback, r.Compensation.Rollback}, {"Compensation.At", e.Compensation.At, r.Compensation.At},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) || reflect.ValueOf(c.got).IsZero() {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}
