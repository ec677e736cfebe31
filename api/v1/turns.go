package v1

import "time"

// Turn decisions: what a turn did to the OS, and so which checkpoint it
// needs.
const (
	// DecisionNone: nothing recovery-relevant changed; no checkpoint.
	DecisionNone = "none"
	// DecisionFS: files changed, no long-lived process did; an fs
	// checkpoint (processes come from the nearest full ancestor).
	DecisionFS = "fs"
	// DecisionFull: a long-lived process started, changed or ended (or
	// the inspector cannot rule it out); a full checkpoint.
	DecisionFull = "full"
)

// TurnRequest ends a sandbox's current turn.
type TurnRequest struct {
	// Ignore lists paths (relative to the sandbox root, as "/tmp/**",
	// "**/__pycache__/**" or "/var/log/*.log") whose changes do not
	// matter for recovery, in addition to the sandbox's own list.
	Ignore []string `json:"ignore,omitempty"`
	// DryRun decides without checkpointing; the turn does not end.
	DryRun bool `json:"dry_run,omitempty"`
	// Label labels the checkpoint, if one is taken.
	Label string `json:"label,omitempty"`
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

// TurnRecord is a finished turn as the sandbox's turn log keeps it: the
// decision, and in order what the agent did (its commands with their
// output, and the LLM call that ended the turn), for replay in recovery.
type TurnRecord struct {
	TurnResult
	// Prev is the turn this one continues (0: none); a rollback makes
	// the turns a tree, and a recovery replays one chain of it.
	Prev int `json:"prev,omitempty"`
	// Incomplete says why the record cannot be replayed.
	Incomplete string        `json:"incomplete,omitempty"`
	Started    time.Time     `json:"started"`
	Ended      time.Time     `json:"ended"`
	Commands   []TurnCommand `json:"commands,omitempty"`
	LLM        []LLMCall     `json:"llm,omitempty"`
}

// TurnCommand is one command run in a sandbox during a turn.
type TurnCommand struct {
	Time    time.Time `json:"time"`
	Session string    `json:"session,omitempty"`
	Command string    `json:"command,omitempty"` // session text
	Args    []string  `json:"args,omitempty"`    // exec argv
	// Ident is the request's identity, which a fast-forward matches.
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
	// Cut: the log kept only part of the output; the command cannot be
	// replayed.
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

// LLMEndpointRequest gives a sandbox an LLM endpoint.
type LLMEndpointRequest struct {
	// Upstream is the LLM API base URL calls are forwarded to.
	Upstream string `json:"upstream"`
	// Listen is the host address to serve on; default 127.0.0.1:0. It
	// must be a loopback address unless Expose is set.
	Listen string `json:"listen,omitempty"`
	// Expose allows a Listen address that is not loopback. The proxy adds
	// Header (the operator's credentials) to every call it forwards, so
	// whoever can reach the address can spend them.
	Expose bool `json:"expose,omitempty"`
	// Gate is "response" (default: the reply is held until the turn's
	// checkpoint is captured) or "exec" (the reply goes at once; the
	// next command waits instead).
	Gate string `json:"gate,omitempty"`
	// Header sets extra headers on upstream requests (e.g. Authorization).
	Header map[string]string `json:"header,omitempty"`
	// Ignore is the sandbox's ignore list for turn decisions.
	Ignore []string `json:"ignore,omitempty"`
	// Token, if set, is the endpoint's token (32 to 128 characters of
	// A-Z, a-z, 0-9, '-' and '_'); else a random one is made. A migration
	// passes the endpoint's own, so that the agent's URL keeps its token
	// on the target.
	Token string `json:"token,omitempty"`
}

// LLMEndpoint is a sandbox's LLM endpoint.
type LLMEndpoint struct {
	Sandbox string `json:"sandbox"`
	// URL is the base URL to give the agent. When the endpoint is set it
	// holds the endpoint's token (http://HOST:PORT/t/TOKEN/v1); reading
	// the endpoint back gives it without (the agent then sends the token
	// as its API key).
	URL      string `json:"url"`
	Upstream string `json:"upstream"`
	Gate     string `json:"gate"`
	// Token is the endpoint's secret, returned only when the endpoint is
	// set: every request must carry it, in URL's path or as the API key
	// (Authorization: Bearer, x-api-key or api-key).
	Token string `json:"token,omitempty"`
}
