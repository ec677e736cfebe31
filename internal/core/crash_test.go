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
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"golang.org/x/sys/unix"
)

// invariantChild, in the environment of a re-run of the test binary,
// makes TestCrashListedMeansRestorable play the daemon that dies.
const invariantChild = "MOLT_TEST_INVARIANT_CHILD"

// crashedSandboxes, in the state root, lists the sandboxes the daemon
// that died had made.
const crashedSandboxes = "crashed-sandboxes.json"

// The operations of invariantDaemon beyond those of crashingDaemon.
const (
	opFull   = "full"   // a full checkpoint, waited for
	opFS     = "fs"     // an fs checkpoint
	opResume = "resume" // hibernate, then resume
)

// TestCrashListedMeansRestorable kills a daemon (SIGKILL, in a child
// process) at the crash points of a full checkpoint's background store
// and commit, of an fs checkpoint, of a fork, of a hibernation and of a
// resume, and checks after each restart that listed means restorable
// and that nothing half-made remains (checkInvariants).
func TestCrashListedMeansRestorable(t *testing.T) {
	if env := os.Getenv(invariantChild); env != "" {
		var c crashCase
		if err := json.Unmarshal([]byte(env), &c); err != nil {
			t.Fatal(err)
		}
		invariantDaemon(t, c)
		return
	}
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	sb := newSandbox(t, m)
	cfg := m.cfg
	m.Close()
	var cur *Manager
	closeLast(t, &cur)
	for _, c := range []struct {
		op, step string
		want     string // the sandbox's state after the restart
		stored   bool   // whether the operation's checkpoint is listed
	}{
		{opFull, "persist:stored", v1.StateRunning, false},
		{opFull, "persist:synced", v1.StateRunning, false},
		{opFull, "persist:committed", v1.StateRunning, true},
		{opFS, "fs:snapshotted", v1.StateRunning, false},
		{opFork, "fork:made", v1.StateRunning, true},
		{opFork, "fork:recorded", v1.StateRunning, true},
		// Killed while frozen for its capture: thawed and running.
		{opHibernate, "persist:synced", v1.StateRunning, false},
		{opHibernate, "hibernate:committed", v1.StateRunning, true},
		{opHibernate, "stop:recorded", v1.StateHibernated, true},
		{opResume, "takeover:begin", v1.StateHibernated, true},
		{opResume, "takeover:switched", v1.StateRunning, true},
	} {
		t.Run(c.op+"@"+c.step, func(t *testing.T) {
			env, _ := json.Marshal(crashCase{Root: cfg.Root, Sandbox: sb.ID, Op: c.op, Step: c.step})
			cmd := exec.Command(os.Args[0], "-test.run", "^TestCrashListedMeansRestorable$", "-test.v")
			cmd.Env = append(os.Environ(), invariantChild+"="+string(env))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the daemon was not killed at %s (%v):\n%s", c.step, err, out.String())
			}
			m, err := Open(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			cur = m
			rec := record(t, m, sb.ID)
			if st := m.report(rec).State; st != c.want {
				t.Fatalf("sandbox %s after the restart (%s), want %s", st, rec.Reason, c.want)
			}
			cks, err := m.Checkpoints(sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(stored(cks)) > 0; got != c.stored {
				t.Fatalf("checkpoints after the restart: %+v; want one stored: %v", cks, c.stored)
			}
			// One that was pending when the daemon died is listed as
			// failed, with the reason, not dropped silently.
			if lost := strings.HasPrefix(c.step, "persist:") && !c.stored; lost != (len(cks) > len(stored(cks))) {
				t.Fatalf("checkpoints after the restart: %+v; want one failed: %v", cks, lost)
			}
			var made []string
			if b, err := os.ReadFile(filepath.Join(cfg.Root, crashedSandboxes)); err != nil || json.Unmarshal(b, &made) != nil {
				t.Fatalf("no list of the crashed daemon's sandboxes: %v", err)
			}
			checkInvariants(t, m, made)
			// The next case starts from a running sandbox with no
			// checkpoint and no fork.
			if m.report(record(t, m, sb.ID)).State == v1.StateHibernated {
				if _, err := m.Resume(ctx, sb.ID); err != nil {
					t.Fatalf("resume: %v", err)
				}
			}
			sbs, _ := m.Sandboxes()
			for _, s := range sbs {
				if s.ID != sb.ID {
					if err := m.Remove(ctx, s.ID); err != nil {
						t.Fatal(err)
					}
				}
			}
			cks, _ = m.Checkpoints(sb.ID)
			for _, c := range cks {
				if err := m.DeleteCheckpoint(ctx, c.ID); err != nil {
					t.Fatalf("delete %s: %v", c.ID, err)
				}
			}
			cur = nil
			m.Close()
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

// checkInvariants checks a restarted daemon: every listed checkpoint
// verifies and can be rolled back to (a hibernated sandbox resumes at
// its own); failed ones hold no directory; no unlisted checkpoint,
// sandbox, staging or root directory, no cgroup of no listed sandbox,
// no process outside a running sandbox's tree or in a sandbox that is
// not running. made are the sandboxes the crashed daemon had made: those
// not listed must have left no cgroup.
func checkInvariants(t *testing.T, m *Manager, made []string) {
	t.Helper()
	ctx := context.Background()
	sbs, err := m.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	listedSb := map[string]bool{}
	listedCk := map[string]bool{}
	for _, s := range sbs {
		listedSb[s.ID] = true
		cks, err := m.Checkpoints(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cks {
			if c.Pending {
				t.Fatalf("checkpoint %s pending after a restart", c.ID)
			}
			if c.Failed {
				if _, err := os.Stat(m.ckDir(c.ID)); err == nil {
					t.Fatalf("failed checkpoint %s holds a directory", c.ID)
				}
				continue
			}
			listedCk[c.ID] = true
			if _, err := m.VerifyCheckpoint(c.ID); err != nil {
				t.Fatalf("listed checkpoint %s does not verify: %v", c.ID, err)
			}
		}
	}
	if dirs := entries(t, m.path("checkpoints")); len(dirs) != len(listedCk) {
		t.Fatalf("checkpoint directories %v, listed %v", dirs, listedCk)
	} else {
		for _, d := range dirs {
			if !listedCk[d] {
				t.Fatalf("unlisted checkpoint directory %s", d)
			}
		}
	}
	for _, d := range entries(t, m.path("sandboxes")) {
		if !listedSb[d] {
			t.Fatalf("unlisted sandbox directory %s", d)
		}
	}
	if e := entries(t, m.path("tmp")); len(e) != 0 {
		t.Fatalf("staging left: %v", e)
	}
	if left, _ := filepath.Glob("/dev/shm/" + m.stagingPrefix() + "*"); len(left) > 0 {
		t.Fatalf("dump staging left: %v", left)
	}
	for d := range cgroupDirs(t) {
		_, name, _ := strings.Cut(d, "/")
		if slices.Contains(made, name) && !listedSb[name] {
			t.Fatalf("cgroup %s of a sandbox that is not listed", d)
		}
	}
	for _, s := range sbs {
		rec := record(t, m, s.ID)
		st := m.report(rec).State
		// Start-up kills strays and retires roots without waiting.
		deadline := time.Now().Add(5 * time.Second)
		for {
			var bad string
			if st == v1.StateRunning {
				if _, others, err := m.treePids(s.ID, rec.Init); err != nil || len(others) > 0 {
					bad = "processes outside the tree"
				}
			} else if cg, err := m.loadCgroup(rec); err == nil {
				if pids, _ := cg.Pids(); len(pids) > 0 {
					bad = "processes in a sandbox that is " + st
				}
			}
			for _, e := range entries(t, m.sbDir(s.ID)) {
				if strings.HasPrefix(e, "root.") {
					bad = "root left: " + e
				}
			}
			if bad == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s (%s): %s", s.ID, st, bad)
			}
			time.Sleep(20 * time.Millisecond)
		}
		switch st {
		case v1.StateRunning:
			if got := run(t, m, s.ID, "echo ok").Stdout; got != "ok\n" {
				t.Fatalf("sandbox %s runs nothing: %q", s.ID, got)
			}
			cks, _ := m.Checkpoints(s.ID)
			for _, c := range stored(cks) {
				if _, err := m.Rollback(ctx, s.ID, c.ID); err != nil {
					t.Fatalf("rollback %s to listed checkpoint %s: %v", s.ID, c.ID, err)
				}
			}
		case v1.StateHibernated:
			if !listedCk[rec.Head] {
				t.Fatalf("sandbox %s hibernated at %s, which is not listed", s.ID, rec.Head)
			}
			if _, err := m.Resume(ctx, s.ID); err != nil {
				t.Fatalf("resume %s: %v", s.ID, err)
			}
			if got := run(t, m, s.ID, "echo $X").Stdout; got != "a\n" {
				t.Fatalf("resumed session: X=%q, want a", got)
			}
		}
	}
}

// invariantDaemon is the daemon that dies at c.Step, inside c.Op on
// c.Sandbox (with session variable X=a).
func invariantDaemon(t *testing.T, c crashCase) {
	ctx := context.Background()
	m, err := Open(ctx, Config{Root: c.Root, PoolSize: 8 << 30})
	if err != nil {
		t.Fatal(err)
	}
	m.hooks.crash = func(step string) {
		if step == c.Step {
			// The sandboxes it had made by then, for the next daemon's
			// check of their cgroups (other tests on the host make
			// cgroups of their own).
			var ids []string
			ents, _ := os.ReadDir(m.path("sandboxes"))
			for _, e := range ents {
				ids = append(ids, e.Name())
			}
			b, _ := json.Marshal(ids)
			_ = os.WriteFile(filepath.Join(c.Root, crashedSandboxes), b, 0o600)
			_ = unix.Kill(os.Getpid(), unix.SIGKILL)
			select {}
		}
	}
	run(t, m, c.Sandbox, "export X=a; echo a > /f")
	switch c.Op {
	case opFull:
		ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		t.Fatalf("checkpoint returned (%+v, %v) without reaching %s", ck, err, c.Step)
	case opFS:
		ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: v1.KindFS})
		t.Fatalf("checkpoint returned (%+v, %v) without reaching %s", ck, err, c.Step)
	case opFork:
		ck, err := m.Checkpoint(ctx, c.Sandbox, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.Fork(ctx, "", v1.ForkRequest{Checkpoint: ck.ID, N: 2})
		t.Fatalf("fork returned (%v) without reaching %s", err, c.Step)
	case opHibernate:
		_, err := m.Hibernate(ctx, c.Sandbox)
		t.Fatalf("hibernate returned (%v) without reaching %s", err, c.Step)
	case opResume:
		if _, err := m.Hibernate(ctx, c.Sandbox); err != nil {
			t.Fatal(err)
		}
		_, err := m.Resume(ctx, c.Sandbox)
		t.Fatalf("resume returned (%v) without reaching %s", err, c.Step)
	}
	t.Fatalf("unknown operation %q", c.Op)
}
