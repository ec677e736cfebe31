package core

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/testutil"
)

// hangingCriu is a CRIU that hangs once the sandbox is frozen: it runs
// the real CRIU, and while the file $0.hang exists, a `criu swrk` whose
// sandbox's freezer file (named in $0.hang) shows it frozen stops the
// real CRIU (SIGSTOP) in the middle of its dump and waits for ever. The
// PID of the stopped CRIU is written to $0.hung.
const hangingCriu = `#!/bin/sh
real=%REAL%
flag="$0.hang"
if [ "$1" != swrk ] || [ ! -e "$flag" ]; then
	exec "$real" "$@"
fi
watch=$(cat "$flag")
"$real" "$@" &
pid=$!
while kill -0 $pid 2>/dev/null; do
	case "$(cat "$watch" 2>/dev/null)" in
	1|FROZEN|FREEZING)
		kill -STOP $pid
		echo $pid > "$0.hung"
		while :; do sleep 1; done
		;;
	esac
done
wait $pid
`

// TestFrozenDeadline: a CRIU that hangs with the sandbox frozen does not
// keep it frozen: the full checkpoint fails within the frozen deadline
// (plus a margin), naming the step, with ErrUnavailable; the sandbox is
// thawed and its processes run on; nothing is listed; and a checkpoint
// with the real CRIU succeeds afterwards.
func TestFrozenDeadline(t *testing.T) {
	testutil.RequireRoot(t)
	real := findCriu("")
	if real == "" {
		testutil.Unavailable(t, "no CRIU installed (scripts/criu.sh)")
	}
	fake := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(fake, []byte(strings.ReplaceAll(hangingCriu, "%REAL%", real)), 0o755); err != nil {
		t.Fatal(err)
	}
	const deadline = time.Second
	ctx := context.Background()
	m, err := Open(ctx, Config{Root: t.TempDir(), PoolSize: 8 << 30, CacheDir: os.Getenv("MOLT_CACHE_DIR"), CriuPath: fake, FrozenDeadline: deadline})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if _, err := m.BuildImage(ctx, v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
		t.Fatal(err)
	}
	requireCRIU(t, m)
	sb := newSandbox(t, m)
	run(t, m, sb.ID, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.01; done) >/dev/null 2>&1 &`)
	cg, err := cgroup.Load(testCgroup(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	watch := filepath.Join(cg.FreezerDir(), "cgroup.freeze")
	if _, err := os.Stat(watch); err != nil {
		watch = filepath.Join(cg.FreezerDir(), "freezer.state")
	}
	if err := os.WriteFile(fake+".hang", []byte(watch), 0o644); err != nil {
		t.Fatal(err)
	}

	type result struct {
		err error
		d   time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		_, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		done <- result{err, time.Since(start)}
	}()
	// CRIU starts and probes before the freeze: a generous margin for
	// slow machines on top of the deadline.
	const margin = 10 * time.Second
	var res result
	select {
	case res = <-done:
	case <-time.After(deadline + margin):
		ps, _ := exec.Command("ps", "-eo", "pid,pgid,stat,args").Output()
		for _, l := range strings.Split(string(ps), "\n") {
			if strings.Contains(l, "criu") {
				t.Log(l)
			}
		}
		// Let the hung CRIU go, so that the test ends.
		if b, err := os.ReadFile(fake + ".hung"); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		t.Fatalf("the checkpoint has not returned %s after it started (deadline %s)", deadline+margin, deadline)
	}
	if _, err := os.Stat(fake + ".hung"); err != nil {
		t.Fatalf("the fake CRIU never hung (%v); checkpoint: %v", err, res.err)
	}
	t.Logf("checkpoint returned after %s: %v", res.d, res.err)
	if !errors.Is(res.err, errdefs.ErrUnavailable) || !strings.Contains(res.err.Error(), "CRIU's dump hung") {
		t.Fatalf("checkpoint error %v: want ErrUnavailable naming CRIU's dump", res.err)
	}
	os.Remove(fake + ".hang")

	if b, err := os.ReadFile(watch); err != nil || (strings.TrimSpace(string(b)) != "0" && strings.TrimSpace(string(b)) != "THAWED") {
		t.Fatalf("%s: %q %v, want thawed", watch, b, err)
	}
	count := func() int {
		t.Helper()
		n, _ := strconv.Atoi(strings.TrimSpace(run(t, m, sb.ID, "cat /tmp/count").Stdout))
		return n
	}
	c0 := count()
	time.Sleep(300 * time.Millisecond)
	if c1 := count(); c1 <= c0 {
		t.Fatalf("the sandbox's loop made no progress after the abort: %d then %d", c0, c1)
	}
	if cks, _ := m.Checkpoints(sb.ID); len(cks) != 0 {
		t.Fatalf("aborted checkpoint listed: %+v", cks)
	}
	if e := entries(t, m.path("checkpoints")); len(e) != 0 {
		t.Fatalf("aborted checkpoint left %v", e)
	}
	ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
	if err != nil {
		t.Fatalf("checkpoint with the real CRIU after the abort: %v", err)
	}
	run(t, m, sb.ID, "export X=later")
	if _, err := m.Rollback(ctx, sb.ID, ck.ID); err != nil {
		t.Fatal(err)
	}
	if r := run(t, m, sb.ID, "echo X=$X"); r.Stdout != "X=\n" {
		t.Fatalf("after the rollback: %q", r.Stdout)
	}
}
