// What the cgroup reports about its processes: usage, and the counters of
// what its limits refused or killed.

package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// Stats is a snapshot of a cgroup's usage.
type Stats struct {
	MemoryBytes int64 // current memory charge; 0 without a memory controller
	Pids        int   // processes in the cgroup and its descendants
}

// Stats reports the cgroup's current memory charge and process count.
func (c *Cgroup) Stats() (Stats, error) {
	pids, err := c.Pids()
	if err != nil {
		return Stats{}, fmt.Errorf("stats: %w", err)
	}
	st := Stats{Pids: len(pids)}
	if c.memory != "" {
		file := "memory.current"
		if !c.v2 {
			file = "memory.usage_in_bytes"
		}
		n, err := readInt(filepath.Join(c.memory, file))
		switch {
		case err == nil:
			st.MemoryBytes = n
		case !errors.Is(err, fs.ErrNotExist):
			return Stats{}, fmt.Errorf("stats of cgroup %s: %w", c.name, err)
		}
	}
	return st, nil
}

// PidsLimitHits reports how many forks the pids limit refused in the
// cgroup (pids.events "max"; v1 counts them in the cgroup the fork was
// tried in, the leaf, v2 in the one whose limit was hit), 0 without a
// pids controller.
func (c *Cgroup) PidsLimitHits() int64 {
	if c.pids == "" {
		return 0
	}
	var n int64
	for _, dir := range []string{c.pids, filepath.Join(c.pids, Leaf)} {
		b, err := os.ReadFile(filepath.Join(dir, "pids.events"))
		if err != nil {
			continue
		}
		if v, ok := keyValue(b, "max"); ok {
			if k, err := strconv.ParseInt(v, 10, 64); err == nil {
				n = max(n, k)
			}
		}
	}
	return n
}

// OOMKills reports how many processes the kernel's OOM killer has
// killed in the cgroup for exceeding its memory limit (0 without a
// memory controller).
func (c *Cgroup) OOMKills() (int64, error) {
	if c.memory == "" {
		return 0, nil
	}
	file := "memory.events"
	if !c.v2 {
		file = "memory.oom_control"
	}
	// v1 counts a kill in the victim's own cgroup (the leaf) only; v2
	// in the leaf and every ancestor: the larger of the two is the
	// cgroup's.
	var n int64
	for i, dir := range []string{c.memory, filepath.Join(c.memory, Leaf)} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if i > 0 && errors.Is(err, fs.ErrNotExist) {
			break // a legacy cgroup, or v2 without the controller below
		}
		if err != nil {
			return 0, fmt.Errorf("oom kills of cgroup %s: %w", c.name, err)
		}
		if v, ok := keyValue(b, "oom_kill"); ok {
			k, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("oom kills of cgroup %s: %w", c.name, err)
			}
			n = max(n, k)
		}
	}
	return n, nil
}
