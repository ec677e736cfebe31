package testutil

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A test that outlives the watchdog's limit ends the binary with its
// name and the goroutines at the tail of the output; one that ends in
// time does not.
func TestWatchdog(t *testing.T) {
	if os.Getenv("MOLT_WATCHDOG_CHILD") == "hang" {
		Watchdog(t, 200*time.Millisecond)
		time.Sleep(time.Minute)
		return
	}
	if os.Getenv("MOLT_WATCHDOG_CHILD") == "quick" {
		Watchdog(t, 200*time.Millisecond)
		return
	}
	for _, c := range []struct {
		mode string
		fail bool
	}{{"hang", true}, {"quick", false}} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestWatchdog$", "-test.v")
		cmd.Env = append(os.Environ(), "MOLT_WATCHDOG_CHILD="+c.mode)
		out, err := cmd.CombinedOutput()
		tail := string(out)
		if i := strings.LastIndex(tail, "\n--- "); i >= 0 {
			tail = tail[i:]
		}
		if got := err != nil; got != c.fail {
			t.Fatalf("%s: failed %v, want %v: %s", c.mode, got, c.fail, out)
		}
		if c.fail && (!strings.Contains(tail, "--- FAIL: TestWatchdog: still running after") || !strings.Contains(string(out), "time.Sleep")) {
			t.Errorf("%s: the output does not end with the test's name after its goroutines: %s", c.mode, out)
		}
		// A quick test does not leave the watchdog to fire later.
		if !c.fail && strings.Contains(string(out), "still running") {
			t.Errorf("%s: %s", c.mode, out)
		}
	}
}
