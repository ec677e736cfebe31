package meta

import (
	"fmt"
	"time"
)

// The turn log's records (bucket Turns) and what ending a turn reports.

// TurnRecord is a finished turn as the sandbox's turn log keeps it: the
// decision, and in order what the agent did (its commands with their
// output, and the LLM call that ended the turn), for replay in recovery.
type TurnRecord struct {
	TurnResult
	// Prev is the turn this one continues (0: none): turns form a tree,
	// since a rollback continues from an older turn. A recovery replays
	// the chain of Prev links that ends at its turn.
	Prev int `json:"prev,omitempty"`
	// Incomplete says why the record cannot be replayed (an output or
	// LLM response cut, the sandbox's recording limit reached).
	Incomplete string        `json:"incomplete,omitempty"`
	Started    time.Time     `json:"started"`
	Ended      time.Time     `json:"ended"`
	Commands   []TurnCommand `json:"commands,omitempty"`
	LLM        []LLMCall     `json:"llm,omitempty"`
	// SealedCommands[i] and SealedLLM[i], when not empty, hold the exact
	// text of Commands[i] (Command, Args, Stdout, Stderr) and LLM[i]
	// (Request, Response) sealed with the tenant's data key: written when
	// the clear fields were redacted, or always with encryption at rest
	// (the clear fields then empty). internal/turn, protect.go.
	SealedCommands [][]byte `json:"sealed_commands,omitempty"`
	SealedLLM      [][]byte `json:"sealed_llm,omitempty"`
}

// TurnResult is what ending a turn decided and did.
type TurnResult struct {
	Sandbox  string `json:"sandbox"`
	Turn     int    `json:"turn"`
	Decision string `json:"decision"`
	// Checkpoint is the checkpoint taken, or null for decision none.
	Checkpoint *string `json:"checkpoint"`
	// Head is the checkpoint whose state the sandbox is in after the
	// turn (the one taken, or for none the one before).
	Head    string      `json:"head,omitempty"`
	Reasons []string    `json:"reasons"`
	Effects TurnEffects `json:"effects"`
	// DecideMS is the time to collect and classify the effects; StallMS
	// the checkpoint's frozen window; DurationMS the whole call.
	DecideMS   float64 `json:"decide_ms"`
	StallMS    float64 `json:"stall_ms,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	// Pending is set while a full checkpoint is being stored.
	Pending bool `json:"pending,omitempty"`
}

// TurnEffects is what the inspector saw a sandbox's processes do during
// a turn.
type TurnEffects struct {
	Files     []FileEffect    `json:"files,omitempty"`
	Processes []ProcessEffect `json:"processes,omitempty"`
	Sockets   []SocketEffect  `json:"sockets,omitempty"`
	// LongLived lists processes alive across the turn boundary that
	// started, ended or ran during the turn.
	LongLived []LongLivedChange `json:"long_lived,omitempty"`
	Sessions  []SessionChange   `json:"sessions,omitempty"`
	// Unknown lists effects the inspector cannot see into (a mount, a
	// ptrace write, io_uring, lost events): they force a full checkpoint.
	Unknown []string `json:"unknown,omitempty"`
	// IgnoredFiles counts file effects dropped by the ignore list.
	IgnoredFiles int `json:"ignored_files,omitempty"`
	// Egress counts the turn's effect ledger records (sandboxes with
	// egress, or effects declared through the API).
	Egress *EgressCounts `json:"egress,omitempty"`
}

// EgressCounts counts what a turn's ledger records say left the sandbox.
type EgressCounts struct {
	// Connections are outbound TCP connections (HTTP, TLS and raw).
	Connections int `json:"connections"`
	Reads       int `json:"reads"`   // GET, HEAD, OPTIONS, DNS
	Effects     int `json:"effects"` // other HTTP methods, declared effects
	Opaque      int `json:"opaque"`  // TLS without inspection, raw TCP
	Denied      int `json:"denied,omitempty"`
	Replayed    int `json:"replayed,omitempty"`
	Blocked     int `json:"blocked,omitempty"`
}

// FileEffect is what happened to one path (relative to the sandbox root;
// "?" when the inspector could not resolve it).
type FileEffect struct {
	Path string   `json:"path"`
	Ops  []string `json:"ops"`
	FS   string   `json:"fs,omitempty"`
}

// ProcessEffect is a process spawned, exec'd or exited during a turn.
type ProcessEffect struct {
	Op   string `json:"op"`
	Pid  int    `json:"pid"`
	PPid int    `json:"ppid,omitempty"`
	Comm string `json:"comm"`
	Path string `json:"path,omitempty"`
}

// SocketEffect is a socket bound, listening, connected or accepted.
type SocketEffect struct {
	Op     string `json:"op"`
	Pid    int    `json:"pid"`
	Family string `json:"family"`
	Addr   string `json:"addr,omitempty"`
}

// LongLivedChange is a change of a process that outlives turns.
type LongLivedChange struct {
	Pid    int    `json:"pid"`
	Comm   string `json:"comm"`
	Change string `json:"change"` // started, exited, ran
}

// SessionChange is a session created, closed or changed during a turn.
type SessionChange struct {
	Name   string `json:"name"`
	Change string `json:"change"` // created, closed, changed
}

// TurnCommand is one command run in a sandbox during a turn.
type TurnCommand struct {
	Time    time.Time `json:"time"`
	Session string    `json:"session,omitempty"`
	Command string    `json:"command,omitempty"` // session text
	Args    []string  `json:"args,omitempty"`    // exec argv
	// Ident is the request's identity (a hash of what the agent asked
	// to run and how): a recovery's fast-forward matches on it.
	Ident string `json:"ident,omitempty"`
	// ExitCode is -1 when the stream ended without an exit status.
	ExitCode  int    `json:"exit_code"`
	Detached  bool   `json:"detached,omitempty"`
	Stdout    string `json:"stdout,omitempty"`
	Stderr    string `json:"stderr,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// Pid is a detached command's PID.
	Pid        int     `json:"pid,omitempty"`
	Signal     string  `json:"signal,omitempty"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	DurationMS float64 `json:"duration_ms,omitempty"`
	// Cut: the log kept only part of the output (Truncated is what the
	// agent was told); such a command cannot be replayed.
	Cut bool `json:"cut,omitempty"`
	// Replayed: answered from the record by a fast-forward.
	Replayed bool `json:"replayed,omitempty"`
}

// LLMCall is one call an agent made through its sandbox's LLM proxy.
type LLMCall struct {
	ID                int       `json:"id"`
	API               string    `json:"api"`
	Path              string    `json:"path"`
	Model             string    `json:"model,omitempty"`
	Stream            bool      `json:"stream,omitempty"`
	Status            int       `json:"status"`
	Request           string    `json:"request,omitempty"`
	RequestTruncated  bool      `json:"request_truncated,omitempty"`
	RequestSHA256     string    `json:"request_sha256,omitempty"`
	RequestBytes      int       `json:"request_bytes,omitempty"`
	ContentType       string    `json:"content_type,omitempty"`
	Response          string    `json:"response,omitempty"`
	ResponseTruncated bool      `json:"response_truncated,omitempty"`
	Started           time.Time `json:"started"`
	Ended             time.Time `json:"ended"`
	// GateWaitMS is how long the reply waited for the turn's checkpoint
	// to be captured: the latency molt added to this call.
	GateWaitMS float64 `json:"gate_wait_ms"`
	Error      string  `json:"error,omitempty"`
	// Replayed: answered from the record by a fast-forward.
	Replayed bool `json:"replayed,omitempty"`
}

// TurnKey is turn n of sandbox id's key in bucket Turns: its numbers
// zero-padded, so that keys sort as turns do.
func TurnKey(id string, n int) string { return fmt.Sprintf("%s/%09d", id, n) }
