package meta

import "time"

// What the engine reports that is not kept in a bucket: the host, and
// the results of a session call, a rollback and a fork. Their JSON names
// are those of the wire types of the time, for logs and tools that encode
// them; the wire format is api/v1's, converted by internal/httpapi.

// Host describes the host and what molt can and cannot do on it.
type Host struct {
	Version   string    `json:"version"`
	Kernel    string    `json:"kernel"`
	Root      string    `json:"root"`
	Pool      Pool      `json:"pool"`
	Cgroup    string    `json:"cgroup"`
	Features  []Feature `json:"features"`
	Sandboxes int       `json:"sandboxes"`
	Started   time.Time `json:"started"`
	// KeyID names the host key that signs this host's checkpoints and
	// store documents; PublicKey is its public half (host.pub's PEM),
	// what another host trusts (POST /v1/host/trusted-keys).
	KeyID     string `json:"key_id"`
	PublicKey string `json:"public_key"`
	// TrustedKeys name the keys whose signatures this host accepts
	// (its own among them).
	TrustedKeys []string `json:"trusted_keys"`
}

// Pool describes the btrfs storage pool.
type Pool struct {
	Dir       string `json:"dir"`
	Loop      bool   `json:"loop"`
	Backing   string `json:"backing,omitempty"`
	Device    string `json:"device,omitempty"`
	SizeBytes uint64 `json:"size_bytes"`
	FreeBytes uint64 `json:"free_bytes"`
	// NodeSize is the filesystem's metadata node size in bytes (set when
	// it was made; see molt daemon --pool-node-size).
	NodeSize int `json:"node_size"`
}

// Feature is one probed capability. When Supported is false, Reason says why.
type Feature struct {
	Name      string `json:"name"`
	Supported bool   `json:"supported"`
	Detail    string `json:"detail,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// SessionRunResult is the outcome of one session call.
type SessionRunResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	// TimedOut: the command was killed at its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
	// Truncated: output beyond the per-call limit was dropped.
	Truncated  bool  `json:"truncated,omitempty"`
	DurationMS int64 `json:"duration_ms"`
	// Replayed: answered from the turn log by a recovery's fast-forward.
	Replayed bool `json:"replayed,omitempty"`
}

// Migration is what a migration did (api/v1.MigrateResult).
type Migration struct {
	Sandbox     string
	Target      string
	Checkpoint  string
	Checkpoints int
	DowntimeMS  float64
	UploadMS    float64
	ResumeMS    float64
	// PrecopyMS and PrecopySentBytes: the memory sent to the store before
	// the freeze (the time, and the bytes it lacked).
	PrecopyMS        float64
	PrecopySentBytes int64
}

// RollbackResult reports how the rollback was done.
type RollbackResult struct {
	Sandbox    string  `json:"sandbox"`
	Checkpoint string  `json:"checkpoint"`
	Tier       string  `json:"tier"`
	DurationMS float64 `json:"duration_ms"`
	// ProcessesRestarted: the checkpoint held no process state, so the
	// sandbox's processes were stopped and its init started afresh.
	ProcessesRestarted bool   `json:"processes_restarted"`
	Note               string `json:"note,omitempty"`
	// Plan is what the rollback does to the effect ledger.
	Plan *RollbackPlan `json:"plan,omitempty"`
	// Compensation: see api/v1.RollbackResult.Compensation.
	Compensation *CompensationReport `json:"compensation,omitempty"`
}

// RollbackPlan: see api/v1.RollbackPlan.
type RollbackPlan struct {
	DryRun     bool             `json:"dry_run,omitempty"`
	Orphan     []string         `json:"orphan,omitempty"`
	Replay     []string         `json:"replay,omitempty"`
	Compensate []string         `json:"compensate,omitempty"`
	Block      []BlockedEffect  `json:"block,omitempty"`
	Decisions  []EffectDecision `json:"decisions,omitempty"`
}

// EffectDecision: see api/v1.EffectDecision.
type EffectDecision struct {
	ID     string `json:"id"`
	Kind   string `json:"kind,omitempty"`
	Policy string `json:"policy,omitempty"`
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
}

// BlockedEffect: see api/v1.BlockedEffect.
type BlockedEffect struct {
	ID        string   `json:"id"`
	Method    string   `json:"method,omitempty"`
	URL       string   `json:"url,omitempty"`
	Consumers []string `json:"consumers"`
	Reason    string   `json:"reason,omitempty"`
}

// ForkResult lists the new sandboxes.
type ForkResult struct {
	Checkpoint     string    `json:"checkpoint"`
	Sandboxes      []Sandbox `json:"sandboxes"`
	DurationMS     float64   `json:"duration_ms"`
	ForksPerSecond float64   `json:"forks_per_second"`
	// Reseeded counts the sessions reseeded over all forks.
	Reseeded int `json:"reseeded,omitempty"`
}

// RecoverResult is what a recovery did and what the fast-forward holds
// (see v1.RecoverResult).
type RecoverResult struct {
	Sandbox    string          `json:"sandbox"`
	Checkpoint string          `json:"checkpoint"`
	Turn       int             `json:"turn"`
	Turns      []int           `json:"turns"`
	LLMCalls   int             `json:"llm_calls"`
	Commands   int             `json:"commands"`
	Bytes      int64           `json:"bytes"`
	Rollback   *RollbackResult `json:"rollback,omitempty"`
	DryRun     bool            `json:"dry_run,omitempty"`
	Note       string          `json:"note,omitempty"`
}

// RecoveryStatus is where a sandbox's fast-forward stands.
type RecoveryStatus struct {
	Sandbox    string      `json:"sandbox"`
	State      string      `json:"state"`
	Checkpoint string      `json:"checkpoint,omitempty"`
	Turn       int         `json:"turn,omitempty"`
	Replayed   int         `json:"replayed"`
	Total      int         `json:"total"`
	Bytes      int64       `json:"bytes"`
	Divergence *Divergence `json:"divergence,omitempty"`
}

// Divergence is the first request of a fast-forward that did not match
// the record.
type Divergence struct {
	Turn     int       `json:"turn"`
	Index    int       `json:"index"`
	Expected string    `json:"expected"`
	Got      string    `json:"got"`
	At       time.Time `json:"at"`
}

// ChainVerification is a checkpoint's lineage as verified (see
// v1.ChainVerification).
type ChainVerification struct {
	Checkpoint string      `json:"checkpoint"`
	OK         bool        `json:"ok"`
	Links      []ChainLink `json:"links"`
	Key        string      `json:"key"`
	Trusted    []string    `json:"trusted"`
}

// ChainLink is one checkpoint of a verified lineage.
type ChainLink struct {
	ID      string `json:"id"`
	Parent  string `json:"parent,omitempty"`
	Key     string `json:"key,omitempty"`
	Problem string `json:"problem,omitempty"`
}
