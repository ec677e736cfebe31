package s3server

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/testutil"
)

// needBinary skips t without the server's binary, or fails it under
// MOLT_REQUIRE_PRIVILEGED=1.
func needBinary(t *testing.T) {
	t.Helper()
	if _, err := Binary(); err != nil {
		testutil.Unavailable(t, err.Error()+": build it with `"+BuildCommand+"` (or `make deps`)")
	}
}

func TestStartStop(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	p, err := StartProcess(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p.Endpoint, "http://127.0.0.1:") || p.Bucket == "" || p.AccessKey == "" || len(p.SecretKey) < 32 {
		t.Errorf("server %+v", p.Server)
	}
	b, err := p.Open(t.Context(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Put(t.Context(), "k", strings.NewReader("v"), 1); err != nil {
		t.Fatal(err)
	}
	// The posix backend keeps the object as a file.
	if got, err := os.ReadFile(filepath.Join(dir, "data", p.Bucket, "x", "k")); err != nil || string(got) != "v" {
		t.Errorf("object file: %q, %v", got, err)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() {
		t.Fatal("not exited after Stop")
	}
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(p.Endpoint, "http://"), time.Second); err == nil {
		c.Close()
		t.Error("the stopped server still listens")
	}
}

// TestDiedReported: a server that dies is an error at Stop.
func TestDiedReported(t *testing.T) {
	needBinary(t)
	p, err := StartProcess(t.Context(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("still running after SIGKILL")
	}
	if err := p.Stop(); !errors.Is(err, errExited) {
		t.Fatalf("stop of a dead server: %v", err)
	}
}

func TestMissingBinary(t *testing.T) {
	t.Setenv("MOLT_S3_SERVER", filepath.Join(t.TempDir(), "nothing"))
	if _, err := Binary(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Binary: %v", err)
	}
	if _, err := StartProcess(t.Context(), t.TempDir()); err == nil || !strings.Contains(err.Error(), BuildCommand) {
		t.Errorf("StartProcess: %v, want the command that builds it", err)
	}
}
