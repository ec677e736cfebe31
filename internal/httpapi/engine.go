package httpapi

import (
	"context"
	"io"
	"net"
	"net/http"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/bundle"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/meta"
)

// Engine is what the handlers need of the daemon's engine (core.Manager
// is the one in production). Each method takes a sandbox, image or
// checkpoint reference as given in the path and returns an error that
// wraps an errdefs kind; the handlers map the kind to the status. It
// takes api/v1 requests as decoded and returns domain values (meta's),
// which convert.go turns into wire values.
type Engine interface {
	Host() meta.Host
	MetricsHandler() http.Handler

	Images() ([]meta.Image, error)
	Image(name string) (meta.Image, error)
	// BuildImage writes progress text to log as it goes.
	BuildImage(ctx context.Context, req v1.ImageBuildRequest, log io.Writer) (meta.Image, error)
	// ImportImage, PullImage and PushImage write progress lines to log.
	ImportImage(ctx context.Context, req v1.ImageImportRequest, log io.Writer) (meta.Image, error)
	PullImage(ctx context.Context, req v1.ImagePullRequest, log io.Writer) (meta.Image, error)
	PushImage(ctx context.Context, name string, req v1.ImagePushRequest, log io.Writer) (meta.Image, error)
	// CommitSandbox makes an image of a sandbox's files.
	CommitSandbox(ctx context.Context, ref string, req v1.CommitRequest) (meta.Image, error)
	RemoveImage(ctx context.Context, name string) error

	Sandboxes() ([]meta.Sandbox, error)
	Sandbox(ctx context.Context, ref string) (meta.Sandbox, error)
	Create(ctx context.Context, req v1.SandboxCreateRequest) (meta.Sandbox, error)
	Remove(ctx context.Context, ref string) error
	Stop(ctx context.Context, ref string) (meta.Sandbox, error)
	Start(ctx context.Context, ref string) (meta.Sandbox, error)
	Hibernate(ctx context.Context, ref string) (meta.Sandbox, error)
	Offload(ctx context.Context, ref string) (meta.Sandbox, error)
	ResumeWith(ctx context.Context, ref string, req v1.ResumeRequest) (meta.Sandbox, error)
	// StoredSandbox is sandbox id as the object store's document has it
	// (ID, name, tenant): one another daemon offloaded or migrated, which
	// a resume here adopts. Without a store, or not in it: not found.
	StoredSandbox(ctx context.Context, id string) (meta.Sandbox, error)
	// MigrateTo moves running sandbox ref to the daemon req names.
	MigrateTo(ctx context.Context, ref string, req v1.MigrateRequest) (meta.Migration, error)

	// Exec starts a command. A detached one returns its pid and no
	// connection; otherwise the connection carries api/v1 frames to and
	// from the sandbox's init, and the caller closes it (which kills the
	// command if it still runs).
	Exec(ctx context.Context, ref string, req v1.ExecRequest) (int, net.Conn, error)
	SessionRun(ctx context.Context, ref, session string, req v1.SessionRunRequest) (meta.SessionRunResult, error)
	SessionClose(ctx context.Context, ref, session string) error

	Checkpoints(ref string) ([]meta.Checkpoint, error)
	Checkpoint(ctx context.Context, ref string, req v1.CheckpointRequest) (meta.Checkpoint, error)
	CheckpointInfo(ref string) (meta.Checkpoint, error)
	VerifyCheckpoint(ref string) (meta.Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, ref string) error
	RollbackWith(ctx context.Context, ref string, req v1.RollbackRequest) (meta.RollbackResult, error)
	VerifyChain(ref string) (meta.ChainVerification, error)
	Recover(ctx context.Context, ref string, req v1.RecoverRequest) (meta.RecoverResult, error)
	Recovery(ref string) (meta.RecoveryStatus, error)
	// Fork forks the sandbox ref, or req.Checkpoint when ref is "".
	Fork(ctx context.Context, ref string, req v1.ForkRequest) (meta.ForkResult, error)
	// ExportCheckpoint writes checkpoint ref as a bundle to w;
	// ImportCheckpoint reads one and makes its checkpoint tenant's
	// (docs/bundles.md). ImportedCheckpoints lists tenant's imports.
	ExportCheckpoint(ctx context.Context, ref string, w io.Writer) (bundle.Stats, error)
	ImportCheckpoint(ctx context.Context, r io.Reader, tenant string) (meta.CheckpointImport, error)
	ImportedCheckpoints(tenant string) ([]meta.Checkpoint, error)

	EndTurn(ctx context.Context, ref string, req v1.TurnRequest) (meta.TurnResult, error)
	Turns(ref string) ([]meta.TurnRecord, error)

	// Effects lists a sandbox's effect ledger (after checkpoint since,
	// when set) and which records are orphans.
	Effects(ctx context.Context, ref, since string) ([]ledger.Record, map[string]bool, error)
	DeclareEffect(ctx context.Context, ref string, req v1.EffectDeclareRequest) (ledger.Record, error)
	ConsumeEffect(ctx context.Context, id string, req v1.EffectConsumeRequest) (ledger.Record, error)
	// EffectSandbox is the sandbox whose ledger holds effect id.
	EffectSandbox(id string) (string, bool)
	// SetCompensator gives an effect a compensator after the fact.
	SetCompensator(ctx context.Context, id string, c v1.Compensator) (ledger.Record, error)
}

// LLMEndpoints serves sandboxes' LLM endpoints (coord.Coordinator in
// production).
type LLMEndpoints interface {
	Set(ctx context.Context, ref string, req v1.LLMEndpointRequest) (v1.LLMEndpoint, error)
	Get(ctx context.Context, ref string) (v1.LLMEndpoint, error)
	// Remove closes the endpoint of the sandbox with this ID, if any.
	Remove(id string)
	// Export is what set the endpoint of the sandbox with this ID, its
	// token included, for a migration to set it on the target.
	Export(id string) (v1.LLMEndpointRequest, bool)
}
