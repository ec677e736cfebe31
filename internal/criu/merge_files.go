// The open files of the live (frozen) processes a merge combines: each
// one's files with their offsets, and the descriptions several share,
// read before the parts are dumped.

package criu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// kcmpFile is kcmp(2)'s KCMP_FILE.
const kcmpFile = 0

// OpenFiles returns pid's open files that have a path (regular files,
// directories, devices) by descriptor, with their offsets and sizes:
// read from a frozen original, they are MergePart.Files. It also
// returns pid's pipes, by descriptor, as /proc names them ("pipe:[INO]"),
// for a caller that checks what they hold: one pass over the
// descriptors, in the frozen window.
func OpenFiles(pid int) (files map[int]FileAt, pipes map[int]string, err error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	files, pipes = map[int]FileAt{}, map[int]string{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link := filepath.Join(dir, e.Name())
		target, err := os.Readlink(link)
		if err != nil {
			continue // closed meanwhile
		}
		if strings.HasPrefix(target, "pipe:") {
			pipes[fd] = target
		}
		if !strings.HasPrefix(target, "/") {
			continue // a pipe, socket or anonymous inode
		}
		var at FileAt
		var st unix.Stat_t
		if err := unix.Stat(link, &st); err != nil {
			return nil, nil, fmt.Errorf("descriptor %d of %d: %w", fd, pid, err)
		}
		at.Size = st.Size
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
		if err != nil {
			return nil, nil, fmt.Errorf("descriptor %d of %d: %w", fd, pid, err)
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "pos:"); ok {
				if at.Pos, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil {
					return nil, nil, fmt.Errorf("fdinfo %d of %d: %w", fd, pid, err)
				}
			}
		}
		files[fd] = at
	}
	return files, pipes, nil
}

// SharedFiles finds the open file descriptions that several of pids (the
// copies, in the order of Merge's parts) share, with kcmp(2): each group
// is one description. Descriptors of one process that share a
// description are left out; CRIU's dump of that process says so.
func SharedFiles(pids []int) ([][]FileRef, error) {
	type fdOf struct {
		ref    FileRef
		target string
	}
	var all []fdOf
	for i, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			target, err := os.Readlink(filepath.Join(dir, e.Name()))
			if err != nil {
				return nil, err
			}
			all = append(all, fdOf{FileRef{i, fd}, target})
		}
	}
	// Only descriptors that name the same object can share a
	// description: kcmp those.
	group := make([]int, len(all))
	for i := range group {
		group[i] = -1
	}
	var out [][]FileRef
	for i, a := range all {
		if group[i] >= 0 {
			continue
		}
		var g []FileRef
		for j := i + 1; j < len(all); j++ {
			b := all[j]
			if group[j] >= 0 || b.ref.Part == a.ref.Part || b.target != a.target {
				continue
			}
			r, _, e := unix.Syscall6(unix.SYS_KCMP, uintptr(pids[a.ref.Part]), uintptr(pids[b.ref.Part]), kcmpFile, uintptr(a.ref.Fd), uintptr(b.ref.Fd), 0)
			if e != 0 {
				return nil, fmt.Errorf("kcmp %d:%d %d:%d: %w", pids[a.ref.Part], a.ref.Fd, pids[b.ref.Part], b.ref.Fd, e)
			}
			if r == 0 {
				if g == nil {
					g = []FileRef{a.ref}
					group[i] = len(out)
				}
				g = append(g, b.ref)
				group[j] = len(out)
			}
		}
		if g != nil {
			out = append(out, g)
		}
	}
	return out, nil
}
