package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

func chainOf(t *testing.T, ck string) (v1.ChainVerification, result) {
	t.Helper()
	r := molt(t, "--json", "checkpoint", "verify", "--chain", ck)
	var res v1.ChainVerification
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("verify --chain %s: %v (exit %d, %s)", ck, err, r.code, r.stderr)
	}
	return res, r
}

// A sandbox's lineage is a signed hash chain: it verifies whole, still
// after a checkpoint in the middle is deleted (the child is signed again
// with its new parent), and a manifest edited on disk breaks it: the
// link is named, the rollback to it refused, until the manifest is put
// back.
func TestSignedChain(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	sh(t, sb, "echo 1 > /root/f")
	a := strings.TrimSpace(must(t, "checkpoint", sb))
	sh(t, sb, "echo 2 > /root/f")
	b := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	sh(t, sb, "echo 3 > /root/f")
	c := strings.TrimSpace(must(t, "checkpoint", sb))
	sh(t, sb, "echo 4 > /root/f")
	d := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))

	res, r := chainOf(t, d)
	if r.code != 0 || !res.OK || len(res.Links) < 4 || res.Links[0].ID != d || res.Links[0].Key != res.Key {
		t.Fatalf("chain of %s: exit %d, %+v", d, r.code, res)
	}
	must(t, "checkpoint", "rm", c)
	if res, r = chainOf(t, d); r.code != 0 || !res.OK || res.Links[1].ID != b {
		t.Fatalf("after deleting %s: exit %d, %+v", c, r.code, res)
	}

	mfPath := filepath.Join(env.root, "pool", "checkpoints", b, "manifest.json")
	orig, err := os.ReadFile(mfPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := strings.Replace(string(orig), `"image": "`+image+`"`, `"image": "elsewhere"`, 1)
	if edited == string(orig) {
		t.Fatalf("manifest of %s has no image field to edit:\n%s", b, orig)
	}
	if err := os.WriteFile(mfPath, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	res, r = chainOf(t, d)
	if r.code == 0 || res.OK || res.Links[1].ID != b || !strings.Contains(res.Links[1].Problem, "does not verify") {
		t.Fatalf("edited %s: exit %d, %+v", b, r.code, res)
	}
	if rb := molt(t, "rollback", sb, b, "--tier", "warm"); rb.code == 0 || !strings.Contains(rb.stderr, "signature") {
		t.Fatalf("rollback to the edited checkpoint: exit %d, %s", rb.code, rb.stderr)
	}
	if err := os.WriteFile(mfPath, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	must(t, "rollback", sb, b, "--tier", "warm")
	if got := sh(t, sb, "cat /root/f"); got != "2\n" {
		t.Fatalf("after the rollback /root/f = %q", got)
	}
	if res, _ := chainOf(t, a); !res.OK || len(res.Links) != 1 {
		t.Fatalf("chain of the root %s: %+v", a, res)
	}
}
