package sbinit

import (
	"io"
	"os"
)

// PID1Socket is the abstract unix socket name the sandbox's pid1 listens
// on, in the sandbox's network namespace (private to the sandbox).
const PID1Socket = "molt-pid1"

// LegacySocket is where the Go init of sandboxes started by molt before
// pid1 (and restored from their checkpoints) serves the same requests as
// an Agent: a daemon still talks to them there.
const LegacySocket = "@molt-init"

// Config is what the daemon sends stage 1 on the sync socket.
type Config struct {
	// Root is the host path of the sandbox root.
	Root      string            `json:"root"`
	Hostname  string            `json:"hostname"`
	MachineID string            `json:"machine_id"`
	Env       map[string]string `json:"env,omitempty"`
	// RootMount says the root comes as a mount (an idmapped one, for a
	// sandbox with a user namespace) passed with the config's first byte
	// (SCM_RIGHTS), to be mounted on Root instead of binding Root.
	RootMount bool `json:"root_mount,omitempty"`
	// Seccomp is the compiled filter (seccomp.Program.Bytes) installed
	// right before pid1 is executed; empty: none.
	Seccomp []byte `json:"seccomp,omitempty"`
}

// Request is the first frame of every daemon connection.
type Request struct {
	Op string `json:"op"` // exec, session-run, session-close, status

	// exec
	Args      []string          `json:"args,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Detach    bool              `json:"detach,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"`

	// session-run, session-close
	Session string `json:"session,omitempty"`
	Command string `json:"command,omitempty"`
}

// Response answers non-streaming requests.
type Response struct {
	Error string `json:"error,omitempty"`
	// ErrorKind is v1.ErrKindNotFound or v1.ErrKindInvalidArgument when
	// it applies.
	ErrorKind string `json:"error_kind,omitempty"`

	Pid int `json:"pid,omitempty"`

	Stdout     string `json:"stdout,omitempty"`
	Stderr     string `json:"stderr,omitempty"`
	ExitCode   int    `json:"exit_code"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`

	Sessions []SessionInfo `json:"sessions,omitempty"`
}

// SessionInfo describes a live session.
type SessionInfo struct {
	Name string `json:"name"`
	Pid  int    `json:"pid"`
	// Digest identifies the session's shell state now; a session busy
	// with a call gets a digest equal to no other.
	Digest string `json:"digest,omitempty"`
}

// Arg1 is the argv[1] that selects stage 1 in the molt binary; Arg2
// selected the Go init of older sandboxes (LegacySocket).
const (
	Arg1 = "__molt_init1"
	Arg2 = "__molt_init2"
	// ArgHold selects a process that only holds its user namespace until
	// its stdin closes (sandbox.HoldUserNS).
	ArgHold = "__molt_userns_hold"
)

// InitPath is where pid1 lives inside a sandbox root.
const InitPath = "/.molt/init"

// RunIfInit runs the init stage that os.Args selects and never returns;
// it returns at once when the process is not a sandbox init. A binary
// that starts sandboxes (molt, or a test binary) calls it first thing in
// main or TestMain.
func RunIfInit() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case Arg1:
		Stage1()
	case ArgCgroupNS:
		CgroupNSHolder()
	case ArgHold:
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	case ArgLazyGuard:
		LazyGuard()
	}
}
