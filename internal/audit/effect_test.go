package audit

import (
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/egress/ledger"
)

// TestEffectEntryLeavesSecretsOut: an effect's entry names its URL's host
// and path, never the query, headers or bodies.
func TestEffectEntryLeavesSecretsOut(t *testing.T) {
	r := ledger.Record{ID: "e1", Sandbox: "sb", Kind: ledger.Effect, State: ledger.Completed,
		Request:  ledger.Identity{Proto: "https", Method: "POST", URL: "https://api.example/v1/charge?key=SECRET", Host: "api.example"},
		Response: &ledger.Response{Status: 200, Body: []byte("SECRET")}}
	e := EffectEntry(r)
	if e.Effect != "e1" || e.Sandbox != "sb" || e.EffectKind != "effect" || e.State != "completed" || e.Method != "POST" ||
		e.Host != "api.example" || e.URLPath != "/v1/charge" {
		t.Fatalf("%+v", e)
	}
	line, _, err := encode(Entry{Prev: ZeroHash, Kind: e.Kind, Effect: e.Effect, Host: e.Host, URLPath: e.URLPath})
	if err != nil || strings.Contains(string(line), "SECRET") {
		t.Fatalf("%s %v", line, err)
	}
}
