package v1

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// MaxForks bounds ForkRequest.N: each fork is a sandbox with its own root
// and processes, so one request must not be able to ask for unbounded work.
const MaxForks = 1000

// The wire rules for names. The daemon checks them again where it uses
// the values; checking here lets the HTTP layer refuse a request before
// it starts any work or writes any status.
var (
	nameRE    = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$`)
	suiteRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`) // Debian policy 5.6.1
)

// ValidName checks the name of a sandbox, image or session: 1-63
// letters, digits, '.', '_' or '-', starting with a letter or digit.
func ValidName(kind, name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%s name %q: want 1-63 characters of letters, digits, '.', '_', '-', starting with a letter or digit", kind, name)
	}
	return nil
}

// ValidEnv checks environment variables: a key must be non-empty and hold
// neither '=' nor NUL, a value must hold no NUL. Anything else cannot be
// passed to execve as the caller meant it ("A=B" with key "A=B" and value
// "" would set A).
func ValidEnv(env map[string]string) error {
	for k, v := range env {
		switch {
		case k == "":
			return errors.New("env: empty variable name")
		case strings.ContainsAny(k, "=\x00"):
			return fmt.Errorf("env: variable name %q holds '=' or NUL", k)
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("env: value of %s holds NUL", k)
		}
	}
	return nil
}

func noNUL(what, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return fmt.Errorf("%s %q holds NUL", what, s)
	}
	return nil
}

// Validate checks what can be checked without the daemon's state.
func (r ForkRequest) Validate() error {
	if r.N < 1 || r.N > MaxForks {
		return fmt.Errorf("fork: n=%d: want 1..%d", r.N, MaxForks)
	}
	return nil
}

// Validate checks the kind and the options it takes. Kind auto ends the
// sandbox's turn, whose effects decide the kind: it takes no wait (a
// full checkpoint of a turn returns pending) and no keep; keep is a full
// checkpoint's.
func (r CheckpointRequest) Validate() error {
	switch r.Kind {
	case "", KindFS, KindFull, KindAuto:
	default:
		return fmt.Errorf("checkpoint kind %q: want fs, full or auto", r.Kind)
	}
	switch {
	case r.Kind == KindAuto && (r.Wait || r.Keep):
		return errors.New("checkpoint kind auto takes no --wait or --keep")
	case r.Keep && r.Kind != KindFull:
		return fmt.Errorf("--keep keeps a standby of a full checkpoint; this one is %q", r.Kind)
	}
	return nil
}

// Validate checks what can be checked without the daemon's state.
func (r SandboxCreateRequest) Validate() error {
	if r.Name != "" {
		if err := ValidName("sandbox", r.Name); err != nil {
			return err
		}
	}
	if err := noNUL("hostname", r.Hostname); err != nil {
		return err
	}
	if err := r.Resources.Validate(); err != nil {
		return err
	}
	if err := r.validSeccomp(); err != nil {
		return err
	}
	if err := ValidEnv(r.Secrets); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	return ValidEnv(r.Env)
}

// MinCPUMillis is the smallest CPU limit (the kernel refuses a quota
// below 1 ms per 100 ms period).
const MinCPUMillis = 10

// Validate checks the limits of a request: 0 (the daemon's default), -1
// (none) or a positive limit.
func (r Resources) Validate() error {
	for _, l := range []struct {
		name string
		v    int64
	}{{"memory_bytes", r.MemoryBytes}, {"pids", r.Pids}, {"cpu_millis", r.CPUMillis}, {"standby_budget_bytes", r.StandbyBudgetBytes}, {"disk_bytes", r.DiskBytes}} {
		if l.v < -1 {
			return fmt.Errorf("resources: %s=%d: want 0 (the daemon's default), -1 (none) or a limit", l.name, l.v)
		}
	}
	switch {
	case r.MemoryBytes > 0 && r.MemoryBytes < 1<<20:
		return fmt.Errorf("resources: memory_bytes=%d: want at least 1 MiB", r.MemoryBytes)
	case r.CPUMillis > 0 && r.CPUMillis < MinCPUMillis:
		return fmt.Errorf("resources: cpu_millis=%d: want at least %d", r.CPUMillis, MinCPUMillis)
	case r.IOWeight < 0 || r.IOWeight > 10000:
		return fmt.Errorf("resources: io_weight=%d: want 0 (the kernel's default) or 1-10000", r.IOWeight)
	}
	return nil
}

func (r SandboxCreateRequest) validSeccomp() error {
	switch {
	case r.Seccomp != "" && r.Seccomp != SeccompDefault && r.Seccomp != SeccompUnconfined && r.Seccomp != SeccompCustom:
		return fmt.Errorf("seccomp %q: want %s, %s or %s with a profile", r.Seccomp, SeccompDefault, SeccompUnconfined, SeccompCustom)
	case r.SeccompProfile == "" && r.Seccomp == SeccompCustom:
		return errors.New("seccomp: custom without a profile")
	case r.SeccompProfile != "" && r.Seccomp != "" && r.Seccomp != SeccompCustom:
		return fmt.Errorf("seccomp %q with a profile: want custom or nothing", r.Seccomp)
	case len(r.SeccompProfile) > MaxSeccompProfileBytes:
		return fmt.Errorf("seccomp profile: %d bytes, more than %d", len(r.SeccompProfile), MaxSeccompProfileBytes)
	case r.SeccompProfile != "" && !json.Valid([]byte(r.SeccompProfile)):
		return errors.New("seccomp profile: not JSON")
	}
	return nil
}

// Validate checks what can be checked without the daemon's state. No
// Args runs the image's default command.
func (r ExecRequest) Validate() error {
	for _, a := range r.Args {
		if err := noNUL("exec: argument", a); err != nil {
			return err
		}
	}
	if err := noNUL("exec: cwd", r.Cwd); err != nil {
		return err
	}
	if err := noNUL("exec: user", r.User); err != nil {
		return err
	}
	if r.TimeoutMS < 0 {
		return fmt.Errorf("exec: timeout_ms=%d: want 0 (none) or more", r.TimeoutMS)
	}
	return ValidEnv(r.Env)
}

// Validate checks what can be checked without the daemon's state.
func (r SessionRunRequest) Validate() error {
	if r.TimeoutMS < 0 {
		return fmt.Errorf("session: timeout_ms=%d: want 0 (none) or more", r.TimeoutMS)
	}
	return nil
}

// Validate checks the image's name, suite, packages and mirror (empty
// suite and mirror take the daemon's defaults).
func (r ImageBuildRequest) Validate() error {
	if err := ValidName("image", r.Name); err != nil {
		return err
	}
	if r.Suite != "" && !suiteRE.MatchString(r.Suite) {
		return fmt.Errorf("image build: bad suite %q", r.Suite)
	}
	for _, p := range r.Packages {
		if !packageRE.MatchString(p) {
			return fmt.Errorf("image build: bad package name %q", p)
		}
	}
	if r.Mirror != "" {
		u, err := url.Parse(r.Mirror)
		if err != nil || !(u.Scheme == "file" || (u.Scheme == "http" || u.Scheme == "https") && u.Host != "") {
			return fmt.Errorf("image build: bad mirror %q (want an http, https or file URL)", r.Mirror)
		}
	}
	return nil
}

// Validate checks the image's name and that a path is given.
func (r ImagePullRequest) Validate() error {
	if err := ValidName("image", r.Name); err != nil {
		return err
	}
	if r.Ref == "" {
		return errors.New("image pull: no reference")
	}
	return noNUL("image pull: reference", r.Ref)
}

func (r ImagePushRequest) Validate() error {
	if r.Ref == "" {
		return errors.New("image push: no reference")
	}
	return noNUL("image push: reference", r.Ref)
}

func (r CommitRequest) Validate() error { return ValidName("image", r.Name) }

func (r ImageImportRequest) Validate() error {
	if err := ValidName("image", r.Name); err != nil {
		return err
	}
	if r.Path == "" {
		return errors.New("image import: no path")
	}
	return noNUL("image import: path", r.Path)
}
