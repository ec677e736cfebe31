package httpapi

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/bundle"
	"github.com/molt-sh/molt/internal/egress/ledger"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/progress"
)

// fakeEngine is an engine with nothing in it: every call that can fail
// fails with err, or with not found when err is nil, and is recorded.
// exec, when set, answers Exec instead.
type fakeEngine struct {
	mu    sync.Mutex
	err   error
	calls []string
	exec  func(ref string, req v1.ExecRequest) (int, net.Conn, error)
}

func (f *fakeEngine) call(name, ref string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	if f.err != nil {
		return f.err
	}
	return fmt.Errorf("%s %q: %w", name, ref, errdefs.ErrNotFound)
}

// called returns the calls so far and forgets them.
func (f *fakeEngine) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

func (f *fakeEngine) setErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeEngine) Host() meta.Host { return meta.Host{Version: "fake"} }
func (f *fakeEngine) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "fake_metric 1\n") })
}
func (f *fakeEngine) Images() ([]meta.Image, error) { return nil, f.call("Images", "") }
func (f *fakeEngine) Image(name string) (meta.Image, error) {
	return meta.Image{}, f.call("Image", name)
}
func (f *fakeEngine) BuildImage(ctx context.Context, req v1.ImageBuildRequest, log io.Writer) (meta.Image, error) {
	fmt.Fprintf(log, "building %s\n", req.Name)
	return meta.Image{}, f.call("BuildImage", req.Name)
}
func (f *fakeEngine) ImportImage(ctx context.Context, req v1.ImageImportRequest, log io.Writer) (meta.Image, error) {
	return meta.Image{}, f.call("ImportImage", req.Name)
}
func (f *fakeEngine) PullImage(ctx context.Context, req v1.ImagePullRequest, log io.Writer) (meta.Image, error) {
	fmt.Fprintln(log, "pulling")
	return meta.Image{}, f.call("PullImage", req.Name)
}
func (f *fakeEngine) PushImage(ctx context.Context, name string, req v1.ImagePushRequest, log io.Writer) (meta.Image, error) {
	return meta.Image{}, f.call("PushImage", name)
}
func (f *fakeEngine) CommitSandbox(ctx context.Context, ref string, req v1.CommitRequest) (meta.Image, error) {
	return meta.Image{}, f.call("CommitSandbox", ref)
}
func (f *fakeEngine) RemoveImage(ctx context.Context, name string) error {
	return f.call("RemoveImage", name)
}
func (f *fakeEngine) Sandboxes() ([]meta.Sandbox, error) { return nil, f.call("Sandboxes", "") }
func (f *fakeEngine) Sandbox(ctx context.Context, ref string) (meta.Sandbox, error) {
	return meta.Sandbox{}, f.call("Sandbox", ref)
}
func (f *fakeEngine) Create(ctx context.Context, req v1.SandboxCreateRequest) (meta.Sandbox, error) {
	return meta.Sandbox{}, f.call("Create", req.Image)
}
func (f *fakeEngine) Remove(ctx context.Context, ref string) error { return f.call("Remove", ref) }
func (f *fakeEngine) Stop(ctx context.Context, ref string) (meta.Sandbox, error) {
	return meta.Sandbox{}, f.call("Stop", ref)
}
func (f *fakeEngine) Start(ctx context.Context, ref string) (meta.Sandbox, error) {
	return meta.Sandbox{}, f.call("Start", ref)
}
func (f *fakeEngine) Offload(ctx context.Context, ref string) (meta.Sandbox, error) {
	return meta.Sandbox{}, f.err
}

func (f *fakeEngine) Hibernate(ctx context.Context, ref string) (meta.Sandbox, error) {
	if ref == "reports" { // a hibernation that succeeds, with progress
		progress.Report(ctx, progress.Step{Message: "capturing"})
		progress.Report(ctx, progress.Step{Message: "storing", Done: 10, Total: 10, Unit: "bytes"})
		return meta.Sandbox{ID: ref, State: v1.StateHibernated}, nil
	}
	return meta.Sandbox{}, f.call("Hibernate", ref)
}
func (f *fakeEngine) ResumeWith(ctx context.Context, ref string, req v1.ResumeRequest) (meta.Sandbox, error) {
	return meta.Sandbox{}, f.call("Resume", ref)
}
func (f *fakeEngine) StoredSandbox(ctx context.Context, id string) (meta.Sandbox, error) {
	return meta.Sandbox{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
}
func (f *fakeEngine) MigrateTo(ctx context.Context, ref string, req v1.MigrateRequest) (meta.Migration, error) {
	return meta.Migration{}, f.call("MigrateTo", ref)
}
func (f *fakeEngine) Exec(ctx context.Context, ref string, req v1.ExecRequest) (int, net.Conn, error) {
	err := f.call("Exec", ref)
	if f.exec != nil {
		return f.exec(ref, req)
	}
	return 0, nil, err
}
func (f *fakeEngine) SessionRun(ctx context.Context, ref, session string, req v1.SessionRunRequest) (meta.SessionRunResult, error) {
	return meta.SessionRunResult{}, f.call("SessionRun", ref)
}
func (f *fakeEngine) SessionClose(ctx context.Context, ref, session string) error {
	return f.call("SessionClose", ref)
}
func (f *fakeEngine) Checkpoints(ref string) ([]meta.Checkpoint, error) {
	return nil, f.call("Checkpoints", ref)
}
func (f *fakeEngine) Checkpoint(ctx context.Context, ref string, req v1.CheckpointRequest) (meta.Checkpoint, error) {
	return meta.Checkpoint{}, f.call("Checkpoint", ref)
}
func (f *fakeEngine) CheckpointInfo(ref string) (meta.Checkpoint, error) {
	return meta.Checkpoint{}, f.call("CheckpointInfo", ref)
}
func (f *fakeEngine) VerifyCheckpoint(ref string) (meta.Checkpoint, error) {
	return meta.Checkpoint{}, f.call("VerifyCheckpoint", ref)
}
func (f *fakeEngine) DeleteCheckpoint(ctx context.Context, ref string) error {
	return f.call("DeleteCheckpoint", ref)
}
func (f *fakeEngine) VerifyChain(ref string) (meta.ChainVerification, error) {
	return meta.ChainVerification{}, f.call("VerifyChain", ref)
}

func (f *fakeEngine) EffectSandbox(id string) (string, bool) {
	_ = f.call("EffectSandbox", id)
	return "sb", true
}

func (f *fakeEngine) Recover(ctx context.Context, ref string, req v1.RecoverRequest) (meta.RecoverResult, error) {
	return meta.RecoverResult{}, f.call("Recover", ref)
}

func (f *fakeEngine) Recovery(ref string) (meta.RecoveryStatus, error) {
	return meta.RecoveryStatus{}, f.call("Recovery", ref)
}

func (f *fakeEngine) RollbackWith(ctx context.Context, ref string, req v1.RollbackRequest) (meta.RollbackResult, error) {
	return meta.RollbackResult{}, f.call("RollbackWith", ref)
}
func (f *fakeEngine) Fork(ctx context.Context, ref string, req v1.ForkRequest) (meta.ForkResult, error) {
	return meta.ForkResult{}, f.call("Fork", ref+req.Checkpoint)
}
func (f *fakeEngine) EndTurn(ctx context.Context, ref string, req v1.TurnRequest) (meta.TurnResult, error) {
	return meta.TurnResult{}, f.call("EndTurn", ref)
}
func (f *fakeEngine) Turns(ref string) ([]meta.TurnRecord, error) { return nil, f.call("Turns", ref) }
func (f *fakeEngine) Effects(ctx context.Context, ref, since string) ([]ledger.Record, map[string]bool, error) {
	return nil, nil, f.call("Effects", ref)
}
func (f *fakeEngine) SetCompensator(ctx context.Context, id string, c v1.Compensator) (ledger.Record, error) {
	return ledger.Record{}, f.call("SetCompensator", id)
}

func (f *fakeEngine) ConsumeEffect(ctx context.Context, id string, req v1.EffectConsumeRequest) (ledger.Record, error) {
	return ledger.Record{}, f.call("ConsumeEffect", id)
}
func (f *fakeEngine) DeclareEffect(ctx context.Context, ref string, req v1.EffectDeclareRequest) (ledger.Record, error) {
	return ledger.Record{}, f.call("DeclareEffect", ref)
}

// fakeLLM is the fake's LLM endpoints, failing the same way.
type fakeLLM struct{ f *fakeEngine }

func (l fakeLLM) Set(ctx context.Context, ref string, req v1.LLMEndpointRequest) (v1.LLMEndpoint, error) {
	return v1.LLMEndpoint{}, l.f.call("LLM.Set", ref)
}
func (l fakeLLM) Get(ctx context.Context, ref string) (v1.LLMEndpoint, error) {
	return v1.LLMEndpoint{}, l.f.call("LLM.Get", ref)
}
func (l fakeLLM) Remove(id string) { _ = l.f.call("LLM.Remove", id) }
func (l fakeLLM) Export(id string) (v1.LLMEndpointRequest, bool) {
	return v1.LLMEndpointRequest{}, l.f.call("LLM.Export", id) == nil
}

// fakeServer serves the API of an empty fake engine.
func fakeServer(t *testing.T) (*httptest.Server, *fakeEngine) {
	t.Helper()
	f := &fakeEngine{}
	srv := httptest.NewServer(Handler(f, fakeLLM{f}, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(srv.Close)
	return srv, f
}

func (f *fakeEngine) ExportCheckpoint(ctx context.Context, ref string, w io.Writer) (bundle.Stats, error) {
	return bundle.Stats{}, f.call("ExportCheckpoint", ref)
}
func (f *fakeEngine) ImportCheckpoint(ctx context.Context, r io.Reader, tenant string) (meta.CheckpointImport, error) {
	if tenant == "count" { // reads the whole body, reporting as it goes
		n, err := io.Copy(io.Discard, progress.Reader(ctx, r, "reading the bundle", 0))
		return meta.CheckpointImport{ObjectBytes: n}, err
	}
	return meta.CheckpointImport{}, f.call("ImportCheckpoint", tenant)
}
func (f *fakeEngine) ImportedCheckpoints(tenant string) ([]meta.Checkpoint, error) { return nil, nil }
