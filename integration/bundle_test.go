package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

// A full checkpoint exported through the CLI and imported back forks
// with its files, session and running process; a bundle cut short or
// with a byte flipped in it is refused with the reason, leaving nothing
// listed.
func TestCheckpointExportImport(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", sb, "--session", "s", "--", "export X=7; echo bundled > /root/f")
	must(t, "exec", sb, "-d", "--", "sh", "-c", "echo $$ > /tmp/pid; exec sleep 100000")
	for sh(t, sb, "test -s /tmp/pid && echo y") != "y\n" {
	}
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	file := filepath.Join(t.TempDir(), "ck.molt")
	if r := molt(t, "checkpoint", "export", ck, "-o", file); r.code != 0 || !strings.Contains(r.stderr, "checkpoint export "+ck+": receiving the bundle") {
		t.Fatalf("export: exit %d, stderr %q", r.code, r.stderr)
	}

	whole, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := file + ".bad"
	flipped := append([]byte(nil), whole...)
	flipped[len(flipped)/2] ^= 1
	cut := file + ".cut"
	for name, b := range map[string][]byte{bad: flipped, cut: whole[:len(whole)-4096]} {
		if err := os.WriteFile(name, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if r := molt(t, "checkpoint", "import", name); r.code == 0 || !strings.Contains(r.stderr, "bundle refused") {
			t.Fatalf("import of %s: exit %d, %s", filepath.Base(name), r.code, r.stderr)
		}
	}

	var res v1.CheckpointImport
	r := molt(t, "--json", "checkpoint", "import", file)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
		t.Fatalf("import: exit %d, %s%s", r.code, r.stdout, r.stderr)
	}
	// Its stages on stderr as it goes (plain lines: no terminal here).
	for _, stage := range []string{"checkpoint import: reading and verifying the bundle", "validating the CRIU images", "storing the checkpoint"} {
		if !strings.Contains(r.stderr, stage) {
			t.Errorf("import's progress lacks %q: %s", stage, r.stderr)
		}
	}
	if res.Checkpoint.ImportedFrom != ck || res.Checkpoint.Kind != v1.KindFull || res.Objects == 0 {
		t.Fatalf("import: %+v", res)
	}
	var fr v1.ForkResult
	mustJSON(t, &fr, "fork", res.Checkpoint.ID)
	f := fr.Sandboxes[0].ID
	t.Cleanup(func() { molt(t, "rm", f) })
	out := must(t, "exec", f, "--session", "s", "--", `echo $X; cat /root/f; kill -0 "$(cat /tmp/pid)" && echo alive`)
	if out != "7\nbundled\nalive\n" {
		t.Fatalf("fork of the imported checkpoint: %q", out)
	}
	var info v1.Checkpoint
	r = molt(t, "--json", "checkpoint", "inspect", res.Checkpoint.ID)
	if err := json.Unmarshal([]byte(r.stdout), &info); err != nil || info.ImportSigner == "" {
		t.Fatalf("inspect: %v %+v", err, info)
	}
}
