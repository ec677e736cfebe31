package cgroup

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DirtyBytes returns the page cache the cgroup's processes dirtied that
// is not yet written back (memory.stat: dirty + writeback on v1,
// file_dirty + file_writeback on v2). It returns -1 when the host does not
// account it, so that callers comparing against a threshold flush.
func (c *Cgroup) DirtyBytes() int64 {
	if c.memory == "" {
		return -1
	}
	f, err := os.Open(filepath.Join(c.memory, "memory.stat"))
	if err != nil {
		return -1
	}
	defer f.Close()
	keys := map[string]bool{"dirty": true, "writeback": true}
	if c.v2 {
		keys = map[string]bool{"file_dirty": true, "file_writeback": true}
	}
	var total int64
	found := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || !keys[k] {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return -1
		}
		total += n
		found++
	}
	if found == 0 {
		return -1
	}
	return total
}
