package core

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
	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/template"
)

// Capture modes of a full checkpoint (v1.Checkpoint.Capture).
const (
	// captureCopy: CRIU copies every private page while the tree is
	// frozen (about 0.5 ms per MiB here).
	captureCopy = "copy"
	// captureCOW: in the frozen window molt write-protects the tree's
	// private memory (an injected fork, killed at once) and CRIU hands
	// its pages over by reference (criu.Stream); they are copied after
	// the thaw, and a process that writes a page meanwhile gets a copy
	// of its own.
	captureCOW = "copy-on-write"
)

// cowMinAnon is the private memory above which a checkpoint takes its
// pages copy-on-write: below it, CRIU's copy costs less than the
// protection (seizing and stepping every process, 2-4 ms).
const cowMinAnon = 32 << 20

// streamPipes is how many pipes the host keeps ready for streamed dumps:
// 1 MiB each at the default fs.pipe-max-size, enough for a 150 MiB tree
// without making one while CRIU writes.
const streamPipes = 160

// pipePool returns the host's pool of stream pipes, made and filled at
// the first use (before that dump's freeze).
func (m *Manager) pipePool() *criu.PipePool {
	m.streamMu.Lock()
	defer m.streamMu.Unlock()
	if m.pipes == nil {
		m.pipes = criu.NewPipePool(streamPipes)
		if err := m.pipes.Fill(); err != nil {
			m.log.Debug("stream pipes", "err", err)
		}
	}
	return m.pipes
}

// refillPipes tops the pool up in the background, off the frozen window.
func (m *Manager) refillPipes() {
	p := m.pipePool()
	go func() {
		if err := p.Fill(); err != nil {
			m.log.Debug("stream pipes", "err", err)
		}
	}()
}

// anonBytes sums the resident private memory (RssAnon) of pids.
func anonBytes(pids []int) int64 {
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

// capture is how a full checkpoint takes the tree's memory.
type capture struct {
	stream bool   // CRIU streams the images (criu.Stream)
	mode   string // captureCopy or captureCOW
	note   string // why not captureCOW, for a tree that would have used it
	// The frozen window's parts; SnapshotMS is written before the
	// snapshot's result is sent.
	parts v1.StallParts
	watch *frozenWatch // the frozen window's deadline (frozen.go)
}

// protect write-protects the frozen tree's private memory for a streamed
// dump (capt.mode becomes captureCOW), or says in capt.note why it
// cannot. It returns an error only when the tree is not frozen after.
func (m *Manager) protect(ctx context.Context, cg *cgroup.Cgroup, rec sandboxRec, stream *criu.Stream, capt *capture) error {
	if err := m.fail("full:protect"); err != nil {
		return err
	}
	// Only the live tree: the cgroup also holds the sandbox's standbys
	// (stopped, in PID namespaces of their own), which CRIU does not
	// dump, and a process traced here would stop CRIU from seizing it.
	pids, _, err := treePids(rec.ID, rec.Init)
	if err != nil {
		return err
	}
	init := rec.Init.Pid
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
	capt.mode = captureCOW
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
