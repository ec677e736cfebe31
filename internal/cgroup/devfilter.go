package cgroup

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// cgroup2 has no devices controller: its device access control is a
// BPF_PROG_TYPE_CGROUP_DEVICE program attached to the cgroup, consulted
// on every open and mknod of a device node by a process in it (root
// included). molt attaches one to every sandbox cgroup it creates in the
// unified hierarchy, with the same list as the v1 devices controller
// (allowedDevices): on a v2 host it is the only device control, on a
// hybrid host it backs the v1 controller up.

// devRule is one entry of allowedDevices: a character device, a major
// and a minor (-1: any).
type devRule struct {
	major, minor int64
}

// parseDevRules turns allowedDevices ("c MAJ:MIN rwm") into rules. Only
// character devices with full access are listed there; anything else is
// a programming error.
func parseDevRules(list []string) ([]devRule, error) {
	var rules []devRule
	for _, s := range list {
		f := strings.Fields(s)
		if len(f) != 3 || f[0] != "c" || f[2] != "rwm" {
			return nil, fmt.Errorf("device rule %q: only \"c MAJ:MIN rwm\" is supported", s)
		}
		maj, min, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("device rule %q", s)
		}
		num := func(x string) (int64, error) {
			if x == "*" {
				return -1, nil
			}
			return strconv.ParseInt(x, 10, 32)
		}
		r := devRule{}
		var err error
		if r.major, err = num(maj); err != nil {
			return nil, fmt.Errorf("device rule %q: %w", s, err)
		}
		if r.minor, err = num(min); err != nil {
			return nil, fmt.Errorf("device rule %q: %w", s, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// BPF_DEVCG_DEV_CHAR: the low 16 bits of access_type.
const devcgDevChar = 2

// devFilterInsns is the program for rules: allow (R0 = 1) a character
// device a rule matches, deny (R0 = 0) everything else, block devices
// included. Its context is struct bpf_cgroup_dev_ctx { u32
// access_type; u32 major; u32 minor; }.
func devFilterInsns(rules []devRule) asm.Instructions {
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // access_type
		asm.And.Imm(asm.R2, 0xffff),              // device type
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // major
		asm.LoadMem(asm.R4, asm.R1, 8, asm.Word), // minor
		asm.JNE.Imm(asm.R2, devcgDevChar, "deny"),
	}
	for i, r := range rules {
		next := "deny"
		if i+1 < len(rules) {
			next = "rule" + strconv.Itoa(i+1)
		}
		var rule asm.Instructions
		if r.major >= 0 {
			rule = append(rule, asm.JNE.Imm(asm.R3, int32(r.major), next))
		}
		if r.minor >= 0 {
			rule = append(rule, asm.JNE.Imm(asm.R4, int32(r.minor), next))
		}
		rule = append(rule, asm.Mov.Imm(asm.R0, 1), asm.Return())
		rule[0] = rule[0].WithSymbol("rule" + strconv.Itoa(i))
		insns = append(insns, rule...)
	}
	return append(insns,
		asm.Mov.Imm(asm.R0, 0).WithSymbol("deny"),
		asm.Return(),
	)
}

// devFilter is the program, loaded once per daemon and attached to every
// sandbox cgroup (the kernel keeps it with each cgroup it is attached
// to).
var devFilter = sync.OnceValues(func() (*ebpf.Program, error) {
	rules, err := parseDevRules(allowedDevices)
	if err != nil {
		return nil, err
	}
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "molt_devices",
		Type:         ebpf.CGroupDevice,
		License:      "Apache-2.0",
		Instructions: devFilterInsns(rules),
	})
})

// AttachDeviceFilter attaches the device filter to the cgroup2
// directory dir. The attachment lasts as long as the cgroup: it needs no
// descriptor kept open, and survives a daemon restart.
func AttachDeviceFilter(dir string) error {
	prog, err := devFilter()
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) {
			return fmt.Errorf("cgroup2 device filter: %v: %w", err, errdefs.ErrNotSupported)
		}
		return fmt.Errorf("cgroup2 device filter: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup2 device filter: %w", err)
	}
	defer unix.Close(fd)
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target:  fd,
		Program: prog,
		Attach:  ebpf.AttachCGroupDevice,
	}); err != nil {
		return fmt.Errorf("cgroup2 device filter: attach to %s: %w", dir, err)
	}
	return nil
}
