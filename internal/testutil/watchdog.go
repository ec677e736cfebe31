package testutil

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// Watchdog ends the test binary when t is still running after limit:
// every goroutine's stack, then the test's name, go to stderr, and the
// binary exits with status 2. A test that hangs in a package of many
// slow tests would otherwise hold the package until go test's timeout,
// whose report opens with the test's name, far from a log's tail. Only
// the first call per test counts; benchmarks are not watched.
func Watchdog(t testing.TB, limit time.Duration) {
	tt, ok := t.(*testing.T)
	if !ok {
		return
	}
	if _, dup := watched.LoadOrStore(tt, true); dup {
		return
	}
	done := make(chan struct{})
	start := time.Now()
	tt.Cleanup(func() {
		close(done)
		watched.Delete(tt)
	})
	go func() {
		select {
		case <-done:
			return
		case <-time.After(limit):
		}
		buf := make([]byte, 64<<20)
		buf = buf[:runtime.Stack(buf, true)]
		os.Stderr.Write(buf)
		fmt.Fprintf(os.Stderr, "\n--- FAIL: %s: still running after %s (the watchdog's limit; every goroutine above)\nFAIL\n",
			tt.Name(), time.Since(start).Round(time.Second))
		os.Exit(2)
	}()
}

// watched holds the tests being watched.
var watched sync.Map
