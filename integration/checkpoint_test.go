package integration

import (
	"encoding/json"
	"strings"
	"testing"
)

// manifestScript prints every entry under a directory with its type,
// mode, owner, content hash, link target and xattrs, as JSON.
const manifestScript = `
import hashlib, json, os, sys
root = sys.argv[1]
out = {}
for dp, dns, fns in os.walk(root):
    for n in dns + fns:
        p = os.path.join(dp, n)
        st = os.lstat(p)
        e = {"mode": st.st_mode, "uid": st.st_uid, "gid": st.st_gid}
        if os.path.islink(p):
            e["link"] = os.readlink(p)
        elif os.path.isfile(p):
            e["sha"] = hashlib.sha256(open(p, "rb").read()).hexdigest()
        if not os.path.islink(p):
            e["xattr"] = {k: os.getxattr(p, k).hex() for k in os.listxattr(p)}
        out[os.path.relpath(p, root)] = e
print(json.dumps(out, sort_keys=True))
`

func manifest(t *testing.T, sb string) map[string]any {
	t.Helper()
	out := must(t, "exec", sb, "--", "python3", "-c", manifestScript, "/work")
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("manifest: %v: %q", err, out)
	}
	return m
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

const populate = `set -e
mkdir -p /work/dir/sub /work/gone
echo one > /work/modified
echo keep > /work/dir/sub/deep
echo bye > /work/gone/file
echo moveme > /work/renamed-from
echo secret > /work/perm; chmod 0640 /work/perm; chown 1000:1000 /work/perm
ln -s modified /work/link
ln -s /etc/hostname /work/abslink
python3 -c "import os; os.setxattr('/work/modified', 'user.tag', b'v1')"
dd if=/dev/urandom of=/work/blob bs=1M count=4 status=none
`

const mutate = `set -e
echo two >> /work/modified
rm -rf /work/gone
mv /work/renamed-from /work/renamed-to
chmod 0777 /work/perm; chown 0:0 /work/perm
rm /work/link; ln -s dir /work/link
python3 -c "import os; os.setxattr('/work/modified', 'user.tag', b'v2'); os.setxattr('/work/dir', 'user.new', b'x')"
echo new > /work/created
dd if=/dev/urandom of=/work/blob bs=1M count=1 seek=2 conv=notrunc status=none
`

func TestCheckpointRollbackFiles(t *testing.T) {
	sb := newSandbox(t, "--name", "files")
	sh(t, sb, populate)
	before := manifest(t, sb)

	var ck struct {
		ID      string  `json:"id"`
		Kind    string  `json:"kind"`
		StallMS float64 `json:"stall_ms"`
	}
	mustJSON(t, &ck, "checkpoint", "files", "--kind", "fs", "--label", "populated")
	if ck.ID == "" || ck.Kind != "fs" {
		t.Fatalf("checkpoint: %+v", ck)
	}
	sh(t, sb, mutate)
	after := manifest(t, sb)
	if equalJSON(before, after) {
		t.Fatal("mutation changed nothing; the test would prove nothing")
	}
	// A second checkpoint of the mutated state, child of the first.
	second := strings.TrimSpace(must(t, "checkpoint", sb, "--label", "mutated"))

	var rb struct {
		Tier               string `json:"tier"`
		ProcessesRestarted bool   `json:"processes_restarted"`
	}
	mustJSON(t, &rb, "rollback", sb, "populated")
	if !rb.ProcessesRestarted || rb.Tier != "restart" {
		t.Fatalf("rollback of an fs checkpoint must say processes restarted: %+v", rb)
	}
	if got := manifest(t, sb); !equalJSON(got, before) {
		t.Fatalf("files after rollback differ from the checkpoint:\n got %v\nwant %v", got, before)
	}
	// Forward again to the later checkpoint: the tree keeps both.
	must(t, "rollback", sb, second)
	if got := manifest(t, sb); !equalJSON(got, after) {
		t.Fatalf("rollback to the later checkpoint:\n got %v\nwant %v", got, after)
	}
	var tree []struct {
		ID, Parent, Kind, Label string
	}
	mustJSON(t, &tree, "checkpoints", sb)
	if len(tree) != 2 || tree[0].ID != ck.ID || tree[1].Parent != ck.ID || tree[1].Label != "mutated" {
		t.Fatalf("tree: %+v", tree)
	}
	// Shell completion lists the sandbox's checkpoints, by ID and label,
	// for rollback's second argument, and sandboxes for its first.
	if got := must(t, "__complete", "rollback", sb, ""); !strings.Contains(got, ck.ID+"\t") || !strings.Contains(got, "mutated\t") {
		t.Fatalf("completion of rollback's checkpoint:\n%s", got)
	}
	if got := must(t, "__complete", "rollback", ""); !strings.Contains(got, sb+"\t") || strings.Contains(got, ck.ID) {
		t.Fatalf("completion of rollback's sandbox:\n%s", got)
	}
	human := must(t, "checkpoints", sb)
	if !strings.Contains(human, "└── "+second) || !strings.Contains(human, "<- head") {
		t.Fatalf("human tree:\n%s", human)
	}
	// Deleting a checkpoint removes it; rolling back to it then fails.
	must(t, "checkpoint", "rm", ck.ID)
	if r := molt(t, "rollback", sb, ck.ID); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("rollback to deleted checkpoint: exit %d %q", r.code, r.stderr)
	}
	mustJSON(t, &tree, "checkpoints", sb)
	if len(tree) != 1 || tree[0].Parent != "" {
		t.Fatalf("after delete, the child must move up to the root: %+v", tree)
	}
}

func TestForkIsolation(t *testing.T) {
	src := newSandbox(t)
	sh(t, src, "mkdir /work; echo base > /work/f")
	ck := strings.TrimSpace(must(t, "checkpoint", src))
	var res struct {
		Checkpoint string
		Sandboxes  []struct {
			ID, Hostname, State string
		}
	}
	mustJSON(t, &res, "fork", ck, "-n", "3")
	if res.Checkpoint != ck || len(res.Sandboxes) != 3 {
		t.Fatalf("fork: %+v", res)
	}
	ids := map[string]bool{src: true}
	hosts := map[string]bool{}
	machineIDs := map[string]bool{strings.TrimSpace(sh(t, src, "cat /etc/machine-id")): true}
	for i, f := range res.Sandboxes {
		t.Cleanup(func() { molt(t, "rm", f.ID) })
		if ids[f.ID] || f.State != "running" {
			t.Fatalf("fork %d: %+v", i, f)
		}
		ids[f.ID] = true
		h := strings.TrimSpace(sh(t, f.ID, "hostname"))
		mid := strings.TrimSpace(sh(t, f.ID, "cat /etc/machine-id"))
		if h != f.Hostname || hosts[h] || machineIDs[mid] || len(mid) != 32 {
			t.Fatalf("fork %d identity: hostname %q (reported %q) machine-id %q not unique", i, h, f.Hostname, mid)
		}
		hosts[h], machineIDs[mid] = true, true
		if got := sh(t, f.ID, "cat /work/f"); got != "base\n" {
			t.Fatalf("fork %d sees %q", i, got)
		}
		sh(t, f.ID, "echo fork"+string(rune('0'+i))+" > /work/f; touch /work/only-"+string(rune('0'+i)))
	}
	for i, f := range res.Sandboxes {
		want := "fork" + string(rune('0'+i)) + "\n"
		if got := sh(t, f.ID, "cat /work/f; ls /work | grep -c only-"); got != want+"1\n" {
			t.Fatalf("fork %d not isolated: %q", i, got)
		}
	}
	if got := sh(t, src, "cat /work/f; ls /work"); got != "base\nf\n" {
		t.Fatalf("source changed by its forks: %q", got)
	}
	// Forking a sandbox (not a checkpoint) checkpoints it first.
	mustJSON(t, &res, "fork", src)
	t.Cleanup(func() { molt(t, "rm", res.Sandboxes[0].ID) })
	if got := sh(t, res.Sandboxes[0].ID, "cat /work/f"); got != "base\n" {
		t.Fatalf("fork of sandbox: %q", got)
	}
}
