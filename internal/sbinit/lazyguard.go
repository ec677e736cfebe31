package sbinit

import (
	"context"
	"os"
	"time"

	"github.com/molt-sh/molt/internal/cgroup"
)

// ArgLazyGuard is the argv[1] that selects LazyGuard in the molt binary:
// argv[2] names the cgroup of the tree being resumed lazily.
const ArgLazyGuard = "__molt_lazy_guard"

// LazyGuardDone is the byte the daemon writes to a lazy guard whose
// resume ended (every page in, or the tree killed by the daemon itself).
const LazyGuardDone = 'D'

// LazyGuard watches the daemon during a lazy resume. Its standard input
// is a pipe whose other end only the daemon holds, and its descriptor 3
// a copy of the daemon's end of the socket CRIU's lazy-pages daemon asks
// for pages on. When the daemon dies before it wrote LazyGuardDone, the
// pipe ends, and the guard kills every process of the cgroup: while it
// does, its copy keeps the socket open, so the lazy-pages daemon has not
// let go of the tree's memory and a task faulting on a page not yet in
// waits (and dies) instead of reading zeros. Then it exits, and the
// lazy-pages daemon with it.
func LazyGuard() {
	if len(os.Args) < 3 {
		os.Exit(2)
	}
	b := make([]byte, 1)
	for {
		n, err := os.Stdin.Read(b)
		if n == 1 && b[0] == LazyGuardDone {
			os.Exit(0)
		}
		if err != nil {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if cg, err := cgroup.Load(os.Args[2]); err == nil {
		_ = cg.Kill(ctx)
	}
	os.Exit(1)
}
