// Package v1 holds the JSON wire types of molt's REST API, version 1.
//
// The API grows by addition only: fields are never removed or renamed, and
// a client must ignore fields it does not know. Standard library only, so
// any Go program can import it without pulling in molt's internals.
package v1

import "time"

// Sandbox states.
const (
	StateCreating   = "creating"
	StateRunning    = "running"
	StateStopped    = "stopped"
	StateHibernated = "hibernated"
	// StateLost: molt's record exists but the sandbox's processes are gone
	// for a reason molt did not cause (host reboot, init killed). Reason
	// says why; the sandbox can be started again or removed.
	StateLost = "lost"
)

// Checkpoint kinds.
const (
	KindFS   = "fs"
	KindFull = "full"
	KindAuto = "auto"
)

// Rollback tiers.
const (
	TierHot  = "hot"
	TierWarm = "warm"
	TierCold = "cold"
	// TierRestart: files were rolled back and the processes restarted
	// (the checkpoint holds no process state).
	TierRestart = "restart"
)

// Error is the body of every non-2xx response.
type Error struct {
	// Kind is one of the ErrKind constants (errors.go): not_found,
	// already_exists, invalid_argument, failed_precondition, unavailable,
	// not_supported, resource_exhausted (no space left beyond the
	// daemon's reserve; HTTP 507), method_not_allowed, internal.
	Kind    string `json:"kind"`
	Message string `json:"message"`
	// Candidates, on an ambiguous reference (invalid_argument), are
	// references that each name one of the objects it matched (for a
	// checkpoint label: SANDBOX:LABEL).
	Candidates []string `json:"candidates,omitempty"`
}

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

// Resources limits a sandbox.
//
// In a request, 0 (or an omitted field) takes the daemon's default
// (molt daemon --default-memory, --default-pids, --default-cpus) and -1
// asks for no limit. In a Sandbox, Resources are the limits in force: a
// positive value is the limit, -1 (or 0, in a sandbox created before
// defaults existed) means none.
type Resources struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int64 `json:"pids,omitempty"`
	// CPUMillis is the CPU bandwidth in thousandths of a CPU: 1500 lets
	// the sandbox use one and a half CPUs' worth of time (cgroup
	// cpu.max / cpu.cfs_quota_us over a 100 ms period); at least 10.
	CPUMillis int64 `json:"cpu_millis,omitempty"`
	// IOWeight is the sandbox's proportional share of block I/O
	// (cgroup v2 io.weight, 1-10000, 100 being the kernel's default;
	// cgroup v1 blkio.weight or blkio.bfq.weight, 1-1000). 0 leaves the
	// kernel's default; a host without a weight file refuses any other
	// value (not_supported).
	IOWeight int64 `json:"io_weight,omitempty"`
	// StandbyBudgetBytes bounds the memory of the sandbox's standbys
	// (pre-restored checkpoints for hot rollback, counted by the size of
	// their images) within the host's standby budget: 0 takes the
	// daemon's default per-sandbox budget, -1 allows none.
	StandbyBudgetBytes int64 `json:"standby_budget_bytes,omitempty"`
	// DiskBytes bounds what the sandbox's root and its checkpoints'
	// files hold together (a btrfs qgroup): writes past it fail with
	// EDQUOT inside the sandbox. 0 takes the daemon's default
	// (--default-disk), -1 asks for none.
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// LimitsTampered is one time the daemon found a sandbox's cgroup limits
// changed behind its back (at a checkpoint or a restore) and wrote them
// back.
type LimitsTampered struct {
	Time time.Time `json:"time"`
	// When is the operation that found it: "checkpoint" or "restore".
	When string `json:"when"`
	// Limits lists each limit found changed: "pids: want 4096, found
	// unlimited".
	Limits []string `json:"limits"`
}

// SandboxCreateRequest creates a sandbox from an image.
type SandboxCreateRequest struct {
	// Tenant owns the new sandbox: the token's tenant for a tenant's
	// token (whatever is sent); the host admin may name any tenant.
	Tenant   string            `json:"tenant,omitempty"`
	Image    string            `json:"image"`
	Name     string            `json:"name,omitempty"`
	Hostname string            `json:"hostname,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// Secrets are environment variables passed by reference: every
	// process of the sandbox gets them as Env's, but the daemon stores
	// their values only sealed with the tenant's data key, never shows
	// them, and redacts them from the turn log and the effect ledger.
	// They are sent once, with this request.
	Secrets   map[string]string `json:"secrets,omitempty"`
	Resources Resources         `json:"resources,omitempty"`
	// Seccomp selects the system call filter of every process of the
	// sandbox: SeccompDefault (molt's profile, docs/security.md),
	// SeccompUnconfined (none), SeccompCustom with SeccompProfile, or
	// "" for the daemon's default (or custom, when SeccompProfile is
	// set). Forks keep their sandbox's filter.
	Seccomp string `json:"seccomp,omitempty"`
	// SeccompProfile is a seccomp profile in the Docker/OCI JSON format:
	// its content, at most MaxSeccompProfileBytes (the daemon never
	// reads a path of the client's).
	SeccompProfile string `json:"seccomp_profile,omitempty"`
	// Network is NetworkNone ("" too: loopback only) or NetworkEgress:
	// a veth into molt's router, an address from the host's range, DNS,
	// and TCP through molt's egress proxy, every effect in the ledger.
	Network string `json:"network,omitempty"`
	// Egress is the policy of a sandbox with NetworkEgress.
	Egress *EgressPolicy `json:"egress,omitempty"`
	// RecordLimit bounds, in bytes, the command output and LLM
	// exchanges the sandbox's turn log keeps for recovery (0: the
	// daemon's default); past it turns are recorded cut and a recovery
	// cannot fast-forward through them.
	RecordLimit int64 `json:"record_limit,omitempty"`
	// EffectPolicy says, per kind of effect, what a rollback that would
	// orphan a committed effect of that kind does: EffectRefuse,
	// EffectCompensate or EffectAllow. Kinds: "http" (proxied HTTP and
	// inspected HTTPS), "opaque" (TLS, raw TCP and UDP), "declared"
	// (effects declared through the API), a declared effect's own Type,
	// or "*" (any). The most specific kind an effect has wins (its Type,
	// then declared, http or opaque, then *); an effect no kind names
	// gets the default: compensated when it has a compensator, blocking
	// when others consumed it without one, else orphaned.
	EffectPolicy map[string]string `json:"effect_policy,omitempty"`
}

// The values of EffectPolicy.
const (
	// EffectRefuse: orphaning a committed effect of the kind refuses the
	// rollback (conflict) unless forced.
	EffectRefuse = "refuse"
	// EffectCompensate: it is compensated; one without a compensator
	// refuses the rollback unless forced.
	EffectCompensate = "compensate"
	// EffectAllow: it is orphaned (answered from the ledger if sent
	// again) and never blocks.
	EffectAllow = "allow"
)

// The values of Network.
const (
	NetworkNone   = "none"
	NetworkEgress = "egress"
)

// EgressPolicy is what a sandbox may reach and how its effects are
// treated (docs/egress.md). Domains match the name and its subdomains.
type EgressPolicy struct {
	AllowDomains []string `json:"allow_domains,omitempty"`
	DenyDomains  []string `json:"deny_domains,omitempty"`
	AllowCIDRs   []string `json:"allow_cidrs,omitempty"`
	DenyCIDRs    []string `json:"deny_cidrs,omitempty"`
	// HTTPPorts are ports beyond 80 whose TCP is parsed as HTTP.
	HTTPPorts []uint16 `json:"http_ports,omitempty"`
	// Inspect terminates TLS with the sandbox's own CA (installed in its
	// trust store) and records HTTPS requests like HTTP ones.
	Inspect bool `json:"inspect,omitempty"`
	// OnDivergence is DivergeForward ("" too) or DivergeBlock: what
	// happens to an effect that matches nothing recorded while a
	// rolled-back sandbox still has effects to replay.
	OnDivergence string `json:"on_divergence,omitempty"`
	// IgnoreHeaders and IgnoreJSONFields are left out when requests are
	// compared for replay (beyond the defaults: Date, tracing headers).
	IgnoreHeaders    []string `json:"ignore_headers,omitempty"`
	IgnoreJSONFields []string `json:"ignore_json_fields,omitempty"`
}

// The values of EgressPolicy.OnDivergence.
const (
	DivergeForward = "forward"
	DivergeBlock   = "block"
)

// The values of Seccomp.
const (
	SeccompDefault    = "default"
	SeccompUnconfined = "unconfined"
	SeccompCustom     = "custom"
)

// MaxSeccompProfileBytes bounds SandboxCreateRequest.SeccompProfile.
const MaxSeccompProfileBytes = 1 << 20

// Sandbox is a sandbox as the API reports it.
type Sandbox struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	// Tenant owns the sandbox ("": the host's own).
	Tenant   string `json:"tenant,omitempty"`
	Image    string `json:"image"`
	Hostname string `json:"hostname"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	// Offloaded says a hibernated sandbox's checkpoint and files are
	// in the object store only (molt hibernate --offload): a resume, here
	// or on any daemon sharing the store, fetches them.
	Offloaded bool      `json:"offloaded,omitempty"`
	Created   time.Time `json:"created"`
	Pid       int       `json:"pid,omitempty"`
	// EnvNames are the names of the sandbox's environment variables;
	// their values are never returned (they may be credentials). Secrets
	// are the names of those passed by reference.
	EnvNames  []string  `json:"env_names,omitempty"`
	Secrets   []string  `json:"secrets,omitempty"`
	Resources Resources `json:"resources,omitempty"`
	// Seccomp is the sandbox's system call filter: SeccompDefault,
	// SeccompUnconfined or SeccompCustom.
	Seccomp string `json:"seccomp,omitempty"`
	// Head is the checkpoint the sandbox last rolled back to or was
	// created from; new checkpoints get it as parent.
	Head string `json:"head,omitempty"`
	// ForkedFrom is the checkpoint a forked sandbox started from.
	ForkedFrom string `json:"forked_from,omitempty"`
	// Standby is set when a pre-restored standby of the sandbox's head
	// is ready (a rollback to it is hot); Standbys lists every checkpoint
	// of the sandbox with one.
	Standby  string   `json:"standby,omitempty"`
	Standbys []string `json:"standbys,omitempty"`
	// StandbyBytes is the memory its standbys hold (by image size),
	// against the sandbox's and the host's standby budgets.
	StandbyBytes int64     `json:"standby_bytes,omitempty"`
	Sessions     []Session `json:"sessions,omitempty"`
	MemoryBytes  int64     `json:"memory_bytes,omitempty"`
	Processes    int       `json:"processes,omitempty"`
	// DiskUsedBytes is what the sandbox's root and checkpoints hold
	// against its disk quota (Resources.DiskBytes); omitted without one.
	DiskUsedBytes int64 `json:"disk_used_bytes,omitempty"`
	// LimitsTampered counts the times the daemon found the sandbox's
	// limits changed behind its back and restored them; LastTampered is
	// the latest.
	LimitsTampered int             `json:"limits_tampered,omitempty"`
	LastTampered   *LimitsTampered `json:"last_tampered,omitempty"`
	// Network is NetworkNone or NetworkEgress; Address is the
	// sandbox's address with egress.
	Network string        `json:"network,omitempty"`
	Address string        `json:"address,omitempty"`
	Egress  *EgressPolicy `json:"egress,omitempty"`
	// EffectPolicy is the create request's (see SandboxCreateRequest).
	EffectPolicy map[string]string `json:"effect_policy,omitempty"`
	// Compensation is how the compensations of the sandbox's last
	// rollback that had any went (a failure stays here until the next).
	Compensation *CompensationReport `json:"compensation,omitempty"`
}

// CompensationReport is how a rollback's compensations went.
type CompensationReport struct {
	// Checkpoint is the rollback's target.
	Checkpoint string `json:"checkpoint"`
	// State is "compensating" (under way, or to resume after a daemon
	// restart), "compensated" (all of them) or "failed" (some failed:
	// the world still has those effects, orphaned).
	State       string   `json:"state"`
	Compensated []string `json:"compensated,omitempty"`
	// Failed lists the effects whose compensation failed, and why.
	Failed []FailedCompensation `json:"failed,omitempty"`
	At     time.Time            `json:"at"`
}

// The values of CompensationReport.State.
const (
	CompensationRunning = "compensating"
	CompensationDone    = "compensated"
	CompensationFailed  = "failed"
)

// FailedCompensation is an effect whose compensation failed.
type FailedCompensation struct {
	ID       string `json:"id"`
	Attempts int    `json:"attempts,omitempty"`
	Error    string `json:"error"`
}

// Effect is one record of a sandbox's effect ledger: something that
// left the sandbox (an HTTP request, a TLS or TCP connection, a DNS
// lookup) or was declared through the API.
type Effect struct {
	ID         string `json:"id"`
	Seq        uint64 `json:"seq"`
	Prev       string `json:"prev,omitempty"`
	Sandbox    string `json:"sandbox"`
	Origin     string `json:"origin,omitempty"`
	Turn       int    `json:"turn,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	// Kind is "read", "effect" or "opaque"; State "pending",
	// "completed", "failed", "denied", "blocked", "replayed" or
	// "refused".
	Kind           string              `json:"kind"`
	State          string              `json:"state"`
	Proto          string              `json:"proto"`
	Method         string              `json:"method,omitempty"`
	URL            string              `json:"url,omitempty"`
	Host           string              `json:"host,omitempty"`
	Addr           string              `json:"addr,omitempty"`
	BodyHash       string              `json:"body_hash,omitempty"`
	IdempotencyKey string              `json:"idempotency_key,omitempty"`
	Status         int                 `json:"status,omitempty"`
	ResponseHeader map[string][]string `json:"response_header,omitempty"`
	ResponseBody   []byte              `json:"response_body,omitempty"`
	ResponseBytes  int64               `json:"response_bytes,omitempty"`
	BytesOut       int64               `json:"bytes_out,omitempty"`
	BytesIn        int64               `json:"bytes_in,omitempty"`
	Answers        []string            `json:"answers,omitempty"`
	Error          string              `json:"error,omitempty"`
	ReplayOf       string              `json:"replay_of,omitempty"`
	// Orphan: the world has this effect but the sandbox's current state
	// does not (it was rolled back past it) and it was not replayed.
	Orphan      bool         `json:"orphan,omitempty"`
	Declared    bool         `json:"declared,omitempty"`
	Type        string       `json:"type,omitempty"`
	Compensator *Compensator `json:"compensator,omitempty"`
	// DependsOn: the earlier effects this one depends on (see
	// EffectDeclareRequest); empty when it declared none.
	DependsOn []string `json:"depends_on,omitempty"`
	// Compensation is where undoing the effect is, after a rollback
	// orphaned it.
	Compensation *Compensation `json:"compensation,omitempty"`
	// Consumers acted on the effect (see EffectConsumeRequest).
	Consumers []Consumer `json:"consumers,omitempty"`
	Started   time.Time  `json:"started"`
	Finished  time.Time  `json:"finished,omitzero"`
}

// Consumer is someone who acted on an effect.
type Consumer struct {
	By   string    `json:"by"`
	Note string    `json:"note,omitempty"`
	At   time.Time `json:"at"`
}

// Compensator undoes an effect: an HTTP request (Method, URL, Header,
// Body; a 2xx answer means compensated), sent by the daemon into the
// sandbox's world with the header Idempotency-Key:
// molt-compensate-<effect ID>, or a command run in a helper sandbox
// (Sandbox, a name or ID, running; Command; exit status 0 means
// compensated). Compensators must be idempotent: one a crash
// interrupted is run again.
type Compensator struct {
	Method  string              `json:"method,omitempty"`
	URL     string              `json:"url,omitempty"`
	Header  map[string][]string `json:"header,omitempty"`
	Body    []byte              `json:"body,omitempty"`
	Sandbox string              `json:"sandbox,omitempty"`
	Command []string            `json:"command,omitempty"`
}

// Compensation is where undoing an effect is.
type Compensation struct {
	// State is "planned", "compensating" (attempt Attempts under way),
	// "retrying" (attempt Attempts failed with Error, another follows),
	// "compensated", "failed" (Error says why) or "cancelled" (the
	// rollback did not happen).
	State string `json:"state"`
	// Rollback is the checkpoint whose rollback orphaned the effect.
	Rollback string    `json:"rollback,omitempty"`
	Attempts int       `json:"attempts,omitempty"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// EffectDeclareRequest declares an effect that did not cross molt's
// proxy (an agent's own tool call outside the sandbox). Kind defaults
// to "effect"; State to "completed".
type EffectDeclareRequest struct {
	Kind           string       `json:"kind,omitempty"`
	State          string       `json:"state,omitempty"`
	Method         string       `json:"method,omitempty"`
	URL            string       `json:"url,omitempty"`
	Host           string       `json:"host,omitempty"`
	Body           []byte       `json:"body,omitempty"`
	IdempotencyKey string       `json:"idempotency_key,omitempty"`
	Status         int          `json:"status,omitempty"`
	ResponseBody   []byte       `json:"response_body,omitempty"`
	Compensator    *Compensator `json:"compensator,omitempty"`
	// Type names what the effect is ("payment", "email"): an
	// EffectPolicy may name it.
	Type string `json:"type,omitempty"`
	// DependsOn lists earlier effects of the sandbox this one depends
	// on: a rollback compensates dependents first, and does not
	// compensate an effect whose dependent's compensation failed. null
	// (omitted): it may depend on every earlier effect; [] on none.
	DependsOn []string `json:"depends_on"`
}

// Session is a persistent shell inside a sandbox.
type Session struct {
	Name  string `json:"name"`
	Pid   int    `json:"pid"`
	Alive bool   `json:"alive"`
}

// ExecRequest starts a command in a sandbox. The HTTP request upgrades to
// a framed stream (see stream.go) unless Detach is set.
type ExecRequest struct {
	Args []string          `json:"args"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	// User is a name or uid[:gid] inside the sandbox; default root.
	User string `json:"user,omitempty"`
	// TimeoutMS kills the command after this long; 0 = none.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Detach leaves the command running in the background; output goes to
	// /dev/null and the call returns its PID at once.
	Detach bool `json:"detach,omitempty"`
	// Stdin, when false, gives the command /dev/null as stdin.
	Stdin bool `json:"stdin,omitempty"`
	// Aside runs the command beside the agent (an operator's look):
	// it is not recorded in the turn log, and a recovery's
	// fast-forward neither answers nor matches it.
	Aside bool `json:"aside,omitempty"`
}

// ExecDetached is the response to a detached exec.
type ExecDetached struct {
	Pid int `json:"pid"`
}

// SessionRunRequest runs shell text in a persistent session.
type SessionRunRequest struct {
	Command   string `json:"command"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	// Aside: as ExecRequest.Aside.
	Aside bool `json:"aside,omitempty"`
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
	// Replayed: a recovery's fast-forward answered from the turn log;
	// the command did not run again.
	Replayed bool `json:"replayed,omitempty"`
}

// CheckpointRequest takes a checkpoint of a sandbox.
type CheckpointRequest struct {
	Kind  string `json:"kind,omitempty"`
	Label string `json:"label,omitempty"`
	// Wait returns only once the checkpoint is committed (a full
	// checkpoint is otherwise returned pending, right after its
	// consistent instant is captured).
	Wait bool `json:"wait,omitempty"`
	// Keep asks to keep a standby ready for this full checkpoint (hot
	// rollback to it) even when it is no longer the sandbox's head,
	// within the standby budget.
	Keep bool `json:"keep,omitempty"`
}

// StallParts are the parts of a full checkpoint's frozen window (ms).
// The snapshot runs next to CRIU, so the parts overlap; the stall is
// about the protection plus the longer of the other two.
type StallParts struct {
	// ProtectMS is the write protection of a copy-on-write capture
	// (0 for a copy).
	ProtectMS float64 `json:"protect_ms,omitempty"`
	// CRIUMS is how long CRIU held the tree (its own statistics).
	CRIUMS float64 `json:"criu_ms"`
	// SnapshotMS is the read-only btrfs snapshot of the root.
	SnapshotMS float64 `json:"snapshot_ms"`
	// CopyMS is a template capture's copying of the tree (seizing every
	// process, a copy of each, letting them go; 0 otherwise). Its
	// processes' dumps run after the thaw.
	CopyMS float64 `json:"copy_ms,omitempty"`
}

// Checkpoint is one node of a sandbox's checkpoint tree.
type Checkpoint struct {
	ID      string    `json:"id"`
	Sandbox string    `json:"sandbox"`
	Parent  string    `json:"parent,omitempty"`
	Kind    string    `json:"kind"`
	Label   string    `json:"label,omitempty"`
	Created time.Time `json:"created"`
	// StallMS is how long the sandbox was frozen.
	StallMS    float64 `json:"stall_ms"`
	DurationMS float64 `json:"duration_ms"`
	// Capture is how a full checkpoint took the processes' memory:
	// "copy" (CRIU copied every page while the sandbox was frozen),
	// "copy-on-write" (the memory was write-protected in the frozen
	// window and its pages copied after the thaw) or "template" (each
	// process was copied in the frozen window, and CRIU dumped the
	// copies after the thaw). CaptureNote says why a sandbox with enough
	// memory to gain from those was captured another way (a process with
	// threads, memory shared between processes, a socket, ...).
	Capture     string `json:"capture,omitempty"`
	CaptureNote string `json:"capture_note,omitempty"`
	// StallParts says where a full checkpoint's stall went.
	StallParts *StallParts `json:"stall_parts,omitempty"`
	// BytesWritten is what the checkpoint added to storage at creation
	// (an fs checkpoint shares all data copy-on-write: metadata only; a
	// full checkpoint writes the memory pages no earlier checkpoint of
	// its lineage holds, plus CRIU's other images).
	BytesWritten int64 `json:"bytes_written"`
	// ImageBytes is the size of a full checkpoint's process images as
	// CRIU wrote them (what a plain dump would store).
	ImageBytes int64 `json:"image_bytes,omitempty"`
	// Keep: a standby is kept ready for this checkpoint (see
	// CheckpointRequest.Keep).
	Keep bool `json:"keep,omitempty"`
	// Pending: the consistent instant is captured but the checkpoint is
	// not committed yet (its images are being stored). A rollback or
	// fork to it waits for the commit; a crash before it loses it.
	Pending bool `json:"pending,omitempty"`
	// Failed: the checkpoint was captured (it was reported pending) but
	// could not be stored; FailedReason says why (a full disk, for one).
	// It holds nothing: a rollback or fork to it is refused
	// (failed_precondition), and deleting it drops the record.
	Failed       bool   `json:"failed,omitempty"`
	FailedReason string `json:"failed_reason,omitempty"`
	// DataKey is the ID of the tenant data key that sealed a full
	// checkpoint's images (encryption at rest); "" if stored in
	// plaintext. Shredding the key makes the checkpoint unreadable.
	DataKey string `json:"data_key,omitempty"`
	// ImportedFrom is the ID an imported checkpoint had on the host that
	// exported it, and ImportSigner that host's key (molt checkpoint
	// import; docs/bundles.md). An imported checkpoint belongs to no
	// sandbox of this host: its Sandbox names none.
	ImportedFrom string `json:"imported_from,omitempty"`
	ImportSigner string `json:"import_signer,omitempty"`
	// InStore says the checkpoint is in the daemon's object store
	// (molt daemon --store; docs/storage.md); Offloaded, that its local
	// copy was freed, so a restore fetches it from there first.
	InStore   bool `json:"in_store,omitempty"`
	Offloaded bool `json:"offloaded,omitempty"`
}

// RollbackRequest moves a sandbox to a checkpoint.
type RollbackRequest struct {
	Checkpoint string `json:"checkpoint"`
	// Tier asks for a tier: "" takes the fastest available (hot when a
	// standby is ready), "warm" restores from the images even when a
	// standby is ready, "cold" also rehashes every stored object first.
	Tier string `json:"tier,omitempty"`
	// Force rolls back even past effects others consumed (see
	// RollbackPlan.Block); DryRun only reports the plan.
	Force  bool `json:"force,omitempty"`
	DryRun bool `json:"dry_run,omitempty"`
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
	// Plan is what the rollback does to the effect ledger (all of the
	// result with dry_run).
	Plan *RollbackPlan `json:"plan,omitempty"`
	// Compensation is how the compensations of Plan.Compensate went.
	// Its State "failed" means the sandbox is at the checkpoint but the
	// world still has the failed ones (orphaned): the client reports
	// the rollback as failed.
	Compensation *CompensationReport `json:"compensation,omitempty"`
}

// RollbackPlan is what a rollback does to the sandbox's effects.
type RollbackPlan struct {
	DryRun bool `json:"dry_run,omitempty"`
	// Orphan: committed effects the rollback leaves out of the sandbox's
	// state (the world keeps them).
	Orphan []string `json:"orphan,omitempty"`
	// Replay: of those, the ones an equivalent request will be answered
	// from, not sent again.
	Replay []string `json:"replay,omitempty"`
	// Compensate: of those, the ones with a compensator.
	Compensate []string `json:"compensate,omitempty"`
	// Block: of those, the ones others consumed and nothing compensates,
	// or that the sandbox's EffectPolicy refuses to orphan: the rollback
	// is refused (conflict) unless forced.
	Block []BlockedEffect `json:"block,omitempty"`
	// Decisions says, for each orphaned effect, what the sandbox's
	// EffectPolicy decided.
	Decisions []EffectDecision `json:"decisions,omitempty"`
}

// EffectDecision is what a rollback does to one orphaned effect.
type EffectDecision struct {
	ID string `json:"id"`
	// Kind is the EffectPolicy kind that decided ("" for the default).
	Kind string `json:"kind,omitempty"`
	// Policy is EffectRefuse, EffectCompensate, EffectAllow, or "" for
	// the default.
	Policy string `json:"policy,omitempty"`
	// Action is "compensate", "block" or "orphan".
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
}

// BlockedEffect is an effect that blocks a rollback, and who consumed it.
type BlockedEffect struct {
	ID        string   `json:"id"`
	Method    string   `json:"method,omitempty"`
	URL       string   `json:"url,omitempty"`
	Consumers []string `json:"consumers"`
	// Reason says why it blocks (consumed with no compensator, or the
	// policy).
	Reason string `json:"reason,omitempty"`
}

// EffectConsumeRequest marks an effect consumed: By acted on it.
type EffectConsumeRequest struct {
	By   string `json:"by"`
	Note string `json:"note,omitempty"`
}

// ForkRequest creates N sandboxes from a checkpoint. When forking a
// sandbox without a checkpoint, an fs checkpoint is taken first.
type ForkRequest struct {
	Checkpoint string `json:"checkpoint,omitempty"`
	// N is how many sandboxes to make, 1..MaxForks. A request without
	// the field makes one; an explicit 0 or a negative count is refused.
	N int `json:"n"`
	// Reseed gives each fork's sessions a fresh random seed ($RANDOM),
	// so forks do not draw the same numbers from them. See
	// docs/architecture.md for what can and cannot be reseeded.
	Reseed bool `json:"reseed,omitempty"`
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

// RecoverRequest brings a sandbox back to a committed checkpoint taken
// at a turn's end and fast-forwards its restarted agent: the agent's LLM
// calls and commands up to that turn are answered from the recorded turn
// log, and from there on everything runs live.
type RecoverRequest struct {
	// To is the checkpoint; empty: the latest committed turn checkpoint
	// of the sandbox's lineage whose turns are all recorded.
	To string `json:"to,omitempty"`
	// Force and DryRun are those of the rollback (RollbackRequest).
	Force  bool `json:"force,omitempty"`
	DryRun bool `json:"dry_run,omitempty"`
}

// RecoverResult is what a recovery did and what the agent's fast-forward
// will answer from the record.
type RecoverResult struct {
	Sandbox    string `json:"sandbox"`
	Checkpoint string `json:"checkpoint"`
	// Turn is the last turn the fast-forward covers: the sandbox's state
	// is the one that turn ended in.
	Turn int `json:"turn"`
	// Turns lists the recorded turns replayed, oldest first.
	Turns    []int `json:"turns"`
	LLMCalls int   `json:"llm_calls"`
	Commands int   `json:"commands"`
	// Bytes is the recorded output the fast-forward holds (LLM responses
	// and command output).
	Bytes    int64           `json:"bytes"`
	Rollback *RollbackResult `json:"rollback,omitempty"`
	DryRun   bool            `json:"dry_run,omitempty"`
	Note     string          `json:"note,omitempty"`
}

// Recovery states.
const (
	RecoveryNone        = "none"         // no recovery under way
	RecoveryFastForward = "fast-forward" // answering from the record
	RecoveryDone        = "done"         // the record was replayed whole; live since
	RecoveryDiverged    = "diverged"     // a request differed from the record; live since
)

// RecoveryStatus is where a sandbox's fast-forward stands.
type RecoveryStatus struct {
	Sandbox    string `json:"sandbox"`
	State      string `json:"state"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Turn       int    `json:"turn,omitempty"`
	// Replayed of Total recorded exchanges (LLM calls and commands) have
	// been answered from the record.
	Replayed   int         `json:"replayed"`
	Total      int         `json:"total"`
	Bytes      int64       `json:"bytes"`
	Divergence *Divergence `json:"divergence,omitempty"`
}

// Divergence is the first request of a fast-forward that did not match
// the record: from it on, the sandbox runs live.
type Divergence struct {
	// Turn is the recorded turn the request fell in; Index the exchange's
	// position in the fast-forward (from 0).
	Turn     int       `json:"turn"`
	Index    int       `json:"index"`
	Expected string    `json:"expected"`
	Got      string    `json:"got"`
	At       time.Time `json:"at"`
}

// ChainVerification is a checkpoint's lineage as verified: each
// checkpoint from it up to its root, with what is wrong with its link
// (its manifest's signature, the key, the parent it names and that
// parent's digest).
type ChainVerification struct {
	Checkpoint string      `json:"checkpoint"`
	OK         bool        `json:"ok"`
	Links      []ChainLink `json:"links"`
	// Key is this host's signing key; Trusted the keys it accepts.
	Key     string   `json:"key"`
	Trusted []string `json:"trusted"`
}

// ChainLink is one checkpoint of a verified lineage.
type ChainLink struct {
	ID      string `json:"id"`
	Parent  string `json:"parent,omitempty"`
	Key     string `json:"key,omitempty"`
	Problem string `json:"problem,omitempty"`
}
