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
	// CPUMillis is the CPU bandwidth in thousandths of a CPU (1000 = one
	// CPU's worth of time per period); 0 = unlimited.
	CPUMillis int64
	// IOWeight is the proportional I/O weight (v2 io.weight: 1-10000,
	// v1 blkio.weight/blkio.bfq.weight: 1-1000); 0 leaves the kernel's
	// default and is neither written nor checked.
	IOWeight int64
}

// CPUPeriodUs is the CFS period the CPU limit is expressed in.
const CPUPeriodUs = 100000

// MinCPUMillis is the smallest CPU limit: the kernel refuses a quota
// below 1 ms per period.
const MinCPUMillis = 10

// Leaf is the child cgroup that holds a sandbox's processes. The limits
// are written one level up, in a cgroup no sandbox process is in: a
// process that gains the rights to write cgroup files (root in a user
// namespace of its own, with a cgroup namespace and a cgroupfs mount)
// reaches only its own cgroup namespace's root, the leaf, whose limits
// can only tighten the parent's.
const Leaf = "sandbox"

// Cgroup is one sandbox's cgroup, present in every hierarchy of the host.
type Cgroup struct {
	name string
	v2   bool     // the only hierarchy is cgroup2 and holds the controllers
	dirs []string // one per hierarchy, primary first: where the limits are
	// procs are where processes are added, one per hierarchy: the Leaf
	// under each of dirs, or dirs themselves for a cgroup made before
	// leaves existed (legacy).
	procs  []string
	legacy bool

	// Directories by role; "" when the host lacks that hierarchy.
	unified, freezer, memory, pids, devices, cpu, blkio string

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
		c.procs = append(c.procs, filepath.Join(dir, Leaf))
		if h.unified {
			c.unified = dir
			if c.v2 {
				c.memory, c.pids, c.cpu, c.blkio = dir, dir, dir, dir
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
			case "cpu":
				c.cpu = dir
			case "blkio":
				c.blkio = dir
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

func (r Resources) check() error {
	switch {
	case r.MemoryMax < 0 || r.PidsMax < 0 || r.CPUMillis < 0 || r.IOWeight < 0:
		return fmt.Errorf("negative limit: %w", errdefs.ErrInvalidArgument)
	case r.CPUMillis > 0 && r.CPUMillis < MinCPUMillis:
		return fmt.Errorf("cpu limit %d millicpus: want at least %d: %w", r.CPUMillis, MinCPUMillis, errdefs.ErrInvalidArgument)
	case r.IOWeight > 10000:
		return fmt.Errorf("io weight %d: want 1-10000: %w", r.IOWeight, errdefs.ErrInvalidArgument)
	}
	return nil
}

// New creates the cgroup named name (e.g. "molt/<id>", relative to each
// hierarchy root) in every hierarchy of the host, with its Leaf, and
// applies res. On v1 it also restricts devices to allowedDevices. It
// fails with errdefs.ErrAlreadyExists if the cgroup exists, and removes
// whatever it created when it fails.
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
	if err := res.check(); err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", name, err)
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
	rmdir := func(dir string) func() error {
		return func() error {
			if err := unix.Rmdir(dir); err != nil && err != unix.ENOENT {
				return &fs.PathError{Op: "rmdir", Path: dir, Err: err}
			}
			return nil
		}
	}

	var want []string // v2 controllers the limits need
	if res.MemoryMax > 0 {
		want = append(want, "memory")
	}
	if res.PidsMax > 0 {
		want = append(want, "pids")
	}
	if res.CPUMillis > 0 {
		want = append(want, "cpu")
	}
	if res.IOWeight > 0 {
		want = append(want, "io")
	}
	for i, h := range l.hiers {
		dir := c.dirs[i]
		if err := step("mkdir "+dir, func() error { return mkdirCgroup(h, c.v2, name, want) }); err != nil {
			return nil, fail(err)
		}
		undo.add(rmdir(dir))
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
		if err := step("memory", func() error { return c.setMemory(res.MemoryMax) }); err != nil {
			return nil, fail(err)
		}
	}
	if res.PidsMax > 0 {
		if err := step("pids", func() error { return c.setPids(res.PidsMax) }); err != nil {
			return nil, fail(err)
		}
	}
	if res.CPUMillis > 0 {
		if err := step("cpu", func() error { return c.setCPU(res.CPUMillis) }); err != nil {
			return nil, fail(err)
		}
	}
	if res.IOWeight > 0 {
		if err := step("io", func() error { return c.setIOWeight(res.IOWeight) }); err != nil {
			return nil, fail(err)
		}
	}
	// The leaves last: a v1 devices child copies its parent's list when
	// it is made, and the processes must never see the limits unset.
	for i, h := range l.hiers {
		dir := c.procs[i]
		if err := step("mkdir "+dir, func() error { return mkdirLeaf(h, dir) }); err != nil {
			return nil, fail(err)
		}
		undo.add(rmdir(dir))
	}
	return c, nil
}

// mkdirCgroup creates name under h, creating shared parents as needed. On
// v2 it first enables the memory, pids, cpu and io controllers down the
// path, as far as each parent offers them; a failure to enable one only
// matters when its limit is wanted. In a v1 cpuset hierarchy every
// directory on the path gets its parent's cpus and mems (a new cpuset
// has none, and no task can join it then).
func mkdirCgroup(h hierarchy, v2 bool, name string, want []string) error {
	dir := h.root
	parts := strings.Split(name, "/")
	for i, p := range parts {
		if v2 {
			if err := enableControllers(dir, want); err != nil {
				return err
			}
		}
		parent := dir
		dir = filepath.Join(dir, p)
		err := unix.Mkdir(dir, 0o755)
		switch {
		case i == len(parts)-1 && err == unix.EEXIST:
			return fmt.Errorf("%s: %w", dir, errdefs.ErrAlreadyExists)
		case err != nil && err != unix.EEXIST:
			return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
		}
		if slices.Contains(h.controllers, "cpuset") {
			if err := inheritCpuset(parent, dir); err != nil {
				return err
			}
		}
	}
	return nil
}

// mkdirLeaf creates the leaf dir of a cgroup in h.
func mkdirLeaf(h hierarchy, dir string) error {
	if err := unix.Mkdir(dir, 0o755); err != nil {
		return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
	}
	if slices.Contains(h.controllers, "cpuset") {
		return inheritCpuset(filepath.Dir(dir), dir)
	}
	return nil
}

// inheritCpuset gives the cpuset dir its parent's cpus and mems when it
// has none.
func inheritCpuset(parent, dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(cur)) != "" {
			continue
		}
		v, err := os.ReadFile(filepath.Join(parent, f))
		if err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, f), strings.TrimSpace(string(v))); err != nil {
			return err
		}
	}
	return nil
}

// baseControllers are enabled on v2 whenever the parents offer them.
var baseControllers = []string{"memory", "pids", "cpu", "io"}

// enableControllers enables the memory, pids, cpu and io controllers for
// the children of the v2 cgroup dir, as far as dir offers them. Each is
// enabled on its own, as one that cannot be (cpu, with real-time tasks
// around) must not keep the others off; the error of one only counts
// when it is in want.
func enableControllers(dir string, want []string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return err
	}
	enabled, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return err
	}
	for _, ctrl := range baseControllers {
		if !slices.Contains(strings.Fields(string(avail)), ctrl) || slices.Contains(strings.Fields(string(enabled)), ctrl) {
			continue
		}
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+ctrl); err != nil && slices.Contains(want, ctrl) {
			return err
		}
	}
	return nil
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
	// A cgroup made before leaves existed holds its processes itself.
	if isDir(c.dirs[0]) && !isDir(c.procs[0]) {
		c.legacy = true
		c.procs = slices.Clone(c.dirs)
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

// Add moves the process pid into the cgroup's leaf in every hierarchy,
// primary first, so that a process Add touched at all is visible to Pids
// and Kill. A legacy cgroup (made before this daemon placed sandboxes in
// every hierarchy) skips the hierarchies it has no directory in.
func (c *Cgroup) Add(pid int) error {
	for i, dir := range c.procs {
		err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid))
		if err != nil && c.legacy && i > 0 && errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("add pid %d to cgroup %s: %w", pid, c.name, err)
		}
	}
	return nil
}

// Legacy reports whether the cgroup was made before leaves existed (its
// processes are in the cgroup itself).
func (c *Cgroup) Legacy() bool { return c.legacy }

// ProcsDirs lists the directories Add puts processes in, one per
// hierarchy, primary first.
func (c *Cgroup) ProcsDirs() []string { return slices.Clone(c.procs) }

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
