//go:build linux && amd64

// Waiting for a tracee's stops, and what /proc says about a process.

package template

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"golang.org/x/sys/unix"
)

// stopTimeout bounds each wait for a stop. A process that does not stop
// in that time is left to the kernel, which detaches it when the
// tracer's thread ends (Close).
const stopTimeout = 2 * time.Second

// wait polls for pid's next state change: a blocking wait4 could hang a
// checkpoint on a process that never stops.
func wait(pid int) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	deadline := time.Now().Add(stopTimeout)
	pause := 20 * time.Microsecond
	// Stops come within microseconds: spin first, then sleep.
	for spin := 0; ; spin++ {
		got, err := unix.Wait4(pid, &ws, unix.WALL|unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return ws, fmt.Errorf("wait for %d: %w", pid, err)
		case got == pid:
			return ws, nil
		case time.Now().After(deadline):
			return ws, fmt.Errorf("pid %d did not stop within %v: %w", pid, stopTimeout, errdefs.ErrUnavailable)
		}
		if spin < 500 {
			continue
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

func threads(pid int) (int, error) {
	ents, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("pid %d: %w", pid, errdefs.ErrNotFound)
		}
		return 0, err
	}
	return len(ents), nil
}

// RssAnon is pid's resident private memory in bytes (RssAnon in
// /proc/PID/status), 0 if unknown.
func RssAnon(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// describe names pid by its command and state, for errors.
func describe(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "pid " + strconv.Itoa(pid)
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open || end+2 >= len(s) {
		return "pid " + strconv.Itoa(pid)
	}
	return fmt.Sprintf("pid %d (%s, state %c)", pid, s[open+1:end], s[end+2])
}

// NSPid returns pid's number in its own PID namespace (the last of
// NSpid).
func NSPid(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.Atoi(f[len(f)-1])
			}
		}
	}
	return 0, fmt.Errorf("pid %d: no NSpid", pid)
}
