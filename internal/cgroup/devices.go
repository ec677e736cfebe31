// The v1 devices controller: the character devices a sandbox may use, set
// on creation and brought back by Enforce. (cgroup2's equivalent is the
// BPF filter in devfilter.go.)

package cgroup

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"

	"github.com/molt-sh/molt/internal/errdefs"
)

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

// fixDevices brings the device list back to allowedDevices. The kernel
// refuses "a" (all devices) in either file of a cgroup with children,
// and the leaf is one: the extra entries are denied one by one and the
// missing ones allowed. (With the leaf in place nothing can have set
// "a *:* rwm" either.)
func (c *Cgroup) fixDevices(list []string) error {
	if len(c.procs) > 0 && !c.legacy && slices.Contains(list, "a *:* rwm") {
		return fmt.Errorf("devices: %s allows every device: %w", c.devices, errdefs.ErrFailedPrecondition)
	}
	if c.legacy || !isDir(filepath.Join(c.devices, Leaf)) {
		return c.denyDevices()
	}
	var errs []error
	for _, e := range list {
		if e != "" && !slices.Contains(allowedDevices, e) {
			errs = append(errs, writeFile(filepath.Join(c.devices, "devices.deny"), e))
		}
	}
	for _, e := range allowedDevices {
		if !slices.Contains(list, e) {
			errs = append(errs, writeFile(filepath.Join(c.devices, "devices.allow"), e))
		}
	}
	return errors.Join(errs...)
}
