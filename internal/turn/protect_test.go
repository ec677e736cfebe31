package turn

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/secret"
)

const (
	dbSecret = "hunter2-d4tabase"
	apiKey   = "sk-abcdefghijklmnopqrstuvwx"
	plainOut = "an-ordinary-output-line"
)

// sealedTracker returns a tracker whose vault seals with ring, and the
// path of its database file.
func sealedTracker(t *testing.T, ring *keys.Ring) (*Tracker, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "molt.db")
	db, err := meta.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	tr := New(Config{DB: db})
	t.Cleanup(tr.Close)
	red, _ := secret.NewRedactor(nil)
	tr.SetVault(secret.NewVault(ring, red, func(string) (string, error) { return "acme", nil }, nil))
	return tr, path
}

// recordSecretTurn logs a turn that exports a secret in a session and
// prints it, and an LLM call carrying it and an API key.
func recordSecretTurn(t *testing.T, tr *Tracker) {
	t.Helper()
	tr.m["s"] = &state{}
	tr.Record("s", meta.TurnCommand{Session: "main", Command: "export DB_PASSWORD=" + dbSecret})
	tr.Record("s", meta.TurnCommand{Session: "main", Command: "echo $DB_PASSWORD; echo " + plainOut, Stdout: dbSecret + "\n" + plainOut + "\n"})
	tr.record(meta.TurnRecord{TurnResult: meta.TurnResult{Sandbox: "s", Turn: 1, Decision: v1.DecisionNone}, Commands: tr.m["s"].commands})
	if err := tr.RecordLLM("s", 1, meta.LLMCall{ID: 1, Request: `{"messages":[{"content":"the password is ` + dbSecret + `"}]}`,
		Response: `{"content":"use ` + apiKey + `"}`}); err != nil {
		t.Fatal(err)
	}
}

func dbHolds(t *testing.T, path, s string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(b, []byte(s))
}

// logText is everything the log shows of its commands and LLM calls.
func logText(l []meta.TurnRecord) string {
	var b strings.Builder
	for _, r := range l {
		for _, c := range r.Commands {
			b.WriteString(c.Command + strings.Join(c.Args, " ") + c.Stdout + c.Stderr)
		}
		for _, c := range r.LLM {
			b.WriteString(c.Request + c.Response)
		}
	}
	return b.String()
}

// TestTurnLogRedacted: a secret exported in a session is redacted from
// the command, from a later output and from an LLM request; API keys
// from the reply. The database file holds none of them in the clear,
// Log shows the redacted text and ExactLog (what a recovery replays) the
// exact one.
func TestTurnLogRedacted(t *testing.T) {
	ring, err := keys.OpenRing(filepath.Join(t.TempDir(), "keys"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, path := sealedTracker(t, ring)
	recordSecretTurn(t, tr)
	for _, s := range []string{dbSecret, apiKey} {
		if dbHolds(t, path, s) {
			t.Errorf("the database file holds %q", s)
		}
	}
	shown, err := tr.Log("s")
	if err != nil {
		t.Fatal(err)
	}
	txt := logText(shown)
	if strings.Contains(txt, dbSecret) || strings.Contains(txt, apiKey) || !strings.Contains(txt, secret.Mark) || !strings.Contains(txt, plainOut) {
		t.Errorf("the log shows %q", txt)
	}
	exact, err := tr.ExactLog("s")
	if err != nil {
		t.Fatal(err)
	}
	c := exact[0].Commands
	if len(c) != 2 || c[1].Stdout != dbSecret+"\n"+plainOut+"\n" || c[0].Command != "export DB_PASSWORD="+dbSecret ||
		!strings.Contains(exact[0].LLM[0].Request, dbSecret) || !strings.Contains(exact[0].LLM[0].Response, apiKey) {
		t.Errorf("exact log %+v", exact[0])
	}
}

// TestTurnLogEncryptedAtRest: with encryption at rest every output and
// LLM body is sealed (an ordinary output is not in the database file
// either); after the tenant's key is shredded the log is an error saying
// so.
func TestTurnLogEncryptedAtRest(t *testing.T) {
	kek, _ := keys.NewKEK(bytes.Repeat([]byte{9}, 32))
	ring, err := keys.OpenRing(filepath.Join(t.TempDir(), "keys"), kek, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, path := sealedTracker(t, ring)
	recordSecretTurn(t, tr)
	if dbHolds(t, path, plainOut) || dbHolds(t, path, "the password is") {
		t.Error("the database file holds an output or a request in the clear")
	}
	shown, err := tr.Log("s")
	if err != nil || !strings.Contains(logText(shown), plainOut) || strings.Contains(logText(shown), dbSecret) {
		t.Fatalf("log %q: %v", logText(shown), err)
	}
	if _, err := ring.Shred("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Log("s"); !errors.Is(err, keys.ErrShredded) {
		t.Errorf("log after shredding: %v", err)
	}
	if _, err := tr.ExactLog("s"); !errors.Is(err, keys.ErrShredded) {
		t.Errorf("exact log after shredding: %v", err)
	}
}
