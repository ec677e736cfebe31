package cgroup

import (
	"bufio"
	"fmt"
	"io"
	"os"
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

// v1Controllers are the v1 controllers a sandbox cgroup is created under.
// The first one mounted is the primary hierarchy.
var v1Controllers = []string{"freezer", "memory", "pids", "devices", "cpu", "cpuacct"}

// hierarchy is one mounted cgroup hierarchy.
type hierarchy struct {
	root        string   // mount point
	unified     bool     // cgroup2
	controllers []string // v1 only: the controllers of v1Controllers bound here
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
		v1     = map[string]string{} // controller -> first mount point
		v2     []string              // cgroup2 mount points
		s      = bufio.NewScanner(r)
		hasAny bool
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
			for _, opt := range strings.Split(postFields[2], ",") {
				if slices.Contains(v1Controllers, opt) {
					if _, seen := v1[opt]; !seen {
						v1[opt] = mnt
						hasAny = true
					}
				}
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
	if !hasAny {
		if len(v2) == 0 {
			return nil, fmt.Errorf("no cgroup hierarchy mounted: %w", errdefs.ErrNotSupported)
		}
		return &layout{mode: modeV2, hiers: []hierarchy{{root: v2[0], unified: true}}}, nil
	}

	l := &layout{mode: modeV1}
	for _, ctrl := range v1Controllers {
		mnt, ok := v1[ctrl]
		if !ok {
			continue
		}
		i := slices.IndexFunc(l.hiers, func(h hierarchy) bool { return h.root == mnt })
		if i < 0 {
			l.hiers = append(l.hiers, hierarchy{root: mnt})
			i = len(l.hiers) - 1
		}
		l.hiers[i].controllers = append(l.hiers[i].controllers, ctrl)
	}
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
