package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// FavorDynMods is the cgroup2 mount option that keeps the kernel's
// cgroup_threadgroup_rwsem in its slow-reader mode, so that moving a task
// between cgroups no longer waits for an RCU grace period (10-20 ms on a
// loaded two-CPU VM, once per move). It is one lock for the whole host:
// setting the option on the cgroup2 mount speeds up moves in the v1
// hierarchies of a hybrid host too. Forks and exits pay a little more.
const FavorDynMods = "favordynmods"

// DynModsState reports whether the host's cgroup2 mount favours dynamic
// modifications, and where that mount is.
type DynModsState struct {
	Mount   string // the cgroup2 mount point; "" when there is none
	Enabled bool
}

// DynMods reads the state from /proc/self/mountinfo.
func DynMods() (DynModsState, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return DynModsState{}, err
	}
	defer f.Close()
	mnt, opts, err := cgroup2SuperOptions(f)
	if err != nil {
		return DynModsState{}, err
	}
	return DynModsState{Mount: mnt, Enabled: slices.Contains(opts, FavorDynMods)}, nil
}

// EnableDynMods sets favordynmods on the host's cgroup2 mount, keeping
// its other options. It returns whether it changed anything. A host
// without cgroup2 gets errdefs.ErrNotSupported.
func EnableDynMods() (changed bool, err error) { return SetDynMods(true) }

// SetDynMods remounts the host's cgroup2 mount with or without
// favordynmods. A cgroup2 remount sets every root flag from the new
// options, so the other options (nsdelegate, memory_recursiveprot, ...)
// are passed again: leaving them out would clear them.
func SetDynMods(on bool) (changed bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	mnt, opts, err := cgroup2SuperOptions(f)
	f.Close()
	if err != nil {
		return false, err
	}
	if slices.Contains(opts, FavorDynMods) == on {
		return false, nil
	}
	opts = slices.DeleteFunc(opts, func(o string) bool { return o == FavorDynMods })
	if on {
		opts = append(opts, FavorDynMods)
	}
	data := strings.Join(opts, ",")
	if err := unix.Mount("none", mnt, "cgroup2", unix.MS_REMOUNT, data); err != nil {
		return false, fmt.Errorf("remount %s with %q: %w", mnt, data, err)
	}
	return true, nil
}

// cgroup2SuperOptions finds the host's cgroup2 mount in a mountinfo table
// (the conventional place first) and returns its superblock options
// without rw/ro, which are the mount's, not the hierarchy's.
func cgroup2SuperOptions(r io.Reader) (mount string, opts []string, err error) {
	type cand struct {
		mnt  string
		opts []string
	}
	var found []cand
	s := bufio.NewScanner(r)
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(postFields) < 3 || postFields[0] != "cgroup2" {
			continue
		}
		var o []string
		for _, opt := range strings.Split(postFields[2], ",") {
			if opt != "" && opt != "rw" && opt != "ro" {
				o = append(o, opt)
			}
		}
		found = append(found, cand{unescapeMountinfo(fields[4]), o})
	}
	if err := s.Err(); err != nil {
		return "", nil, err
	}
	if len(found) == 0 {
		return "", nil, fmt.Errorf("no cgroup2 mount: %w", errdefs.ErrNotSupported)
	}
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		for _, c := range found {
			if c.mnt == want {
				return c.mnt, c.opts, nil
			}
		}
	}
	return found[0].mnt, found[0].opts, nil
}
