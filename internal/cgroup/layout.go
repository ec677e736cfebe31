package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/molt-sh/molt/internal/errdefs"
)

const (
	modeV2       = "v2"
	modeV1Hybrid = "v1-hybrid"
	modeV1       = "v1"
	modeNone     = "none"
)

// v1Controllers orders the v1 hierarchies a sandbox cgroup is created
// under: the first one mounted is the primary hierarchy. Every other
// mounted v1 hierarchy (cpuset, blkio, net_cls, perf_event, hugetlb,
// rdma, misc, named ones such as name=systemd) follows, so that no
// sandbox process is left in a host cgroup of any hierarchy.
var v1Controllers = []string{"freezer", "memory", "pids", "devices", "cpu", "cpuacct", "cpuset", "blkio"}

// mountOptsNotControllers are v1 mount options that do not name what a
// hierarchy holds.
var mountOptsNotControllers = []string{"rw", "ro", "xattr", "noprefix", "clone_children", "cpuset_v2_mode", "favordynmods"}

// hierarchy is one mounted cgroup hierarchy.
type hierarchy struct {
	root        string   // mount point
	unified     bool     // cgroup2
	controllers []string // v1 only: the controllers (and name=...) bound here
}

// layout is the set of hierarchies a sandbox cgroup lives in.
type layout struct {
	mode  string
	hiers []hierarchy // primary first; in v1-hybrid the cgroup2 one last
}

// hostLayout is the layout of this host, probed once.
var hostLayout = sync.OnceValues(func() (*layout, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("detect cgroup layout: %w", err)
	}
	defer f.Close()
	l, err := parseMountinfo(f)
	if err != nil {
		return nil, fmt.Errorf("detect cgroup layout: %w", err)
	}
	return l, nil
})

// parseMountinfo derives the layout from a mountinfo table (proc(5)).
func parseMountinfo(r io.Reader) (*layout, error) {
	var (
		v1 []hierarchy // one per v1 hierarchy, first mount of each
		v2 []string    // cgroup2 mount points
		s  = bufio.NewScanner(r)
	)
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		fields, postFields := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(postFields) < 3 {
			continue
		}
		mnt := unescapeMountinfo(fields[4])
		switch postFields[0] {
		case "cgroup2":
			v2 = append(v2, mnt)
		case "cgroup":
			var ctrls []string
			for _, opt := range strings.Split(postFields[2], ",") {
				if opt == "" || slices.Contains(mountOptsNotControllers, opt) || strings.HasPrefix(opt, "release_agent=") {
					continue
				}
				ctrls = append(ctrls, opt)
			}
			if len(ctrls) == 0 {
				continue
			}
			slices.Sort(ctrls)
			// A hierarchy mounted twice (a bind mount) is one hierarchy.
			if !slices.ContainsFunc(v1, func(h hierarchy) bool { return slices.Equal(h.controllers, ctrls) }) {
				v1 = append(v1, hierarchy{root: mnt, controllers: ctrls})
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}

	// A cgroup2 mount at the conventional place wins even if a stray v1
	// hierarchy is mounted too: that is how systemd's unified mode looks.
	if slices.Contains(v2, "/sys/fs/cgroup") {
		return &layout{mode: modeV2, hiers: []hierarchy{{root: "/sys/fs/cgroup", unified: true}}}, nil
	}
	if len(v1) == 0 {
		if len(v2) == 0 {
			return nil, fmt.Errorf("no cgroup hierarchy mounted: %w", errdefs.ErrNotSupported)
		}
		return &layout{mode: modeV2, hiers: []hierarchy{{root: v2[0], unified: true}}}, nil
	}

	// The hierarchies of known controllers first, in v1Controllers'
	// order (by their first such controller), then the rest by mount
	// point.
	rank := func(h hierarchy) int {
		best := len(v1Controllers)
		for _, c := range h.controllers {
			if i := slices.Index(v1Controllers, c); i >= 0 && i < best {
				best = i
			}
		}
		return best
	}
	slices.SortStableFunc(v1, func(a, b hierarchy) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.root, b.root)
	})
	l := &layout{mode: modeV1, hiers: v1}
	if len(v2) > 0 {
		root := v2[0]
		if slices.Contains(v2, "/sys/fs/cgroup/unified") {
			root = "/sys/fs/cgroup/unified"
		}
		l.mode = modeV1Hybrid
		l.hiers = append(l.hiers, hierarchy{root: root, unified: true})
	}
	return l, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...) the
// kernel uses for whitespace and backslashes in mountinfo paths.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// Mode reports how this host's cgroups are laid out: "v2", "v1-hybrid"
// (v1 controllers plus a controller-less cgroup2 mount), "v1" (no cgroup2
// at all) or "none".
func Mode() string {
	l, err := hostLayout()
	if err != nil {
		return modeNone
	}
	return l.mode
}

// Available reports whether the host's cgroups offer controller ctrl
// ("memory", "pids", "cpu", "io"; "io" is blkio on v1) to sandboxes: on
// v1 whether its hierarchy is mounted, on v2 whether the root offers it.
func Available(ctrl string) bool {
	l, err := hostLayout()
	if err != nil {
		return false
	}
	if l.mode == modeV2 {
		b, err := os.ReadFile(filepath.Join(l.hiers[0].root, "cgroup.controllers"))
		return err == nil && slices.Contains(strings.Fields(string(b)), ctrl)
	}
	if ctrl == "io" {
		ctrl = "blkio"
	}
	for _, h := range l.hiers {
		if slices.Contains(h.controllers, ctrl) {
			return true
		}
	}
	return false
}
