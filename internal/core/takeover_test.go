package core

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/sandbox"
	"github.com/molt-sh/molt/internal/store"
	"golang.org/x/sys/unix"
)

// crashChild, in the environment of a re-run of the test binary, makes
// TestCrashRecovery play the daemon that dies (see rollbackCrashChild).
const crashChild = "MOLT_TEST_ROLLBACK_CRASH"

type crashCase struct {
	Root, Sandbox, Tier, Step string
}

// TestCrashRecovery kills a daemon (SIGKILL, in a child process) at each
// step of a rollback's switch of the live tree, hot and warm, and checks
// what the next daemon makes of it. From the exchange of the roots on,
// the rollback is completed: the sandbox runs the checkpoint's tree (its
// session variable is the checkpoint's), its record names that tree and
// that checkpoint, and no other process, root or record is left. Before
// the exchange, the sandbox runs on as it was. Without the takeover
// record the completed cases find the sandbox lost (its recorded init
// killed) and the new tree running on, unreachable.
func TestCrashRecovery(t *testing.T) {
	if env := os.Getenv(crashChild); env != "" {
		var c crashCase
		if err := json.Unmarshal([]byte(env), &c); err != nil {
			t.Fatal(err)
		}
		rollbackCrashChild(t, c)
		return
	}
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	// The fs rollback's sandbox has no full checkpoint, whose processes
	// its rollback would restore.
	fsb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage})
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.cfg
	// Each Manager here stands for a daemon of its own: the agents this
	// process keeps per init (with the sessions they know) go with it.
	closeDaemon := func(m *Manager) {
		for _, id := range []string{sb.ID, fsb.ID} {
			var rec sandboxRec
			if err := m.db.Get(store.Sandboxes, id, &rec); err == nil {
				sandbox.Forget(rec.Init)
			}
		}
		m.Close()
	}
	closeDaemon(m)
	// The sandbox goes with the last daemon, before the pool is
	// unmounted (closeManager's clean-up, which runs after this one).
	var cur *Manager
	t.Cleanup(func() {
		if cur != nil {
			sbs, _ := cur.Sandboxes()
			for _, s := range sbs {
				if err := cur.Remove(ctx, s.ID); err != nil {
					t.Errorf("remove %s: %v", s.ID, err)
				}
			}
			cur.Close()
		}
	})
	for _, c := range []struct {
		tier, step string
		done       bool // the rollback is completed
	}{
		{v1.TierHot, "takeover:begin", false},
		{v1.TierHot, "takeover:switched", true},
		{v1.TierHot, "takeover:killed", true},
		{v1.TierWarm, "takeover:begin", false},
		{v1.TierWarm, "takeover:switched", true},
		{v1.TierWarm, "takeover:killed", true},
		// Not a rollback: a hibernation killed after its record, before
		// its processes were gone. It stays hibernated, and resumes.
		{v1.StateHibernated, "hibernate:recorded", true},
		// A fork call killed once all its forks are made, before it
		// returned: none of them stays.
		{"fork", "fork:made", false},
		// Last: an fs rollback leaves the sandbox without processes.
		{v1.KindFS, "takeover:switched", true},
	} {
		id := sb.ID
		if c.tier == v1.KindFS {
			id = fsb.ID
		}
		env, _ := json.Marshal(crashCase{Root: cfg.Root, Sandbox: id, Tier: c.tier, Step: c.step})
		cgroups := cgroupDirs(t)
		cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashRecovery$", "-test.v")
		cmd.Env = append(os.Environ(), crashChild+"="+string(env))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s rollback, crash at %s: the daemon was not killed there (%v):\n%s", c.tier, c.step, err, out.String())
		}
		m, err = Open(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cur = m
		if c.tier == "fork" {
			sbs, err := m.Sandboxes()
			if err != nil {
				t.Fatal(err)
			}
			if len(sbs) != 2 {
				t.Fatalf("fork killed at %s: %d sandboxes listed after the restart, want the 2 it forked none to: %+v", c.step, len(sbs), sbs)
			}
			if dirs := entries(t, m.path("sandboxes")); len(dirs) != 2 {
				t.Fatalf("fork killed at %s: sandbox directories %v after the restart", c.step, dirs)
			}
			for d := range cgroupDirs(t) {
				if !cgroups[d] {
					t.Fatalf("fork killed at %s: cgroup %s left", c.step, d)
				}
			}
			t.Logf("fork killed at %s: no fork left", c.step)
			cur = nil
			closeDaemon(m)
			continue
		}
		if c.tier == v1.StateHibernated {
			var rec sandboxRec
			if err := m.db.Get(store.Sandboxes, sb.ID, &rec); err != nil {
				t.Fatal(err)
			}
			if st := m.report(rec).State; st != v1.StateHibernated {
				t.Fatalf("hibernation killed at %s: sandbox %s after the restart, want hibernated", c.step, st)
			}
			cg, err := m.loadCgroup(rec)
			if err != nil {
				t.Fatal(err)
			}
			if pids, err := cg.Pids(); err != nil || len(pids) > 0 {
				t.Fatalf("hibernation killed at %s: processes %v (%v) left in the hibernated sandbox", c.step, pids, err)
			}
			if _, err := m.Resume(ctx, sb.ID); err != nil {
				t.Fatalf("hibernation killed at %s: resume: %v", c.step, err)
			}
			if got := run(t, m, sb.ID, "echo $X").Stdout; got != "a\n" {
				t.Fatalf("hibernation killed at %s: X=%q after resume, want a", c.step, got)
			}
			t.Logf("hibernation killed at %s: hibernated after the restart, resumed with X=a", c.step)
			cur = nil
			closeDaemon(m)
			continue
		}
		if c.tier == v1.KindFS {
			var rec sandboxRec
			if err := m.db.Get(store.Sandboxes, fsb.ID, &rec); err != nil {
				t.Fatal(err)
			}
			var ck checkpointRec
			if err := m.db.Get(store.Checkpoints, rec.Head, &ck); err != nil || ck.Kind != v1.KindFS {
				t.Fatalf("fs rollback, crash at %s: head %s (%+v, %v), want the fs checkpoint", c.step, rec.Head, ck, err)
			}
			if b, err := os.ReadFile(filepath.Join(m.sbRoot(fsb.ID), "f")); err != nil || string(b) != "a\n" {
				t.Fatalf("fs rollback, crash at %s: /f %q, %v; want the checkpoint's", c.step, b, err)
			}
			if st := m.report(rec).State; st != v1.StateLost {
				t.Fatalf("fs rollback, crash at %s: sandbox %s, want lost (its processes were killed)", c.step, st)
			}
			t.Logf("fs rollback, killed at %s: head and files the checkpoint's", c.step)
			cur = nil
			closeDaemon(m)
			continue
		}
		want := "b" // set after the checkpoint
		if c.done {
			want = "a"
		}
		if got := run(t, m, sb.ID, "echo $X").Stdout; got != want+"\n" {
			t.Fatalf("%s rollback, crash at %s: X=%q after the restart, want %q", c.tier, c.step, got, want)
		}
		var rec sandboxRec
		if err := m.db.Get(store.Sandboxes, sb.ID, &rec); err != nil {
			t.Fatal(err)
		}
		if s := m.report(rec); s.State != v1.StateRunning {
			t.Fatalf("%s rollback, crash at %s: sandbox %s (%s)", c.tier, c.step, s.State, s.Reason)
		}
		// Start-up kills the strays without waiting for them to go.
		var tree, others []int
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if tree, others, err = treePids(sb.ID, rec.Init); err != nil {
				t.Fatal(err)
			}
			if len(others) == 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(others) > 0 {
			t.Fatalf("%s rollback, crash at %s: processes outside the sandbox's tree left in its cgroup: %v (tree %v)", c.tier, c.step, others, tree)
		}
		for _, e := range entries(t, m.sbDir(sb.ID)) {
			if e != "root" {
				t.Fatalf("%s rollback, crash at %s: %s left in the sandbox's directory", c.tier, c.step, e)
			}
		}
		var left []string
		if err := m.db.ForEachPrefix(store.Takeovers, "", func(k string, _ []byte) error {
			left = append(left, k)
			return nil
		}); err != nil || len(left) > 0 {
			t.Fatalf("%s rollback, crash at %s: takeover records left: %v %v", c.tier, c.step, left, err)
		}
		t.Logf("%s rollback, killed at %s: X=%s after the restart", c.tier, c.step, want)
		cur = nil
		closeDaemon(m)
	}
	if cur, err = Open(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// rollbackCrashChild is the daemon that dies: it takes a full checkpoint
// of the sandbox with X=a, sets X=b, waits for a standby (hot) and rolls
// back, killing itself at c.Step; or it hibernates the sandbox with X=a.
func rollbackCrashChild(t *testing.T, c crashCase) {
	ctx := context.Background()
	m, err := Open(ctx, Config{Root: c.Root, PoolSize: 8 << 30, StandbyBudget: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	m.crash = func(step string) {
		if step == c.Step {
			_ = unix.Kill(os.Getpid(), unix.SIGKILL)
			select {}
		}
	}
	if c.Tier == "fork" {
		ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 3})
		t.Fatalf("fork returned (%v) without reaching %s", err, c.Step)
	}
	if c.Tier == v1.StateHibernated {
		run(t, m, c.Sandbox, "export X=a")
		_, err := m.Hibernate(ctx, c.Sandbox)
		t.Fatalf("hibernate returned (%v) without reaching %s", err, c.Step)
	}
	kind := v1.KindFull
	if c.Tier == v1.KindFS {
		kind, c.Tier = v1.KindFS, ""
	}
	run(t, m, c.Sandbox, "export X=a; echo a > /f")
	ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: kind, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m, c.Sandbox, "export X=b; echo b > /f")
	if c.Tier == v1.TierHot {
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(strings.Join(m.standbyCheckpoints(c.Sandbox), " "), ck.ID); {
			if time.Now().After(deadline) {
				t.Fatal("no standby")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	res, err := m.RollbackWith(ctx, c.Sandbox, v1.RollbackRequest{Checkpoint: ck.ID, Tier: c.Tier})
	t.Fatalf("rollback returned (%+v, %v) without reaching %s", res, err, c.Step)
}
