package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/sandbox"
	"golang.org/x/sys/unix"
)

// crashChild, in the environment of a re-run of the test binary, makes
// TestCrashRecovery play the daemon that dies (see crashingDaemon).
const crashChild = "MOLT_TEST_CRASH_CHILD"

// A crashCase tells the daemon that dies what to do to Sandbox, and at
// which crash point (hooks.crash) to die.
type crashCase struct {
	Root, Sandbox, Op, Step string
}

// The operations of crashingDaemon: rollbacks take their tier's name.
const (
	opHibernate  = "hibernate"
	opFork       = "fork"
	opFSRollback = "fs-rollback"
	opTemplate   = "template" // a full checkpoint, captured by copies
)

// TestCrashRecovery kills a daemon (SIGKILL, in a child process) at named
// steps of multi-step operations and checks what the next daemon makes of
// it:
//   - a hot or warm rollback killed before the exchange of the roots runs
//     on as it was; from the exchange on it is completed: the sandbox runs
//     the checkpoint's tree (its session variable is the checkpoint's),
//     its record names that tree and that checkpoint, and no other
//     process, root or takeover record is left (without the takeover
//     record the sandbox was lost, its new tree running on unreachable);
//   - an fs rollback killed after its exchange is completed: the
//     checkpoint's files, the checkpoint as the head, a fresh init;
//   - a hibernation killed after its record, before its processes were
//     gone, stays hibernated with no process, and resumes;
//   - a fork call killed once its forks are made, before it returned,
//     leaves none of them;
//   - an fs rollback killed inside its restart, after the processes were
//     killed and before the new init was recorded, is restarted.
func TestCrashRecovery(t *testing.T) {
	if env := os.Getenv(crashChild); env != "" {
		var c crashCase
		if err := json.Unmarshal([]byte(env), &c); err != nil {
			t.Fatal(err)
		}
		crashingDaemon(t, c)
		return
	}
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	// The fs rollback's sandbox has no full checkpoint, whose processes
	// its rollback would restore.
	fsb := newSandbox(t, m)
	cfg := m.cfg
	// Each Manager here stands for a daemon of its own: the agents this
	// process keeps per init (with the sessions they know) go with it.
	closeDaemon := func(m *Manager) {
		for _, id := range []string{sb.ID, fsb.ID} {
			sandbox.Forget(record(t, m, id).Init)
		}
		m.Close()
	}
	closeDaemon(m)
	// The sandboxes go with the last daemon, before the pool is
	// unmounted (closeManager's clean-up, which runs after this one).
	var cur *Manager
	closeLast(t, &cur)
	rolledBack := func(x string) func(*testing.T, *Manager) {
		return func(t *testing.T, m *Manager) { checkRollbackCrash(t, m, sb.ID, x) }
	}
	fsRolledBack := func(t *testing.T, m *Manager) {
		rec := record(t, m, fsb.ID)
		var ck checkpointRec
		if err := m.db.Get(meta.Checkpoints, rec.Head, &ck); err != nil || ck.Kind != v1.KindFS {
			t.Fatalf("head %s (%+v, %v), want the fs checkpoint", rec.Head, ck, err)
		}
		if b, err := os.ReadFile(filepath.Join(m.sbRoot(fsb.ID), "f")); err != nil || string(b) != "a\n" {
			t.Fatalf("/f %q, %v; want the checkpoint's", b, err)
		}
		// Restarted, as the rollback would have: a fresh init on the
		// checkpoint's files.
		if s := m.report(rec); s.State != v1.StateRunning {
			t.Fatalf("sandbox %s (%s), want running again", s.State, s.Reason)
		}
		if got := run(t, m, fsb.ID, "cat /f; echo ${X:-unset}").Stdout; got != "a\nunset\n" {
			t.Fatalf("after the restart: %q, want the checkpoint's file and a fresh session", got)
		}
	}
	for _, c := range []struct {
		op, step string
		check    func(*testing.T, *Manager)
	}{
		{v1.TierHot, "takeover:begin", rolledBack("b")},
		{v1.TierHot, "takeover:switched", rolledBack("a")},
		{v1.TierHot, "takeover:killed", rolledBack("a")},
		{v1.TierWarm, "takeover:begin", rolledBack("b")},
		{v1.TierWarm, "takeover:switched", rolledBack("a")},
		{v1.TierWarm, "takeover:killed", rolledBack("a")},
		{opHibernate, "stop:recorded", func(t *testing.T, m *Manager) {
			rec := record(t, m, sb.ID)
			if st := m.report(rec).State; st != v1.StateHibernated {
				t.Fatalf("sandbox %s after the restart, want hibernated", st)
			}
			cg, err := m.loadCgroup(rec)
			if err != nil {
				t.Fatal(err)
			}
			if pids, err := cg.Pids(); err != nil || len(pids) > 0 {
				t.Fatalf("processes %v (%v) left in the hibernated sandbox", pids, err)
			}
			if _, err := m.Resume(ctx, sb.ID); err != nil {
				t.Fatalf("resume: %v", err)
			}
			if got := run(t, m, sb.ID, "echo $X").Stdout; got != "a\n" {
				t.Fatalf("X=%q after resume, want a", got)
			}
		}},
		{opFork, "fork:made", nil}, // checked below, against the cgroups before
		{opFSRollback, "takeover:switched", fsRolledBack},
		// Past the switch, killed inside the restart: between the kill
		// and the new init's record. The next daemon restarts it.
		{opFSRollback, "restart:killed", fsRolledBack},
	} {
		t.Run(c.op+"@"+c.step, func(t *testing.T) {
			id := sb.ID
			if c.op == opFSRollback {
				id = fsb.ID
			}
			cgroups := cgroupDirs(t)
			runCrashingDaemon(t, crashCase{Root: cfg.Root, Sandbox: id, Op: c.op, Step: c.step})
			m, err := Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			cur = m
			if c.op == opFork {
				sbs, err := m.Sandboxes()
				if err != nil || len(sbs) != 2 {
					t.Fatalf("%d sandboxes listed after the restart (%v), want the 2 forked from: %+v", len(sbs), err, sbs)
				}
				if dirs := entries(t, m.path("sandboxes")); len(dirs) != 2 {
					t.Fatalf("sandbox directories %v after the restart", dirs)
				}
				for d := range cgroupDirs(t) {
					if !cgroups[d] {
						t.Fatalf("cgroup %s left", d)
					}
				}
			} else {
				c.check(t, m)
			}
			cur = nil
			closeDaemon(m)
		})
		if t.Failed() {
			return
		}
	}
	var err error
	if cur, err = Open(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// runCrashingDaemon runs crashingDaemon for c in a re-run of the test
// binary and checks that it died at its crash point (SIGKILL).
func runCrashingDaemon(t *testing.T, c crashCase) {
	t.Helper()
	env, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashRecovery$", "-test.v")
	cmd.Env = append(os.Environ(), crashChild+"="+string(env))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the daemon was not killed at %s (%v):\n%s", c.Step, err, out.String())
	}
}

// record is sandbox id's record.
func record(t testing.TB, m *Manager, id string) sandboxRec {
	t.Helper()
	var rec sandboxRec
	if err := m.db.Get(meta.Sandboxes, id, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// checkRollbackCrash checks a hot or warm rollback of sandbox id after a
// restart: running, with session variable X, no process outside its
// tree, no directory but its root, no takeover record.
func checkRollbackCrash(t *testing.T, m *Manager, id, x string) {
	t.Helper()
	if got := run(t, m, id, "echo $X").Stdout; got != x+"\n" {
		t.Fatalf("X=%q after the restart, want %q", got, x)
	}
	rec := record(t, m, id)
	if s := m.report(rec); s.State != v1.StateRunning {
		t.Fatalf("sandbox %s (%s)", s.State, s.Reason)
	}
	// Start-up kills the strays without waiting for them to go.
	var tree, others []int
	var err error
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if tree, others, err = m.treePids(id, rec.Init); err != nil {
			t.Fatal(err)
		}
		if len(others) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(others) > 0 {
		t.Fatalf("processes outside the sandbox's tree left in its cgroup: %v (tree %v)", others, tree)
	}
	if dirs := sbEntries(t, m, id); !slices.Equal(dirs, []string{"root", sandboxFile}) {
		t.Fatalf("sandbox directory holds %v, want its root only", dirs)
	}
	var left []string
	if err := m.db.ForEachPrefix(meta.Takeovers, "", func(k string, _ []byte) error {
		left = append(left, k)
		return nil
	}); err != nil || len(left) > 0 {
		t.Fatalf("takeover records left: %v %v", left, err)
	}
}

// crashingDaemon is the daemon that dies at c.Step. For a rollback
// (c.Op a tier) it takes a full checkpoint of the sandbox with X=a, sets
// X=b, waits for a standby (hot) and rolls back; for an fs rollback the
// same with an fs checkpoint and a file; it hibernates the sandbox with
// X=a, or forks three sandboxes from a full checkpoint of it.
func crashingDaemon(t *testing.T, c crashCase) {
	ctx := context.Background()
	m, err := Open(ctx, Config{Root: c.Root, PoolSize: 8 << 30, StandbyBudget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	m.hooks.crash = func(step string) {
		if step == c.Step {
			_ = unix.Kill(os.Getpid(), unix.SIGKILL)
			select {}
		}
	}
	run(t, m, c.Sandbox, "export X=a; echo a > /f")
	switch c.Op {
	case opHibernate:
		_, err := m.Hibernate(ctx, c.Sandbox)
		t.Fatalf("hibernate returned (%v) without reaching %s", err, c.Step)
	case opTemplate:
		ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		t.Fatalf("checkpoint returned (%+v, %v) without reaching %s", ck, err, c.Step)
	case opFork:
		ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 3})
		t.Fatalf("fork returned (%v) without reaching %s", err, c.Step)
	}
	kind, tier := v1.KindFull, c.Op
	if c.Op == opFSRollback {
		kind, tier = v1.KindFS, ""
	}
	ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: kind, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, c.Sandbox, "export X=b; echo b > /f")
	if tier == v1.TierHot {
		for deadline := time.Now().Add(20 * time.Second); !slices.Contains(m.standbyCheckpoints(c.Sandbox), ck.ID); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no standby")
			}
		}
	}
	res, err := m.RollbackWith(ctx, c.Sandbox, v1.RollbackRequest{Checkpoint: ck.ID, Tier: tier})
	t.Fatalf("rollback returned (%+v, %v) without reaching %s", res, err, c.Step)
}
