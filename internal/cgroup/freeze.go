package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Freeze stops every process in the cgroup and returns once the kernel
// reports the group frozen. It uses the cgroup2 freezer when the unified
// directory offers cgroup.freeze (on v2 and in v1-hybrid) and the v1
// freezer otherwise, or when the v1 freezer already holds the group (as a
// CRIU dump may leave it): tasks stopped by the v1 freezer never reach the
// cgroup2 freezer's trap, so cgroup.events would never say frozen. If ctx
// ends first, Freeze thaws the group and returns the context's error.
func (c *Cgroup) Freeze(ctx context.Context) error {
	var err error
	switch {
	case c.hasFreeze2 && !c.v1Freezing():
		err = c.freezeV2(ctx)
	case c.freezer != "":
		err = c.freezeV1(ctx)
	default:
		err = fmt.Errorf("no cgroup2 or v1 freezer: %w", errdefs.ErrNotSupported)
	}
	if err != nil {
		return fmt.Errorf("freeze cgroup %s: %w", c.name, err)
	}
	return nil
}

func (c *Cgroup) freezeV2(ctx context.Context) error {
	if err := writeFile(filepath.Join(c.unified, "cgroup.freeze"), "1"); err != nil {
		return err
	}
	if err := waitKey(ctx, filepath.Join(c.unified, "cgroup.events"), "frozen", "1"); err != nil {
		return errors.Join(err, c.thawV2())
	}
	return nil
}

// freezeV1 asks for FROZEN on every step, not just once: the request
// re-sends the freeze to tasks that slipped past it (runc does the same),
// and reading the state is what makes the kernel notice the transition.
func (c *Cgroup) freezeV1(ctx context.Context) error {
	path := filepath.Join(c.freezer, "freezer.state")
	fd, err := openFile(path, unix.O_RDWR)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf := make([]byte, 64)
	for step := minPollStep; ; step = nextStep(step) {
		if _, err := unix.Pwrite(fd, []byte("FROZEN"), 0); err != nil && err != unix.EINTR {
			return &fs.PathError{Op: "write", Path: path, Err: err}
		}
		b, err := pread(fd, buf, path)
		if err != nil {
			return err
		}
		if string(trimNL(b)) == "FROZEN" {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return errors.Join(err, c.thawV1())
		}
		sleepPoll(-1, step)
	}
}

// v1Freezing reports whether the v1 freezer is freezing or holds the group.
func (c *Cgroup) v1Freezing() bool {
	if c.freezer == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(c.freezer, "freezer.state"))
	return err == nil && string(trimNL(b)) != "THAWED"
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// Thaw resumes the processes of the cgroup. It clears both freezers when
// both exist, so it also undoes a freeze made by an older molt or by hand.
func (c *Cgroup) Thaw() error {
	if err := errors.Join(c.thawV2(), c.thawV1()); err != nil {
		return fmt.Errorf("thaw cgroup %s: %w", c.name, err)
	}
	return nil
}

func (c *Cgroup) thawV2() error {
	if !c.hasFreeze2 {
		return nil
	}
	return writeFile(filepath.Join(c.unified, "cgroup.freeze"), "0")
}

func (c *Cgroup) thawV1() error {
	if c.freezer == "" {
		return nil
	}
	return writeFile(filepath.Join(c.freezer, "freezer.state"), "THAWED")
}

// Kill sends SIGKILL to every process in the cgroup and its descendants and
// waits until none is left. It writes cgroup.kill when the unified
// directory has it; otherwise, or if a process is left in a v1 hierarchy
// only, it freezes, kills the listed PIDs, thaws and repeats. A cgroup
// that is already gone is empty.
func (c *Cgroup) Kill(ctx context.Context) error {
	if err := c.kill(ctx); err != nil {
		return fmt.Errorf("kill cgroup %s: %w", c.name, err)
	}
	return nil
}

func (c *Cgroup) kill(ctx context.Context) error {
	if c.hasKill2 {
		err := writeFile(filepath.Join(c.unified, "cgroup.kill"), "1")
		switch {
		case err == nil:
			// A task stopped by the v1 freezer cannot act on SIGKILL.
			if err := c.thawV1(); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			err := waitKey(ctx, filepath.Join(c.unified, "cgroup.events"), "populated", "0")
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			pids, err := c.allPids()
			if err != nil {
				return err
			}
			if len(pids) == 0 {
				return nil
			}
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
	}
	return c.killLoop(ctx)
}

// killLoop kills the listed processes while the group is frozen, so none
// can fork or exit (and have its PID reused) between listing and kill.
func (c *Cgroup) killLoop(ctx context.Context) error {
	for {
		frozen := false
		if err := c.Freeze(ctx); err == nil {
			frozen = true
		} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, errdefs.ErrNotSupported) {
			return err
		}
		pids, err := c.allPids()
		if err != nil {
			return errors.Join(err, c.thawIf(frozen))
		}
		for _, pid := range pids {
			if err := c.KillMember(pid); err != nil && err != unix.ESRCH {
				return errors.Join(fmt.Errorf("kill pid %d: %w", pid, err), c.thawIf(frozen))
			}
		}
		if err := c.thawIf(frozen); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		// Killed tasks need a moment to exit; look again before re-killing.
		for step, waited := minPollStep, time.Duration(0); waited < 50*time.Millisecond; step = nextStep(step) {
			if err := ctx.Err(); err != nil {
				return err
			}
			sleepPoll(-1, step)
			waited += step
			pids, err := c.allPids()
			if err != nil {
				return err
			}
			if len(pids) == 0 {
				return nil
			}
		}
	}
}

func (c *Cgroup) thawIf(frozen bool) error {
	if !frozen {
		return nil
	}
	return c.Thaw()
}

// FreezerDir returns the directory through which Freeze freezes the
// cgroup (cgroup2 when it has cgroup.freeze, else the v1 freezer), for
// tools such as CRIU that freeze through a cgroup themselves; "" if the
// host has no freezer.
func (c *Cgroup) FreezerDir() string {
	if c.unified != "" && c.hasFreeze2 {
		return c.unified
	}
	return c.freezer
}

// KillMember SIGKILLs pid if it is a member of the cgroup. The pid is
// pinned with a pidfd before its membership is read, so a number that a
// process outside the sandbox took over after cgroup.procs was read is
// never signalled (the pidfd of an exited process gets ESRCH).
func (c *Cgroup) KillMember(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return unix.ESRCH
	}
	member := false
	// In the sandbox's cgroup or below it (its processes live in a leaf
	// under the cgroup that holds the limits).
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && (f[2] == "/"+c.name || strings.HasPrefix(f[2], "/"+c.name+"/")) {
			member = true
		}
	}
	if !member {
		return unix.ESRCH
	}
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}
