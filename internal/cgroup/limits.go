// The cgroup's limits: writing them in each controller's own format,
// reading them back, and Enforce, which puts back what drifted.

package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/molt-sh/molt/internal/errdefs"
)

// limitFile is the file and value that set one limit.
func (c *Cgroup) memoryFile() (string, string) {
	if c.v2 {
		return "memory.max", "max"
	}
	return "memory.limit_in_bytes", "-1"
}

func notAvailable(controller string) error {
	return fmt.Errorf("%s limit: %s controller not available: %w", controller, controller, errdefs.ErrNotSupported)
}

// setMemory writes the memory limit (0: unlimited).
func (c *Cgroup) setMemory(v int64) error {
	file, unlimited := c.memoryFile()
	path := filepath.Join(c.memory, file)
	if c.memory == "" || !fileExists(path) {
		if v == 0 {
			return nil
		}
		return notAvailable("memory")
	}
	return writeFile(path, limitValue(v, unlimited))
}

// setPids writes the process limit (0: unlimited).
func (c *Cgroup) setPids(v int64) error {
	path := filepath.Join(c.pids, "pids.max")
	if c.pids == "" || !fileExists(path) {
		if v == 0 {
			return nil
		}
		return notAvailable("pids")
	}
	return writeFile(path, limitValue(v, "max"))
}

// setCPU writes the CPU bandwidth limit (0: unlimited): cpu.max on v2,
// the CFS period and quota on v1.
func (c *Cgroup) setCPU(millis int64) error {
	quota := millis * CPUPeriodUs / 1000
	if c.v2 {
		path := filepath.Join(c.cpu, "cpu.max")
		if !fileExists(path) {
			if millis == 0 {
				return nil
			}
			return notAvailable("cpu")
		}
		return writeFile(path, limitValue(quota, "max")+" "+strconv.Itoa(CPUPeriodUs))
	}
	if c.cpu == "" || !fileExists(filepath.Join(c.cpu, "cpu.cfs_quota_us")) {
		if millis == 0 {
			return nil
		}
		return notAvailable("cpu")
	}
	if p, err := readInt(filepath.Join(c.cpu, "cpu.cfs_period_us")); err != nil || p != CPUPeriodUs {
		// The kernel checks a new period against the quota in force:
		// lift the quota, then set the period.
		if err := writeFile(filepath.Join(c.cpu, "cpu.cfs_quota_us"), "-1"); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(c.cpu, "cpu.cfs_period_us"), strconv.Itoa(CPUPeriodUs)); err != nil {
			return err
		}
	}
	if millis == 0 {
		return writeFile(filepath.Join(c.cpu, "cpu.cfs_quota_us"), "-1")
	}
	return writeFile(filepath.Join(c.cpu, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10))
}

// ioWeightFile is the file that sets the I/O weight here ("" if none)
// and the format of its value.
func (c *Cgroup) ioWeightFile() (path string, v2Format bool) {
	if c.blkio == "" {
		return "", false
	}
	files := []string{"blkio.weight", "blkio.bfq.weight"}
	if c.v2 {
		files = []string{"io.weight", "io.bfq.weight"}
	}
	for _, f := range files {
		if p := filepath.Join(c.blkio, f); fileExists(p) {
			return p, c.v2
		}
	}
	return "", false
}

// setIOWeight writes the I/O weight (0: leave it).
func (c *Cgroup) setIOWeight(w int64) error {
	if w == 0 {
		return nil
	}
	path, v2Format := c.ioWeightFile()
	if path == "" {
		return fmt.Errorf("io weight: no io.weight, blkio.weight or blkio.bfq.weight here (the io/blkio controller or a weight-based I/O scheduler is missing): %w", errdefs.ErrNotSupported)
	}
	if !v2Format && w > 1000 {
		return fmt.Errorf("io weight %d: cgroup v1 takes 1-1000: %w", w, errdefs.ErrInvalidArgument)
	}
	v := strconv.FormatInt(w, 10)
	if v2Format {
		v = "default " + v
	}
	return writeFile(path, v)
}

func limitValue(v int64, unlimited string) string {
	if v <= 0 {
		return unlimited
	}
	return strconv.FormatInt(v, 10)
}

// SetLimits changes the cgroup's limits to res (0: unlimited; an
// IOWeight of 0 is left as it is), for instance to make room for
// processes the daemon keeps in the cgroup besides the sandbox's own.
// Lowering the memory limit below the current charge makes the kernel
// reclaim, and on v2 OOM-kill, or on v1 fail with EBUSY: callers lower
// it once what they made room for is gone.
func (c *Cgroup) SetLimits(res Resources) error {
	if err := res.check(); err != nil {
		return fmt.Errorf("limit cgroup %s: %w", c.name, err)
	}
	err := errors.Join(c.setMemory(res.MemoryMax), c.setPids(res.PidsMax), c.setCPU(res.CPUMillis), c.setIOWeight(res.IOWeight))
	if err != nil {
		return fmt.Errorf("limit cgroup %s: %w", c.name, err)
	}
	return nil
}

// readLimit reads a limit file holding a number or "max" ("-1" and v1's
// page-rounded huge number for unlimited), or v2's "default N" weight
// format; 0 means unlimited.
func readLimit(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) == 0 {
		return 0, &fs.PathError{Op: "parse", Path: path, Err: errors.New("empty")}
	}
	s := f[len(f)-1]
	if s == "max" || s == "-1" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, &fs.PathError{Op: "parse", Path: path, Err: err}
	}
	if n >= 1<<62 {
		return 0, nil
	}
	return n, nil
}

// readCPU reads the CPU limit in millicpus (0: unlimited).
func (c *Cgroup) readCPU() (int64, error) {
	if c.cpu == "" {
		return 0, nil
	}
	var quota, period int64
	if c.v2 {
		b, err := os.ReadFile(filepath.Join(c.cpu, "cpu.max"))
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return 0, fmt.Errorf("cpu.max: %q", b)
		}
		if f[0] == "max" {
			return 0, nil
		}
		if quota, err = strconv.ParseInt(f[0], 10, 64); err == nil {
			period, err = strconv.ParseInt(f[1], 10, 64)
		}
		if err != nil {
			return 0, fmt.Errorf("cpu.max: %w", err)
		}
	} else {
		q, err := readInt(filepath.Join(c.cpu, "cpu.cfs_quota_us"))
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if q < 0 {
			return 0, nil
		}
		if period, err = readInt(filepath.Join(c.cpu, "cpu.cfs_period_us")); err != nil {
			return 0, err
		}
		quota = q
	}
	if period <= 0 {
		return 0, fmt.Errorf("cpu period %d", period)
	}
	return quota * 1000 / period, nil
}

// Limits reads the cgroup's current limits (0: unlimited; IOWeight 0:
// no weight file here).
func (c *Cgroup) Limits() (Resources, error) {
	var res Resources
	read := func(dir, file string) (int64, error) {
		if dir == "" {
			return 0, nil
		}
		n, err := readLimit(filepath.Join(dir, file))
		if errors.Is(err, fs.ErrNotExist) && c.v2 {
			return 0, nil // the controller is not enabled here
		}
		return n, err
	}
	file, _ := c.memoryFile()
	var err error
	if res.MemoryMax, err = read(c.memory, file); err != nil {
		return Resources{}, fmt.Errorf("limits of cgroup %s: %w", c.name, err)
	}
	if res.PidsMax, err = read(c.pids, "pids.max"); err != nil {
		return Resources{}, fmt.Errorf("limits of cgroup %s: %w", c.name, err)
	}
	if res.CPUMillis, err = c.readCPU(); err != nil {
		return Resources{}, fmt.Errorf("limits of cgroup %s: %w", c.name, err)
	}
	if p, _ := c.ioWeightFile(); p != "" {
		if res.IOWeight, err = readLimit(p); err != nil {
			return Resources{}, fmt.Errorf("limits of cgroup %s: %w", c.name, err)
		}
	}
	return res, nil
}

// Drift is a limit of the cgroup that was not what the daemon wrote.
type Drift struct {
	Limit string // "memory", "pids", "cpu", "io_weight" or "devices"
	Want  string
	Got   string
}

func (d Drift) String() string { return fmt.Sprintf("%s: want %s, found %s", d.Limit, d.Want, d.Got) }

// Enforce compares the cgroup's limits with res (and, on v1, its device
// list with the allowed devices) and writes back every one that differs.
// It returns what differed, even when writing it back failed.
func (c *Cgroup) Enforce(res Resources) ([]Drift, error) {
	if err := res.check(); err != nil {
		return nil, fmt.Errorf("enforce limits of cgroup %s: %w", c.name, err)
	}
	got, err := c.Limits()
	if err != nil {
		return nil, fmt.Errorf("enforce: %w", err)
	}
	show := func(v int64) string {
		if v == 0 {
			return "unlimited"
		}
		return strconv.FormatInt(v, 10)
	}
	var drifts []Drift
	var errs []error
	// The kernel keeps a memory limit in pages.
	page := int64(os.Getpagesize())
	if want := res.MemoryMax &^ (page - 1); c.memory != "" && got.MemoryMax != want {
		drifts = append(drifts, Drift{"memory", show(want), show(got.MemoryMax)})
		errs = append(errs, c.setMemory(res.MemoryMax))
	}
	if c.pids != "" && got.PidsMax != res.PidsMax {
		drifts = append(drifts, Drift{"pids", show(res.PidsMax), show(got.PidsMax)})
		errs = append(errs, c.setPids(res.PidsMax))
	}
	if c.cpu != "" && got.CPUMillis != res.CPUMillis {
		drifts = append(drifts, Drift{"cpu", show(res.CPUMillis), show(got.CPUMillis)})
		errs = append(errs, c.setCPU(res.CPUMillis))
	}
	if res.IOWeight > 0 && got.IOWeight != res.IOWeight {
		drifts = append(drifts, Drift{"io_weight", show(res.IOWeight), show(got.IOWeight)})
		errs = append(errs, c.setIOWeight(res.IOWeight))
	}
	if !c.v2 && c.devices != "" {
		b, err := os.ReadFile(filepath.Join(c.devices, "devices.list"))
		if err != nil {
			errs = append(errs, err)
		} else if list := strings.Split(strings.TrimSpace(string(b)), "\n"); !slices.Equal(list, allowedDevices) {
			drifts = append(drifts, Drift{"devices", strings.Join(allowedDevices, ", "), strings.Join(list, ", ")})
			errs = append(errs, c.fixDevices(list))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return drifts, fmt.Errorf("enforce limits of cgroup %s: %w", c.name, err)
	}
	return drifts, nil
}
