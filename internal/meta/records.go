package meta

import (
	"net/netip"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/egress"
	"github.com/molt-sh/molt/internal/sandbox"
	"golang.org/x/sys/unix"
)

// The record types of the buckets, and the domain types the engine
// works with. They carry their own JSON names, which are the database's
// format: the wire types of api/v1 may change without changing what is
// stored (internal/httpapi converts between the two), and the golden
// records of testdata/golden pin the format of each bucket.
//
// Their names are those the records were first written with (the wire
// names of the time), so that the records written before these types
// existed read unchanged.

// The typed buckets of the engine's records.
var (
	SandboxRecords          = Bucket[SandboxRecord](Sandboxes)
	CheckpointRecords       = Bucket[CheckpointRecord](Checkpoints)
	ImageRecords            = Bucket[Image](Images)
	FailedCheckpointRecords = Bucket[CheckpointRecord](FailedCheckpoints)
	TurnRecords             = Bucket[TurnRecord](Turns)
	TenantRecords           = Bucket[TenantRecord](Tenants)
	TokenRecords            = Bucket[TokenRecord](Tokens)
)

// TenantRecord is a tenant: it owns sandboxes (and, through them, their
// checkpoints, turn logs and ledgers).
type TenantRecord struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

// TokenRecord is an API token of a tenant. The secret itself is never
// kept: Hash is its SHA-256.
type TokenRecord struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// Scopes are the operations it may do (read, exec, checkpoint,
	// rollback, admin); Sandboxes, if any, the only sandboxes it reaches.
	Scopes    []string  `json:"scopes"`
	Sandboxes []string  `json:"sandboxes,omitempty"`
	Hash      string    `json:"hash"`
	Note      string    `json:"note,omitempty"`
	Created   time.Time `json:"created"`
}

// SandboxRecord is a sandbox as bucket Sandboxes keeps it: what the
// engine reports, and what it needs to find the sandbox's processes
// again. State is the state molt last put it in; the reported state also
// checks that init still runs.
type SandboxRecord struct {
	Sandbox
	Init      sandbox.Init `json:"init"`
	MachineID string       `json:"machine_id"`
	// Restarting marks a restart under way (restart): a daemon that dies
	// between killing the processes and recording the new init leaves it
	// set, and the next one restarts the sandbox.
	Restarting bool `json:"restarting,omitempty"`
	// DiskGroup says the sandbox has its own qgroup (quota.go).
	DiskGroup bool `json:"disk_group,omitempty"`
	// IDs is the block of host uids and gids its user namespace maps
	// root and the other ids to (userns.go); none: no user namespace.
	IDs sandbox.IDRange `json:"ids,omitzero"`
	// SeccompProfile is the JSON profile of a sandbox whose Seccomp is
	// custom: stage 1 gets it compiled wherever it starts the sandbox's
	// init again (fs rollback, restart, fork).
	SeccompProfile string `json:"seccomp_profile,omitempty"`
	// RecordLimit is the sandbox's own bound of its turn log's recorded
	// outputs and LLM exchanges (0: the daemon's).
	RecordLimit int64 `json:"record_limit,omitempty"`
	// SealedSecrets holds the values of the secrets passed by reference
	// (Sandbox.Secrets names them): a JSON object sealed with the
	// tenant's data key, bound to the sandbox's ID (internal/secret).
	// They are never stored in the clear.
	SealedSecrets []byte `json:"sealed_secrets,omitempty"`
	// ImageConfig is the config of the image the sandbox was made from,
	// as it was then: exec's defaults, and what a commit records.
	ImageConfig *ImageConfig `json:"image_config,omitempty"`
}

// CheckpointRecord is a checkpoint as buckets Checkpoints and
// FailedCheckpoints keep it.
type CheckpointRecord struct {
	Checkpoint
	Image string `json:"image"`
	// Objects lists the stored files of a full checkpoint (process
	// images) with their hashes; restore verifies them first.
	Objects []ckstore.Object `json:"objects,omitempty"`
	// CRIU is the version of CRIU that wrote the images.
	CRIU string `json:"criu,omitempty"`
	// ExternalNet says the images leave the network namespace out: a
	// restore runs CRIU in a fresh loopback-only one, which the tree joins.
	ExternalNet bool `json:"external_net,omitempty"`
	// ExternalUTS and ExternalIPC say the same of the UTS namespace (the
	// restore names the fresh one) and the IPC namespace (left out only
	// when it held no System V objects).
	ExternalUTS bool `json:"external_uts,omitempty"`
	ExternalIPC bool `json:"external_ipc,omitempty"`
	// IDs is the block of host ids the images' user namespace maps (none
	// for a sandbox without one): the sandbox restored from them gets it.
	IDs sandbox.IDRange `json:"ids,omitzero"`
	// LedgerHead is the sandbox's ledger head when the checkpoint was
	// taken: a rollback to it rewinds the ledger there (effects
	// recorded later become orphans), a fork starts its ledger there.
	LedgerHead string `json:"ledger_head,omitempty"`
	// EgressAddr is the sandbox's egress address when its processes were
	// dumped: the images' sockets bind it, so a restore by a sandbox
	// with another address (a fork, a sandbox that migrated) adds it
	// for the restore (egress.Host.Prepare).
	EgressAddr netip.Addr `json:"egress_addr,omitzero"`
	// Turn is the turn whose end took the checkpoint (0: none did).
	Turn int `json:"turn,omitempty"`
	// KeyTenant is the tenant whose data key DataKey is ("" the host's).
	KeyTenant string `json:"key_tenant,omitempty"`
	// Tenant owns an imported checkpoint, which belongs to no sandbox of
	// this host ("" the host admin). A checkpoint taken here is its
	// sandbox's tenant's.
	Tenant string `json:"tenant,omitempty"`
}

// Outside returns the namespace types the checkpoint's images leave out.
func (ck CheckpointRecord) Outside() int {
	f := 0
	if ck.ExternalNet {
		f |= unix.CLONE_NEWNET
	}
	if ck.ExternalUTS {
		f |= unix.CLONE_NEWUTS
	}
	if ck.ExternalIPC {
		f |= unix.CLONE_NEWIPC
	}
	return f
}

// Sandbox is a sandbox as the engine reports it.
type Sandbox struct {
	ID       string `json:"id"`
	Name     string `json:"name,omitempty"`
	Image    string `json:"image"`
	Hostname string `json:"hostname"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	// Offloaded says a hibernated sandbox's checkpoint and files are
	// in the object store only (molt hibernate --offload): a resume, here
	// or on any daemon sharing the store, fetches them.
	Offloaded bool              `json:"offloaded,omitempty"`
	Created   time.Time         `json:"created"`
	Pid       int               `json:"pid,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Secrets names the secrets passed by reference: given to every
	// process as environment variables, their values only sealed
	// (SandboxRecord.SealedSecrets).
	Secrets   []string  `json:"secrets,omitempty"`
	Resources Resources `json:"resources,omitempty"`
	// Tenant owns the sandbox ("": the host's own).
	Tenant string `json:"tenant,omitempty"`
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
	// Network is v1.NetworkNone ("" too: loopback only) or
	// v1.NetworkEgress, with Egress set.
	Network string  `json:"network,omitempty"`
	Egress  *Egress `json:"egress,omitempty"`
	// EffectPolicy: see api/v1.SandboxCreateRequest.EffectPolicy.
	EffectPolicy map[string]string `json:"effect_policy,omitempty"`
	// Compensation: see api/v1.Sandbox.Compensation.
	Compensation *CompensationReport `json:"compensation,omitempty"`
}

// CompensationReport: see api/v1.CompensationReport.
type CompensationReport struct {
	Checkpoint  string               `json:"checkpoint"`
	State       string               `json:"state"`
	Compensated []string             `json:"compensated,omitempty"`
	Failed      []FailedCompensation `json:"failed,omitempty"`
	At          time.Time            `json:"at"`
	// Batch names the rollback's compensations in the ledger.
	Batch string `json:"batch,omitempty"`
}

// FailedCompensation: see api/v1.FailedCompensation.
type FailedCompensation struct {
	ID       string `json:"id"`
	Attempts int    `json:"attempts,omitempty"`
	Error    string `json:"error"`
}

// Egress is a sandbox's way out: its address in the host's egress range
// and its policy.
type Egress struct {
	Addr   netip.Addr    `json:"addr"`
	Policy egress.Policy `json:"policy"`
	// CA is the sandbox's inspection CA (PEM certificate and key) when
	// its policy inspects TLS; forks share it with their sandbox (their
	// trust store has it).
	CACert string `json:"ca_cert,omitempty"`
	CAKey  string `json:"ca_key,omitempty"`
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

// Session is a persistent shell inside a sandbox.
type Session struct {
	Name  string `json:"name"`
	Pid   int    `json:"pid"`
	Alive bool   `json:"alive"`
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
	// exported it, and ImportSigner that host's key (docs/bundles.md).
	ImportedFrom string `json:"imported_from,omitempty"`
	ImportSigner string `json:"import_signer,omitempty"`
	// InStore says the checkpoint is in the daemon's object store
	// (molt daemon --store; docs/storage.md); Offloaded, that its local
	// copy was freed, so a restore fetches it from there first.
	InStore   bool `json:"in_store,omitempty"`
	Offloaded bool `json:"offloaded,omitempty"`
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

// Image is a read-only root filesystem.
type Image struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	Created   time.Time `json:"created"`
	SizeBytes int64     `json:"size_bytes,omitempty"`
	// Config is what an OCI or Docker image (pulled, imported, or
	// committed from a sandbox made from one) says of its processes;
	// sandboxes made from the image get it (SandboxRecord.ImageConfig).
	Config *ImageConfig `json:"config,omitempty"`
	// Parent is the image of the sandbox a committed image came from.
	Parent string `json:"parent,omitempty"`
	// Digest is the manifest digest of a pulled or pushed image.
	Digest string `json:"digest,omitempty"`
}

// ImageConfig is the part of an OCI image's config molt applies: Env
// under a new sandbox's own environment, and WorkingDir, User and
// Entrypoint followed by Cmd as the defaults of an exec that names no
// cwd, user or command.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// CheckpointImport is what a checkpoint import made, and what the
// bundle held.
type CheckpointImport struct {
	Checkpoint  Checkpoint `json:"checkpoint"`
	Objects     int        `json:"objects"`
	ObjectBytes int64      `json:"object_bytes"`
	FSEntries   int64      `json:"fs_entries"`
	FSBytes     int64      `json:"fs_bytes"`
	Molt        string     `json:"molt,omitempty"`
	CRIU        string     `json:"criu,omitempty"`
	DurationMS  float64    `json:"duration_ms"`
}
