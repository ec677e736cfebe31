package seccomp

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Action is a filter's return value (SECCOMP_RET_*, data in the low 16
// bits).
type Action uint32

// The actions a profile may use.
const (
	ActKillProcess Action = 0x80000000
	ActKillThread  Action = 0x00000000
	ActTrap        Action = 0x00030000
	ActErrnoBase   Action = 0x00050000
	ActTraceBase   Action = 0x7ff00000
	ActLog         Action = 0x7ffc0000
	ActAllow       Action = 0x7fff0000
)

// ActErrno fails the call with errno e.
func ActErrno(e unix.Errno) Action { return ActErrnoBase | Action(uint16(e)) }

// Op compares a system call argument.
type Op int

// The comparisons of the OCI format (SCMP_CMP_*), plus MaskedNE for
// molt's own profile.
const (
	OpEQ Op = iota
	OpNE
	OpLT
	OpLE
	OpGT
	OpGE
	OpMaskedEQ // arg & Value == ValueTwo
	OpMaskedNE // arg & Value != ValueTwo
)

// Cond is one argument condition. Comparisons are unsigned and on all
// 64 bits, as libseccomp makes them: a masked comparison with a mask
// below 2^32 ignores the upper half, which the kernel also ignores for
// int arguments.
type Cond struct {
	Index    uint // 0-5
	Op       Op
	Value    uint64
	ValueTwo uint64
}

// Rule gives an action to system calls whose arguments satisfy every
// condition.
type Rule struct {
	Names  []string
	Action Action
	Conds  []Cond
}

// Profile is a filter described as data.
type Profile struct {
	Default Action
	Rules   []Rule
}

// Modes of a sandbox's filter besides a custom profile.
const (
	ModeDefault    = "default"
	ModeUnconfined = "unconfined"
	ModeCustom     = "custom"
)

// MaxProfileBytes bounds the JSON of a custom profile.
const MaxProfileBytes = 1 << 20

// ParseOptions describe the sandbox a Docker-format profile's "includes"
// and "excludes" are matched against.
type ParseOptions struct {
	// Caps are the names (CAP_...) of the sandbox's capabilities.
	Caps []string
	// Kernel is the running kernel's release ("6.18.0"); "" treats every
	// minKernel as satisfied.
	Kernel string
}

type ociProfile struct {
	DefaultAction   string          `json:"defaultAction"`
	DefaultErrnoRet *uint           `json:"defaultErrnoRet"`
	Architectures   []string        `json:"architectures"`
	ArchMap         json.RawMessage `json:"archMap"`
	Flags           []string        `json:"flags"`
	ListenerPath    string          `json:"listenerPath"`
	Syscalls        []ociSyscall    `json:"syscalls"`
}

type ociSyscall struct {
	Name     string     `json:"name"` // older Docker profiles
	Names    []string   `json:"names"`
	Action   string     `json:"action"`
	ErrnoRet *uint      `json:"errnoRet"`
	Args     []ociArg   `json:"args"`
	Comment  string     `json:"comment"`
	Includes *ociFilter `json:"includes"`
	Excludes *ociFilter `json:"excludes"`
}

type ociArg struct {
	Index    uint   `json:"index"`
	Value    uint64 `json:"value"`
	ValueTwo uint64 `json:"valueTwo"`
	Op       string `json:"op"`
}

type ociFilter struct {
	Arches    []string `json:"arches"`
	Caps      []string `json:"caps"`
	MinKernel string   `json:"minKernel"`
}

var ociOps = map[string]Op{
	"SCMP_CMP_EQ": OpEQ, "SCMP_CMP_NE": OpNE, "SCMP_CMP_LT": OpLT, "SCMP_CMP_LE": OpLE,
	"SCMP_CMP_GT": OpGT, "SCMP_CMP_GE": OpGE, "SCMP_CMP_MASKED_EQ": OpMaskedEQ,
}

// ParseOCI reads a profile in the Docker/OCI JSON format (defaultAction,
// defaultErrnoRet, architectures, syscalls with names, action, errnoRet
// and args; Docker's includes/excludes are matched against opts). Names
// unknown on x86-64 are skipped, as runc skips them; the architectures
// listed do not matter: the program only admits x86-64 calls.
func ParseOCI(data []byte, opts ParseOptions) (*Profile, error) {
	if len(data) > MaxProfileBytes {
		return nil, fmt.Errorf("seccomp profile: %d bytes, more than %d", len(data), MaxProfileBytes)
	}
	var op ociProfile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&op); err != nil {
		return nil, fmt.Errorf("seccomp profile: %w", err)
	}
	if op.ListenerPath != "" {
		return nil, errors.New("seccomp profile: listenerPath (SCMP_ACT_NOTIFY) is not supported")
	}
	for _, f := range op.Flags {
		if f != "SECCOMP_FILTER_FLAG_SPEC_ALLOW" && f != "SECCOMP_FILTER_FLAG_LOG" {
			return nil, fmt.Errorf("seccomp profile: flag %q is not supported", f)
		}
	}
	p := &Profile{}
	var err error
	if p.Default, err = ociAction(op.DefaultAction, op.DefaultErrnoRet); err != nil {
		return nil, fmt.Errorf("seccomp profile: defaultAction: %w", err)
	}
	for i, sc := range op.Syscalls {
		names := sc.Names
		if sc.Name != "" {
			names = append(slices.Clone(names), sc.Name)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("seccomp profile: syscalls[%d]: no names", i)
		}
		if !matches(sc.Includes, sc.Excludes, opts) {
			continue
		}
		r := Rule{Names: names}
		if r.Action, err = ociAction(sc.Action, sc.ErrnoRet); err != nil {
			return nil, fmt.Errorf("seccomp profile: syscalls[%d]: %w", i, err)
		}
		for _, a := range sc.Args {
			o, ok := ociOps[a.Op]
			if !ok {
				return nil, fmt.Errorf("seccomp profile: syscalls[%d]: unknown op %q", i, a.Op)
			}
			if a.Index > 5 {
				return nil, fmt.Errorf("seccomp profile: syscalls[%d]: argument index %d: want 0-5", i, a.Index)
			}
			r.Conds = append(r.Conds, Cond{Index: a.Index, Op: o, Value: a.Value, ValueTwo: a.ValueTwo})
		}
		p.Rules = append(p.Rules, r)
	}
	return p, nil
}

func ociAction(name string, errnoRet *uint) (Action, error) {
	data := func(def uint) (Action, error) {
		e := def
		if errnoRet != nil {
			e = *errnoRet
		}
		if e > 0xffff {
			return 0, fmt.Errorf("errnoRet %d out of range", e)
		}
		return Action(e), nil
	}
	switch name {
	case "SCMP_ACT_ALLOW":
		return ActAllow, nil
	case "SCMP_ACT_ERRNO":
		d, err := data(uint(unix.EPERM))
		return ActErrnoBase | d, err
	case "SCMP_ACT_TRACE":
		d, err := data(0)
		return ActTraceBase | d, err
	case "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD":
		return ActKillThread, nil
	case "SCMP_ACT_KILL_PROCESS":
		return ActKillProcess, nil
	case "SCMP_ACT_TRAP":
		return ActTrap, nil
	case "SCMP_ACT_LOG":
		return ActLog, nil
	case "SCMP_ACT_NOTIFY":
		return 0, errors.New("SCMP_ACT_NOTIFY is not supported")
	}
	return 0, fmt.Errorf("unknown action %q", name)
}

// matches applies Docker's includes/excludes to a rule.
func matches(inc, exc *ociFilter, opts ParseOptions) bool {
	arch := func(list []string) bool {
		return slices.ContainsFunc(list, func(a string) bool { return a == "amd64" || a == "x86_64" || a == "SCMP_ARCH_X86_64" })
	}
	if inc != nil {
		if len(inc.Arches) > 0 && !arch(inc.Arches) {
			return false
		}
		for _, c := range inc.Caps {
			if !slices.Contains(opts.Caps, c) {
				return false
			}
		}
		if inc.MinKernel != "" && opts.Kernel != "" && kernelLess(opts.Kernel, inc.MinKernel) {
			return false
		}
	}
	if exc != nil {
		if arch(exc.Arches) {
			return false
		}
		for _, c := range exc.Caps {
			if slices.Contains(opts.Caps, c) {
				return false
			}
		}
		if exc.MinKernel != "" && opts.Kernel != "" && !kernelLess(opts.Kernel, exc.MinKernel) {
			return false
		}
	}
	return true
}

// kernelLess says whether release a is older than b (major.minor).
func kernelLess(a, b string) bool {
	parse := func(s string) (int, int) {
		f := strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' })
		var v [2]int
		for i := 0; i < 2 && i < len(f); i++ {
			v[i], _ = strconv.Atoi(f[i])
		}
		return v[0], v[1]
	}
	am, an := parse(a)
	bm, bn := parse(b)
	return am < bm || am == bm && an < bn
}

// ForMode compiles the program a sandbox's filter setting asks for:
// mode ModeDefault or ModeUnconfined (nil: no filter), or ModeCustom
// with profile, a Docker/OCI-format JSON profile.
func ForMode(mode string, profile []byte, opts ParseOptions) (Program, error) {
	switch mode {
	case ModeDefault:
		return Compile(Default())
	case ModeUnconfined:
		return nil, nil
	case ModeCustom:
		p, err := ParseOCI(profile, opts)
		if err != nil {
			return nil, err
		}
		return Compile(p)
	}
	return nil, fmt.Errorf("seccomp mode %q: want default, unconfined or a profile", mode)
}
