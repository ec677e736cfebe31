package daemon

import (
	"context"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/sbinit"
	"github.com/molt-sh/molt/internal/testutil"
)

// The test binary doubles as the sandbox init, as the molt binary does.
func TestMain(m *testing.M) {
	sbinit.RunIfInit()
	if path := os.Getenv(dialEnv); path != "" {
		os.Exit(dialHelper(path))
	}
	os.Exit(m.Run())
}

// TestEphemeralRestart: a restarted ephemeral daemon serves on the same
// socket, its sandbox kept running with its processes and files, and
// Close still removes everything.
func TestEphemeralRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := startTestEphemeral(t, ctx)
	closed := false
	defer func() {
		if !closed {
			_ = e.Close()
		}
	}()
	if _, err := e.Client.BuildImage(ctx, v1.ImageBuildRequest{Name: "default"}, nil); err != nil {
		t.Fatal(err)
	}
	sb, err := e.Client.Create(ctx, v1.SandboxCreateRequest{Image: "default"})
	if err != nil {
		t.Fatal(err)
	}
	run := func(cmd string) string {
		t.Helper()
		r, err := e.Client.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: cmd})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %v, %+v", cmd, err, r)
		}
		return strings.TrimSpace(r.Stdout)
	}
	run("echo kept > /tmp/f")
	old := e.Manager
	if err := e.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if e.Manager == old {
		t.Fatal("Restart kept the old Manager")
	}
	s, err := e.Client.Sandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != v1.StateRunning || s.Pid != sb.Pid {
		t.Fatalf("after the restart: %s, pid %d (was %d), want the same tree running", s.State, s.Pid, sb.Pid)
	}
	if got := run("cat /tmp/f"); got != "kept" {
		t.Fatalf("file after the restart: %q", got)
	}
	root := e.Root
	closed = true
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("root %s after Close: %v", root, err)
	}
}

// startTestEphemeral starts an ephemeral daemon on a temporary root, with
// the test image cache (MOLT_CACHE_DIR, default /var/cache/molt). It
// needs root. StartEphemeral raises GOMAXPROCS once for the process:
// that is undone when the test ends, for TestSetProcs.
func startTestEphemeral(t *testing.T, ctx context.Context) *Ephemeral {
	t.Helper()
	testutil.RequireRoot(t)
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		runtime.GOMAXPROCS(n)
		procsOnce = sync.Once{}
	})
	cache := os.Getenv("MOLT_CACHE_DIR")
	if cache == "" {
		cache = "/var/cache/molt"
	}
	e, err := StartEphemeral(ctx, t.TempDir(), cache, "test")
	if err != nil {
		t.Fatal(err)
	}
	return e
}
