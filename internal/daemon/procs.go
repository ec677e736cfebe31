package daemon

import (
	"os"
	"runtime"
	"sync"
)

// extraProcs is how many more Go processors (Ps) than CPUs a daemon
// runs with. Much of the daemon's work sits in long blocking system
// calls: btrfs snapshot and delete ioctls, syncfs, waits for CRIU. A
// goroutine in such a call keeps its P until the runtime's monitor
// takes it back, and the monitor, on a daemon idle most of the time,
// checks only every 10 ms. With as many Ps as CPUs (two here), a
// goroutine woken meanwhile waited for that: a hot rollback's wait for
// the turn inspector's ring-buffer reader took 8-12 ms in a third of the
// rollbacks of `molt bench rollback`, and its p99 was 13-18 ms. With
// spare Ps it found one at once (p99 6-10 ms). More than a few spare Ps
// would give the garbage collector more workers than the CPUs can run
// next to the sandboxes (it takes a quarter of the Ps while marking).
const extraProcs = 4

var procsOnce sync.Once

// setProcs sets GOMAXPROCS to procsFor, once.
func setProcs() {
	procsOnce.Do(func() {
		runtime.GOMAXPROCS(procsFor(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)))
	})
}

// procsFor is the daemon's GOMAXPROCS given the GOMAXPROCS environment
// variable (which, when set, wins) and the runtime's default (the CPUs
// the process may use).
func procsFor(env string, cpus int) int {
	if env != "" {
		return cpus
	}
	return cpus + extraProcs
}
