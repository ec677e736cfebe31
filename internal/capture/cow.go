package capture

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/template"
)

// COWMinAnon is the private memory above which a checkpoint takes its
// pages copy-on-write (or by copies): below it, CRIU's copy costs less
// than the protection (seizing and stepping every process, 2-4 ms).
const COWMinAnon = 32 << 20

// AnonBytes sums the resident private memory (RssAnon) of pids.
func AnonBytes(pids []int) int64 {
	var n int64
	for _, pid := range pids {
		n += template.RssAnon(pid)
	}
	return n
}

// cowObstacle says why the tree of pids cannot be captured copy-on-write
// ("" if it can): a process with more than one thread (a fork copies one
// thread, and the others would run while it is stepped), or memory
// shared between processes (anonymous shared mappings, System V or
// POSIX shared memory, memfd, deleted files), whose pages CRIU also hands
// over by reference but a fork does not protect.
func cowObstacle(pids []int) string {
	for _, pid := range pids {
		if why := stateObstacle(pid, false); why != "" {
			return why
		}
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			return fmt.Sprintf("pid %d: %v", pid, err)
		}
		if len(ents) != 1 {
			return fmt.Sprintf("pid %d has %d threads", pid, len(ents))
		}
		maps, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
		if err != nil {
			return fmt.Sprintf("pid %d: %v", pid, err)
		}
		if what := sharedWritable(maps); what != "" {
			return fmt.Sprintf("pid %d maps shared memory (%s)", pid, what)
		}
	}
	return ""
}

// sharedWritable returns the first writable shared mapping in maps
// (/proc/PID/maps) whose contents CRIU dumps, or "".
func sharedWritable(maps []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || len(f[1]) != 4 || f[1][1] != 'w' || f[1][3] != 's' {
			continue
		}
		path := ""
		if len(f) >= 6 {
			path = strings.Join(f[5:], " ")
		}
		switch {
		case path == "", strings.HasPrefix(path, "/dev/zero"), strings.HasPrefix(path, "/SYSV"),
			strings.HasPrefix(path, "/memfd:"), strings.HasPrefix(path, "/dev/shm/"), strings.HasSuffix(path, "(deleted)"):
			if path == "" {
				path = "anonymous"
			}
			return path
		}
	}
	return ""
}

// state is how a capture takes the tree's memory, as it goes.
type state struct {
	stream bool   // CRIU streams the images (criu.Stream)
	mode   string // Copy or COW
	note   string // why not COW, for a tree that would have used it
	// The frozen window's parts; SnapshotMS is written before the
	// snapshot's result is sent.
	parts v1.StallParts
	watch *Watch // the frozen window's deadline (frozen.go)
}

// protect write-protects the frozen tree's private memory for a streamed
// dump (capt.mode becomes COW), or says in capt.note why it cannot. It
// returns an error only when the tree is not frozen after.
func protect(ctx context.Context, t *Target, stream *criu.Stream, capt *state) error {
	if err := t.fail("full:protect"); err != nil {
		return err
	}
	// Only the live tree: the cgroup also holds the sandbox's standbys
	// (stopped, in PID namespaces of their own), which CRIU does not
	// dump, and a process traced here would stop CRIU from seizing it.
	pids, err := t.Pids()
	if err != nil {
		return err
	}
	cg, init := t.Cgroup, t.Pid
	if why := cowObstacle(pids); why != "" {
		capt.note = why
		return nil
	}
	// PID 1 (molt's pid1, a few pages) is often this daemon's child
	// (started by it, or restored by its CRIU): it is stopped with
	// SIGSTOP rather than traced (see ProtectFrozen), and its pages are
	// copied.
	var rest []int
	for _, pid := range pids {
		if pid != init {
			rest = append(rest, pid)
		}
	}
	t0 := time.Now()
	err = template.ProtectFrozen([]int{init}, rest, cg.Thaw, func() error { return cg.Freeze(ctx) })
	capt.parts.ProtectMS = ms(time.Since(t0)) // in the stall even when it failed
	if err != nil {
		capt.note = "write protection: " + err.Error()
		return cg.Freeze(ctx)
	}
	stream.CopyPagesOf(1)
	capt.mode = COW
	return nil
}

// clearDir removes what dir holds.
func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
