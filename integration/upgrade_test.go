package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// goInitCommit is the last commit whose sandboxes ran the molt binary
// itself as their init (a Go program, reached on @molt-init); from the
// next one on, PID 1 is pid1. Sandboxes and full checkpoints made by such
// a build must keep working under this one.
const goInitCommit = "a1cad48"

// buildAt builds cmd/molt as of commit into dir. Without the commit in
// the repository's history (a shallow clone, a source tarball) the test
// is skipped: there is nothing to build the old daemon from.
func buildAt(t *testing.T, commit, dir string) string {
	t.Helper()
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout (%v): cannot build molt as of %s", err, commit)
	}
	repo := strings.TrimSpace(string(top))
	if err := exec.Command("git", "-C", repo, "cat-file", "-e", commit+"^{commit}").Run(); err != nil {
		t.Skipf("commit %s is not in this clone's history: cannot build the old molt", commit)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("git", "-C", repo, "archive", commit)
	untar := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	untar.Stdin = pipe
	var errb bytes.Buffer
	archive.Stderr, untar.Stderr = &errb, &errb
	if err := untar.Start(); err != nil {
		t.Fatal(err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v: %s", commit, err, errb.String())
	}
	if err := untar.Wait(); err != nil {
		t.Fatalf("untar %s: %v: %s", commit, err, errb.String())
	}
	bin := filepath.Join(dir, "molt-"+commit)
	build := exec.Command("go", "build", "-o", bin, "./cmd/molt")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build molt as of %s: %v\n%s", commit, err, tail(out, 4000))
	}
	return bin
}

// TestUpgradeFromGoInit: a daemon of the Go-init era makes a sandbox (a
// session, a counting process) and a full checkpoint of it; this build's
// daemon, started on the same root after it stops, serves the running
// sandbox (exec, the session as it is now) and rolls it back and forks
// it from the old checkpoint, whose images hold the Go init.
func TestUpgradeFromGoInit(t *testing.T) {
	requireCRIU(t)
	tmp := t.TempDir()
	old := buildAt(t, goInitCommit, tmp)

	saved := env
	defer func() { env = saved }()
	env.bin, env.root = old, filepath.Join(tmp, "root")
	env.socket, env.log, env.daemon = filepath.Join(tmp, "old.sock"), filepath.Join(tmp, "old.log"), nil
	env.lab = nil // the old build has no egress flags
	newSock, newLog := filepath.Join(tmp, "new.sock"), filepath.Join(tmp, "new.log")
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	// Whatever happens, this build's daemon removes the sandboxes and
	// unmounts the root's pool at the end.
	defer func() {
		if env.daemon == nil || env.bin != saved.bin {
			stopDaemon()
			env.bin, env.socket, env.log = saved.bin, newSock, newLog
			if err := startDaemon(); err != nil {
				t.Errorf("daemon for the teardown: %v", err)
				return
			}
		}
		if err := teardown(); err != nil {
			t.Errorf("teardown of the upgrade root: %v", err)
		}
	}()
	must(t, "image", "build", image)
	sb := strings.TrimSpace(must(t, "create", image))
	ck, pid, count := fullScenario(t, sb)
	stopDaemon()

	env.bin, env.socket, env.log = saved.bin, newSock, newLog
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	// The running sandbox, still under its Go init, as fullScenario left it.
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X; pwd"); got != "99\n/\n" {
		t.Fatalf("session of the old sandbox under the new daemon: %q, want X=99 and cwd /", got)
	}
	if got := sh(t, sb, "ls /work"); got != "g\n" {
		t.Fatalf("files of the old sandbox: %q", got)
	}
	// Rolled back to the old checkpoint: the Go init and the counter come
	// back from its images.
	start := time.Now()
	var rb struct {
		Tier string `json:"tier"`
	}
	mustJSON(t, &rb, "rollback", sb, ck)
	if rb.Tier != "warm" {
		t.Fatalf("rollback to the old checkpoint: tier %q, want warm (no standby survives a daemon change)", rb.Tier)
	}
	checkRestored(t, sb, pid, count, start)
	// And forked from it.
	var fk struct {
		Sandboxes []struct{ ID string } `json:"sandboxes"`
	}
	start = time.Now()
	mustJSON(t, &fk, "fork", ck)
	if len(fk.Sandboxes) != 1 {
		t.Fatalf("fork: %+v", fk)
	}
	checkRestored(t, fk.Sandboxes[0].ID, pid, count, start)
}
