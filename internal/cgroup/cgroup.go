package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// Resources are the limits New applies.
type Resources struct {
	MemoryMax int64 // bytes; 0 = unlimited
	PidsMax   int64 // 0 = unlimited
}

// Stats is a snapshot of a cgroup's usage.
type Stats struct {
	MemoryBytes int64 // current memory charge; 0 without a memory controller
	Pids        int   // processes in the cgroup and its descendants
}

// allowedDevices are the character devices a sandbox may use on v1.
var allowedDevices = []string{
	"c 1:3 rwm",   // null
	"c 1:5 rwm",   // zero
	"c 1:7 rwm",   // full
	"c 1:8 rwm",   // random
	"c 1:9 rwm",   // urandom
	"c 5:0 rwm",   // tty
	"c 5:2 rwm",   // ptmx
	"c 136:* rwm", // pts
}

// Cgroup is one sandbox's cgroup, present in every hierarchy molt uses.
type Cgroup struct {
	name string
	v2   bool     // the only hierarchy is cgroup2 and holds the controllers
	dirs []string // one per hierarchy, primary first

	// Directories by role; "" when the host lacks that hierarchy.
	unified, freezer, memory, pids, devices string

	// cgroup2 interface files in unified, probed when the cgroup is opened.
	hasFreeze2, hasKill2 bool
}

// newHook, when set by a test, runs before each step of New and can make
// it fail, to exercise the undo.
var newHook func(step string) error

func (l *layout) cgroup(name string) *Cgroup {
	c := &Cgroup{name: name, v2: l.mode == modeV2}
	for _, h := range l.hiers {
		dir := filepath.Join(h.root, name)
		c.dirs = append(c.dirs, dir)
		if h.unified {
			c.unified = dir
			if c.v2 {
				c.memory, c.pids = dir, dir
			}
			continue
		}
		for _, ctrl := range h.controllers {
			switch ctrl {
			case "freezer":
				c.freezer = dir
			case "memory":
				c.memory = dir
			case "pids":
				c.pids = dir
			case "devices":
				c.devices = dir
			}
		}
	}
	return c
}

func (c *Cgroup) probe() {
	if c.unified != "" {
		c.hasFreeze2 = fileExists(filepath.Join(c.unified, "cgroup.freeze"))
		c.hasKill2 = fileExists(filepath.Join(c.unified, "cgroup.kill"))
	}
}

func validName(name string) error {
	if name == "" || name == "." || !filepath.IsLocal(name) || filepath.Clean(name) != name || strings.ContainsAny(name, "\n\x00") {
		return fmt.Errorf("cgroup name %q: must be a clean relative path: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// New creates the cgroup named name (e.g. "molt/<id>", relative to each
// hierarchy root) and applies res. On v1 it also restricts devices to
// allowedDevices. It fails with errdefs.ErrAlreadyExists if the cgroup
// exists, and removes whatever it created when it fails.
func New(name string, res Resources) (*Cgroup, error) {
	l, err := hostLayout()
	if err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
	}
	return newIn(l, name, res)
}

func newIn(l *layout, name string, res Resources) (_ *Cgroup, retErr error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if res.MemoryMax < 0 || res.PidsMax < 0 {
		return nil, fmt.Errorf("create cgroup %s: negative limit: %w", name, errdefs.ErrInvalidArgument)
	}
	c := l.cgroup(name)
	var undo revert
	defer func() {
		if retErr != nil {
			if err := undo.run(); err != nil {
				retErr = errors.Join(retErr, fmt.Errorf("undo create cgroup %s: %w", name, err))
			}
		}
	}()
	step := func(s string, f func() error) error {
		if newHook != nil {
			if err := newHook(s); err != nil {
				return err
			}
		}
		return f()
	}
	fail := func(err error) error { return fmt.Errorf("create cgroup %s: %w", name, err) }

	limits := res.MemoryMax > 0 || res.PidsMax > 0
	for i, h := range l.hiers {
		dir := c.dirs[i]
		if err := step("mkdir "+dir, func() error { return mkdirCgroup(h, c.v2, name, limits) }); err != nil {
			return nil, fail(err)
		}
		undo.add(func() error {
			if err := unix.Rmdir(dir); err != nil && err != unix.ENOENT {
				return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
			}
			return nil
		})
	}
	c.probe()

	// The unified hierarchy's device control; on a hybrid host the v1
	// devices controller below holds the line should BPF be unavailable.
	if c.unified != "" {
		if err := step("device filter", func() error { return AttachDeviceFilter(c.unified) }); err != nil && (c.v2 || !errors.Is(err, errdefs.ErrNotSupported)) {
			return nil, fail(err)
		}
	}
	if !c.v2 {
		if c.devices == "" {
			return nil, fail(fmt.Errorf("no v1 devices hierarchy to restrict devices: %w", errdefs.ErrNotSupported))
		}
		if err := step("devices", c.denyDevices); err != nil {
			return nil, fail(err)
		}
	}
	if res.MemoryMax > 0 {
		file := "memory.max"
		if !c.v2 {
			file = "memory.limit_in_bytes"
		}
		if err := step("memory", func() error { return c.setLimit(c.memory, "memory", file, res.MemoryMax) }); err != nil {
			return nil, fail(err)
		}
	}
	if res.PidsMax > 0 {
		if err := step("pids", func() error { return c.setLimit(c.pids, "pids", "pids.max", res.PidsMax) }); err != nil {
			return nil, fail(err)
		}
	}
	return c, nil
}

// mkdirCgroup creates name under h, creating shared parents as needed. On
// v2 it first enables the memory and pids controllers down the path; a
// failure to do so only matters when limits are wanted.
func mkdirCgroup(h hierarchy, v2 bool, name string, limits bool) error {
	dir := h.root
	parts := strings.Split(name, "/")
	for i, p := range parts {
		if v2 {
			if err := enableControllers(dir); err != nil && limits {
				return err
			}
		}
		dir = filepath.Join(dir, p)
		err := unix.Mkdir(dir, 0o755)
		switch {
		case i == len(parts)-1 && err == unix.EEXIST:
			return fmt.Errorf("%s: %w", dir, errdefs.ErrAlreadyExists)
		case err != nil && err != unix.EEXIST:
			return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
		}
	}
	return nil
}

// enableControllers enables memory and pids for the children of the v2
// cgroup dir, as far as dir offers them.
func enableControllers(dir string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	enabled, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	var add []string
	for _, ctrl := range []string{"memory", "pids"} {
		if slices.Contains(strings.Fields(string(avail)), ctrl) && !slices.Contains(strings.Fields(string(enabled)), ctrl) {
			add = append(add, "+"+ctrl)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " "))
}

func (c *Cgroup) denyDevices() error {
	if err := writeFile(filepath.Join(c.devices, "devices.deny"), "a"); err != nil {
		return err
	}
	for _, rule := range allowedDevices {
		if err := writeFile(filepath.Join(c.devices, "devices.allow"), rule); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cgroup) setLimit(dir, controller, file string, v int64) error {
	path := filepath.Join(dir, file)
	if dir == "" || !fileExists(path) {
		return fmt.Errorf("%s limit: %s controller not available: %w", controller, controller, errdefs.ErrNotSupported)
	}
	return writeFile(path, strconv.FormatInt(v, 10))
}

// Load opens the existing cgroup name, for instance after a daemon restart.
// It fails with errdefs.ErrNotFound if no hierarchy has it. A cgroup that is
// only partly present loads, so that Destroy can finish removing it.
func Load(name string) (*Cgroup, error) {
	l, err := hostLayout()
	if err != nil {
		return nil, fmt.Errorf("load cgroup %s: %w", name, err)
	}
	return loadIn(l, name)
}

func loadIn(l *layout, name string) (*Cgroup, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	c := l.cgroup(name)
	if !slices.ContainsFunc(c.dirs, isDir) {
		return nil, fmt.Errorf("load cgroup %s: %w", name, errdefs.ErrNotFound)
	}
	c.probe()
	return c, nil
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// Exists reports whether the cgroup name exists in the primary hierarchy.
func Exists(name string) bool {
	l, err := hostLayout()
	if err != nil || validName(name) != nil {
		return false
	}
	return isDir(l.cgroup(name).dirs[0])
}

// Name returns the name the cgroup was created or loaded with.
func (c *Cgroup) Name() string { return c.name }

// UnifiedDir is the cgroup's cgroup2 directory ("" without cgroup2); its
// inode is the cgroup ID eBPF programs see.
func (c *Cgroup) UnifiedDir() string { return c.unified }

// Add moves the process pid into the cgroup in every hierarchy, primary
// first, so that a process Add touched at all is visible to Pids and Kill.
func (c *Cgroup) Add(pid int) error {
	for _, dir := range c.dirs {
		if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("add pid %d to cgroup %s: %w", pid, c.name, err)
		}
	}
	return nil
}

// Pids lists the processes (host PIDs) in the cgroup and its descendants,
// as the primary hierarchy sees them.
func (c *Cgroup) Pids() ([]int, error) {
	if !isDir(c.dirs[0]) {
		return nil, fmt.Errorf("list pids of cgroup %s: %w", c.name, errdefs.ErrNotFound)
	}
	pids, err := readPids(c.dirs[0])
	if err != nil {
		return nil, fmt.Errorf("list pids of cgroup %s: %w", c.name, err)
	}
	return pids, nil
}

// allPids lists the processes in the cgroup in any hierarchy, without
// duplicates. Missing directories contribute none.
func (c *Cgroup) allPids() ([]int, error) {
	var all []int
	for _, dir := range c.dirs {
		pids, err := readPids(dir)
		if err != nil {
			return nil, err
		}
		all = append(all, pids...)
	}
	slices.Sort(all)
	return slices.Compact(all), nil
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

// Destroy kills every process in the cgroup and removes it, with any child
// cgroups, from every hierarchy. Directories already gone are fine, so
// Destroy can be repeated after a partial failure.
func (c *Cgroup) Destroy(ctx context.Context) error {
	if err := c.Kill(ctx); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	var errs []error
	for _, dir := range slices.Backward(c.dirs[1:]) {
		if err := removeTree(ctx, dir); err != nil {
			errs = append(errs, err)
		}
	}
	// Keep the primary until the rest is gone, so a retry still finds it.
	if len(errs) == 0 {
		if err := removeTree(ctx, c.dirs[0]); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy cgroup %s: %w", c.name, err)
	}
	return nil
}

// SetLimits changes the cgroup's limits to res (0: unlimited), for
// instance to make room for processes the daemon keeps in the cgroup
// besides the sandbox's own. Lowering the memory limit below the
// current charge makes the kernel reclaim, and on v2 OOM-kill, or on v1
// fail with EBUSY: callers lower it once what they made room for is gone.
func (c *Cgroup) SetLimits(res Resources) error {
	if res.MemoryMax < 0 || res.PidsMax < 0 {
		return fmt.Errorf("limit cgroup %s: negative limit: %w", c.name, errdefs.ErrInvalidArgument)
	}
	var errs []error
	if c.memory != "" {
		file, v := "memory.max", "max"
		if !c.v2 {
			file, v = "memory.limit_in_bytes", "-1"
		}
		if res.MemoryMax > 0 {
			v = strconv.FormatInt(res.MemoryMax, 10)
		}
		if err := writeFile(filepath.Join(c.memory, file), v); err != nil {
			errs = append(errs, err)
		}
	} else if res.MemoryMax > 0 {
		errs = append(errs, fmt.Errorf("memory limit: memory controller not available: %w", errdefs.ErrNotSupported))
	}
	if c.pids != "" {
		v := "max"
		if res.PidsMax > 0 {
			v = strconv.FormatInt(res.PidsMax, 10)
		}
		if err := writeFile(filepath.Join(c.pids, "pids.max"), v); err != nil {
			errs = append(errs, err)
		}
	} else if res.PidsMax > 0 {
		errs = append(errs, fmt.Errorf("pids limit: pids controller not available: %w", errdefs.ErrNotSupported))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("limit cgroup %s: %w", c.name, err)
	}
	return nil
}

// Limits reads the cgroup's current limits (0: unlimited).
func (c *Cgroup) Limits() (Resources, error) {
	var res Resources
	read := func(dir, file string) (int64, error) {
		if dir == "" {
			return 0, nil
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return 0, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", file, err)
		}
		// v1 reports "unlimited" as a huge page-rounded number.
		if n >= 1<<62 {
			return 0, nil
		}
		return n, nil
	}
	file := "memory.max"
	if !c.v2 {
		file = "memory.limit_in_bytes"
	}
	var err error
	if res.MemoryMax, err = read(c.memory, file); err != nil {
		return Resources{}, fmt.Errorf("limits of cgroup %s: %w", c.name, err)
	}
	if res.PidsMax, err = read(c.pids, "pids.max"); err != nil {
		return Resources{}, fmt.Errorf("limits of cgroup %s: %w", c.name, err)
	}
	return res, nil
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
	b, err := os.ReadFile(filepath.Join(c.memory, file))
	if err != nil {
		return 0, fmt.Errorf("oom kills of cgroup %s: %w", c.name, err)
	}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == "oom_kill" {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, nil
}
