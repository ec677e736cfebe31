package cgroup

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Poll steps for states the kernel reaches asynchronously. They stay short
// because a sandbox freeze sits on the checkpoint path; they grow so a slow
// transition does not spin.
const (
	minPollStep = 100 * time.Microsecond
	maxPollStep = time.Millisecond
)

// writeFile writes val to a cgroup control file in a single write(2), as
// the kernel parses each write on its own.
func writeFile(path, val string) error {
	fd, err := openFile(path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for {
		_, err = unix.Write(fd, []byte(val))
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return &fs.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

func openFile(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}

// pread reads a small control file from its start, which makes kernfs
// regenerate the content.
func pread(fd int, buf []byte, path string) ([]byte, error) {
	for {
		n, err := unix.Pread(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "read", Path: path, Err: err}
		}
		return buf[:n], nil
	}
}

// sleepPoll blocks the calling thread until fd (if >= 0) reports a kernfs
// change notification or d passes. Go timers are not used: the runtime's
// idle poller rounds sleeps below 1 ms up to 1 ms.
func sleepPoll(fd int, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	var fds []unix.PollFd
	if fd >= 0 {
		fds = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
	}
	_, _ = unix.Ppoll(fds, &ts, nil) // EINTR or a timeout just means look again
}

func nextStep(d time.Duration) time.Duration { return min(2*d, maxPollStep) }

// waitKey waits until the flat-keyed file path (cgroup.events) has key set
// to want. kernfs notifies a change through poll, but rate-limits the
// notifications to one per 10 ms, so the wait also re-reads on short steps.
func waitKey(ctx context.Context, path, key, want string) error {
	fd, err := openFile(path, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf := make([]byte, 256)
	for step := minPollStep; ; step = nextStep(step) {
		b, err := pread(fd, buf, path)
		if err != nil {
			return err
		}
		if v, ok := keyValue(b, key); ok && v == want {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sleepPoll(fd, step)
	}
}

// keyValue returns the value of key in flat-keyed content ("key value\n").
func keyValue(b []byte, key string) (string, bool) {
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(bytes.TrimSpace(line), []byte{' '})
		if ok && string(k) == key {
			return string(v), true
		}
	}
	return "", false
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, &fs.PathError{Op: "parse", Path: path, Err: err}
	}
	return n, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readPids lists the processes in dir and in its descendant cgroups.
// A missing dir has no processes.
func readPids(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, &fs.PathError{Op: "parse", Path: filepath.Join(dir, "cgroup.procs"), Err: err}
		}
		pids = append(pids, pid)
	}
	subs, err := subdirs(dir)
	if err != nil {
		return nil, err
	}
	for _, sub := range subs {
		p, err := readPids(sub)
		if err != nil {
			return nil, err
		}
		pids = append(pids, p...)
	}
	return pids, nil
}

// subdirs lists the child cgroups of dir; a missing dir has none.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

// removeTree removes the cgroup dir and its child cgroups, deepest first.
// The kernel may still count just-killed tasks for a moment, so EBUSY is
// retried for up to a second (or until ctx ends).
func removeTree(ctx context.Context, dir string) error {
	subs, err := subdirs(dir)
	if err != nil {
		return err
	}
	for _, sub := range subs {
		if err := removeTree(ctx, sub); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(time.Second)
	for step := time.Millisecond; ; step = min(2*step, 50*time.Millisecond) {
		err := unix.Rmdir(dir)
		switch {
		case err == nil, err == unix.ENOENT:
			return nil
		case err == unix.EINTR:
			continue
		case err != unix.EBUSY || time.Now().After(deadline) || ctx.Err() != nil:
			return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
		}
		sleepPoll(-1, step)
	}
}

// revert is a stack of undo steps for a multi-step operation.
type revert []func() error

func (r *revert) add(f func() error) { *r = append(*r, f) }

// run undoes the steps in reverse order and reports what could not be undone.
func (r revert) run() error {
	var errs []error
	for _, f := range slices.Backward(r) {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
