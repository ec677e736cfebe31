package sandbox

import (
	"errors"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSignalChecksIdentity: Signal goes to the recorded process only; a
// PID now held by another process (another start time) is not signalled.
func TestSignalChecksIdentity(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	init, err := InitOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// The same number, as a recorded init that exited would have it once
	// the number was reused.
	stale := Init{Pid: init.Pid, Start: init.Start - 1}
	if err := stale.Signal(unix.SIGKILL); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("Signal of a stale init: %v, want ESRCH", err)
	}
	select {
	case <-done:
		t.Fatal("the process that took the number was killed")
	case <-time.After(100 * time.Millisecond):
	}
	if err := init.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not killed")
	}
	if err := init.Signal(unix.SIGKILL); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("Signal after exit: %v, want ESRCH", err)
	}
}
