package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"io/fs"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
)

// The secrets of TestSecretHygiene: one passed by reference, one an
// agent exports in a session (and so sends in its next LLM request),
// one only in an effect's URL and response.
const (
	refSecret    = "tok-REFERENCE-5150x"
	exportSecret = "pw-EXPORTED-8642x"
	effectSecret = "eff-LEDGER-9753x"
)

// findSecrets returns the files under root that hold one of secrets, in
// their bytes or base64 (JSON's []byte), but the sandboxes' own files
// and memory images (whatever the agent holds): the pool's loop file,
// images, sandbox roots, checkpoints' filesystem snapshots and page
// images.
func findSecrets(t *testing.T, root string, secrets ...string) []string {
	t.Helper()
	var found []string
	pool := filepath.Join(root, "pool")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // files that come and go (temporary ones)
		}
		rel, _ := filepath.Rel(pool, p)
		if d.IsDir() && (rel == "images" || (strings.HasPrefix(rel, "sandboxes/") && d.Name() == "root") ||
			(strings.HasPrefix(rel, "checkpoints/") && (d.Name() == "fs" || d.Name() == "fs.next"))) {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() || p == filepath.Join(root, "pool.img") ||
			(strings.HasPrefix(d.Name(), "pages-") && strings.HasSuffix(d.Name(), ".img")) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) || holdsBase64(b, s) {
				found = append(found, p+": "+s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// holdsBase64 reports whether b holds s base64-encoded at any of the
// three alignments (the middle of each encoding, which does not depend
// on the bytes around s).
func holdsBase64(b []byte, s string) bool {
	for pad := 0; pad < 3; pad++ {
		enc := base64.StdEncoding.EncodeToString(append(bytes.Repeat([]byte{'x'}, pad), s...))
		mid := enc[4 : len(enc)-4]
		if len(mid) >= 8 && bytes.Contains(b, []byte(mid)) {
			return true
		}
	}
	return false
}

// TestSecretHygiene (issue 20, part 5): a secret passed by reference
// reaches the sandbox's processes but is shown by name only; an agent
// exports a password in a session, prints it, and sends it in its next
// LLM request; an effect carries a token. The turn log through the API,
// the effects, the audit export and every file molt writes (the metadata
// store, the ledger, the audit log) hold none of them in the clear, and
// molt recover's fast-forward still answers the agent with the exact
// output.
func TestSecretHygiene(t *testing.T) {
	requireCRIU(t)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(refSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sb := newSandbox(t, "--secret", "API_TOKEN=@"+file, "--env", "DB_USER=bob")

	// Inspect and list: names, never values.
	out := must(t, "--json", "inspect", sb)
	var sbj v1.Sandbox
	mustJSON(t, &sbj, "inspect", sb)
	if strings.Contains(out, refSecret) || strings.Contains(out, "bob") || strings.Join(sbj.Secrets, ",") != "API_TOKEN" ||
		strings.Join(sbj.EnvNames, ",") != "DB_USER" {
		t.Errorf("inspect shows %s", out)
	}
	if out := must(t, "--json", "ls"); strings.Contains(out, refSecret) || strings.Contains(out, "bob") {
		t.Errorf("ls shows %s", out)
	}
	if got := strings.TrimSpace(must(t, "exec", sb, "--aside", "--", "sh", "-c", "echo $API_TOKEN $DB_USER")); got != refSecret+" bob" {
		t.Fatalf("the sandbox's environment: %q", got)
	}

	llm := &scriptLLM{script: []string{
		"export DB_PASSWORD=" + exportSecret,
		"echo db $DB_PASSWORD api $API_TOKEN",
		"exec:echo done",
	}}
	srv := httptest.NewServer(llm)
	t.Cleanup(srv.Close)
	var ep struct {
		URL string `json:"url"`
	}
	mustJSON(t, &ep, "llm", sb, "--upstream", srv.URL+"/v1")
	c := client.New(env.socket)
	first := runAgent(t, c, ep.URL, sb, -1, -1, nil)
	if len(first) != 3 || !strings.Contains(first[1].out, exportSecret) || !strings.Contains(first[1].out, refSecret) {
		t.Fatalf("first run: %+v", first)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.DeclareEffect(ctx, sb, v1.EffectDeclareRequest{Method: "POST", URL: "https://api.example/v1/x?access_token=" + effectSecret,
		Status: 200, ResponseBody: []byte(`{"secret":"` + effectSecret + `"}`)}); err != nil {
		t.Fatal(err)
	}

	secrets := []string{refSecret, exportSecret, effectSecret}
	turns := must(t, "--json", "turns", sb)
	effects := must(t, "--json", "effects", sb)
	audit := must(t, "audit", "export")
	for _, s := range secrets {
		for what, text := range map[string]string{"turns": turns, "effects": effects, "audit export": audit} {
			if strings.Contains(text, s) || holdsBase64([]byte(text), s) {
				t.Errorf("molt %s shows %q", what, s)
			}
		}
	}
	if !strings.Contains(turns, "[REDACTED]") {
		t.Errorf("the turn log shows no redaction: %s", turns)
	}
	// Wait for the background stores (full checkpoints), then look at
	// every file.
	time.Sleep(2 * time.Second)
	if found := findSecrets(t, env.root, secrets...); len(found) > 0 {
		t.Errorf("files hold a secret in the clear:\n%s", strings.Join(found, "\n"))
	}

	// After a daemon restart the log reads as before (the values to
	// redact are found again) and the sandbox keeps its environment.
	stopDaemon()
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	if got := must(t, "--json", "turns", sb); got != turns {
		t.Errorf("the turn log changed across a restart:\n%s\nwas\n%s", got, turns)
	}
	// LLM endpoints end with the daemon that served them.
	mustJSON(t, &ep, "llm", sb, "--upstream", srv.URL+"/v1")

	// Recovery replays the exact output.
	var res v1.RecoverResult
	mustJSON(t, &res, "recover", sb)
	second := runAgent(t, c, ep.URL, sb, -1, -1, nil)
	replayed := 0
	for i, s := range second {
		if !s.replayed {
			continue
		}
		replayed++
		if i >= len(first) || s.out != first[i].out {
			t.Errorf("command %d replayed %q, the first run printed %q", i, s.out, first[min(i, len(first)-1)].out)
		}
	}
	if replayed < 2 || !second[1].replayed || !strings.Contains(second[1].out, exportSecret) {
		t.Errorf("recover %+v: replayed %d commands (%+v); want the export and the echo, exact", res, replayed, second)
	}

	// A fork of an fs checkpoint starts a fresh init: it gets the
	// secrets, sealed again for its own record.
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "fs", "--wait"))
	var fr v1.ForkResult
	mustJSON(t, &fr, "fork", ck)
	f := fr.Sandboxes[0]
	t.Cleanup(func() { molt(t, "rm", f.ID) })
	if got := strings.TrimSpace(must(t, "exec", f.ID, "--aside", "--", "sh", "-c", "echo $API_TOKEN")); got != refSecret || strings.Join(f.Secrets, ",") != "API_TOKEN" {
		t.Errorf("fork: API_TOKEN=%q, secrets %q", got, f.Secrets)
	}
	if found := findSecrets(t, env.root, secrets...); len(found) > 0 {
		t.Errorf("files hold a secret in the clear after the fork:\n%s", strings.Join(found, "\n"))
	}
}
