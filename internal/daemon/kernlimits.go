package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// A kernelLimit is a host sysctl the daemon raises to at least min at
// start (never lowers).
type kernelLimit struct {
	path string // under /proc/sys
	min  int64
	why  string
}

// kernelLimits are the per-uid limits every sandbox shares with the host
// while sandboxes run as host uid 0 (no user namespace): the kernel
// counts them per (user namespace, uid), so one sandbox that takes them
// all leaves the host's root and the other sandboxes with EMFILE or
// ENOSPC. They cannot be split per sandbox without a user namespace (and
// with one, the counts also climb to the namespace owner, uid 0, in the
// host's namespace), so the daemon makes the shared pool large enough
// that what one sandbox can hold is bounded by its own limits instead:
// its memory cgroup (inotify instances and marks are charged to it) and
// its pids and RLIMIT_NOFILE. docs/security.md gives the figures.
var kernelLimits = []kernelLimit{
	// Default 128: a sandbox running a few editors or file watchers
	// (each takes one or more instances) exhausts it for the whole host.
	{"fs/inotify/max_user_instances", 1 << 20, "inotify instances of uid 0"},
	// Default ~1% of low memory (192530 here): one recursive watcher on
	// a large tree (node_modules) takes them all.
	{"fs/inotify/max_user_watches", 1 << 22, "inotify watches of uid 0"},
}

// raiseKernelLimits applies kernelLimits, logging what it raised and
// what it could not (a daemon in a container may see /proc/sys read-only;
// it runs on, with the warning).
func raiseKernelLimits(log *slog.Logger) {
	for _, l := range kernelLimits {
		from, to, err := raiseSysctl(l.path, l.min)
		switch {
		case err != nil:
			log.Warn("cannot raise a host limit that sandboxes share with the host's root", "sysctl", l.path, "want", l.min, "what", l.why, "err", err)
		case to != from:
			log.Info("raised a host limit that sandboxes share with the host's root", "sysctl", l.path, "from", from, "to", to, "what", l.why)
		}
	}
}

// raiseSysctl sets /proc/sys/path to min if it is lower, and returns the
// value before and after.
func raiseSysctl(path string, min int64) (from, to int64, err error) {
	p := "/proc/sys/" + path
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, 0, err
	}
	from, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", p, err)
	}
	if from >= min {
		return from, from, nil
	}
	if err := os.WriteFile(p, []byte(strconv.FormatInt(min, 10)), 0); err != nil {
		return from, from, err
	}
	return from, min, nil
}
