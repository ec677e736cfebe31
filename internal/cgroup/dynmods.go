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
	m, err := readCgroup2Mount()
	if err != nil {
		return DynModsState{}, err
	}
	return DynModsState{Mount: m.dir, Enabled: slices.Contains(m.super, FavorDynMods)}, nil
}

// EnableDynMods sets favordynmods on the host's cgroup2 mount, keeping
// its other options. It returns whether it changed anything. A host
// without cgroup2 gets errdefs.ErrNotSupported.
func EnableDynMods() (changed bool, err error) { return SetDynMods(true) }

// SetDynMods remounts the host's cgroup2 mount with or without
// favordynmods. A cgroup2 remount sets every root flag from the new
// options, and a remount without MS_BIND every flag of the mount point,
// so both are passed again as they are (nsdelegate, memory_recursiveprot;
// nosuid, nodev, noexec, ...): leaving one out would clear it.
func SetDynMods(on bool) (changed bool, err error) {
	m, err := readCgroup2Mount()
	if err != nil {
		return false, err
	}
	if slices.Contains(m.super, FavorDynMods) == on {
		return false, nil
	}
	opts := slices.DeleteFunc(slices.Clone(m.super), func(o string) bool { return o == FavorDynMods })
	if on {
		opts = append(opts, FavorDynMods)
	}
	data := strings.Join(opts, ",")
	if err := unix.Mount("none", m.dir, "cgroup2", unix.MS_REMOUNT|m.flags, data); err != nil {
		return false, fmt.Errorf("remount %s with %q: %w", m.dir, data, err)
	}
	return true, nil
}

// cgroup2Mount is the host's cgroup2 mount as mountinfo shows it.
type cgroup2Mount struct {
	dir   string
	super []string // superblock options without rw/ro (those are the mount's)
	flags uintptr  // the mount point's flags, as MS_* bits
}

func readCgroup2Mount() (cgroup2Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cgroup2Mount{}, err
	}
	defer f.Close()
	return parseCgroup2Mount(f)
}

// mountFlags maps mountinfo's per-mount options to mount(2) flags.
var mountFlags = map[string]uintptr{
	"ro": unix.MS_RDONLY, "nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV, "noexec": unix.MS_NOEXEC,
	"noatime": unix.MS_NOATIME, "nodiratime": unix.MS_NODIRATIME, "relatime": unix.MS_RELATIME,
	"strictatime": unix.MS_STRICTATIME, "sync": unix.MS_SYNCHRONOUS, "dirsync": unix.MS_DIRSYNC,
	"nosymfollow": unix.MS_NOSYMFOLLOW,
}

// parseCgroup2Mount finds the host's cgroup2 mount in a mountinfo table,
// the conventional places first.
func parseCgroup2Mount(r io.Reader) (cgroup2Mount, error) {
	var found []cgroup2Mount
	s := bufio.NewScanner(r)
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 6 || len(postFields) < 3 || postFields[0] != "cgroup2" {
			continue
		}
		m := cgroup2Mount{dir: unescapeMountinfo(fields[4])}
		for _, opt := range strings.Split(fields[5], ",") {
			m.flags |= mountFlags[opt]
		}
		for _, opt := range strings.Split(postFields[2], ",") {
			if opt != "" && opt != "rw" && opt != "ro" {
				m.super = append(m.super, opt)
			}
		}
		found = append(found, m)
	}
	if err := s.Err(); err != nil {
		return cgroup2Mount{}, err
	}
	if len(found) == 0 {
		return cgroup2Mount{}, fmt.Errorf("no cgroup2 mount: %w", errdefs.ErrNotSupported)
	}
	for _, want := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		for _, m := range found {
			if m.dir == want {
				return m, nil
			}
		}
	}
	return found[0], nil
}

// Cgroup2Root returns where the host's cgroup2 hierarchy is mounted
// (/sys/fs/cgroup on a v2 host, /sys/fs/cgroup/unified on a hybrid one).
func Cgroup2Root() (string, error) {
	m, err := readCgroup2Mount()
	if err != nil {
		return "", err
	}
	return m.dir, nil
}
