// Package client is the Go client of molt's REST API. Every method takes
// a context first. The zero Client talks to the default socket
// ($MOLT_SOCKET, else /run/molt/molt.sock).
//
// Errors from the daemon are *APIError values; errors.Is(err, ErrNotFound)
// and the other kind sentinels (api/v1's, under the same names) work on
// them.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
)

// DefaultSocket is the daemon's socket unless MOLT_SOCKET says otherwise.
const DefaultSocket = "/run/molt/molt.sock"

// Error kinds, matched with errors.Is against errors the client returns.
// They are api/v1's sentinels (the daemon's engine wraps the same values),
// so either name matches.
var (
	ErrNotFound           = v1.ErrNotFound
	ErrAlreadyExists      = v1.ErrAlreadyExists
	ErrInvalidArgument    = v1.ErrInvalidArgument
	ErrFailedPrecondition = v1.ErrFailedPrecondition
	ErrUnavailable        = v1.ErrUnavailable
	ErrNotSupported       = v1.ErrNotSupported
	ErrResourceExhausted  = v1.ErrResourceExhausted
	ErrUnauthenticated    = v1.ErrUnauthenticated
	ErrPermissionDenied   = v1.ErrPermissionDenied
)

// APIError is an error reported by the daemon.
type APIError struct {
	Status  int
	Kind    string
	Message string
	// Candidates, for an ambiguous reference, name one match each.
	Candidates []string
}

func (e *APIError) Error() string { return e.Message }

// Unwrap returns the kind's sentinel (v1.KindSentinel), so errors.Is
// works.
func (e *APIError) Unwrap() error { return v1.KindSentinel(e.Kind) }

// Client talks to one daemon. Its zero value is ready to use.
type Client struct {
	// Socket is the daemon's unix socket; "" means the default.
	Socket string
	// Endpoint, if set ("https://HOST:PORT"), is a daemon's TCP
	// listener, reached over TLS (TLSConfig; nil: the system's roots)
	// with Token, a tenant's API token, instead of the socket.
	Endpoint  string
	Token     string
	TLSConfig *tls.Config

	once sync.Once
	hc   *http.Client
}

// New returns a client for the daemon at socket ("" for the default).
func New(socket string) *Client { return &Client{Socket: socket} }

func (c *Client) socket() string {
	if c.Socket != "" {
		return c.Socket
	}
	if s := os.Getenv("MOLT_SOCKET"); s != "" {
		return s
	}
	return DefaultSocket
}

// NewRemote returns a client for the daemon listening at endpoint
// ("https://HOST:PORT"), with a tenant's token.
func NewRemote(endpoint, token string, cfg *tls.Config) *Client {
	return &Client{Endpoint: endpoint, Token: token, TLSConfig: cfg}
}

// ForMigration returns a client for the target daemon of a migration
// request (its TCP API, TLS checked against req's CA if set, else the
// system's roots; the token of the sandbox's tenant there), and the
// target's endpoint.
func ForMigration(req v1.MigrateRequest) (*Client, string, error) {
	u, err := url.Parse(req.To)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.User != nil {
		return nil, "", fmt.Errorf("migrate: target %q: want https://HOST:PORT: %w", req.To, errdefs.ErrInvalidArgument)
	}
	if req.Token == "" {
		return nil, "", fmt.Errorf("migrate: a token of the sandbox's tenant on the target is needed: %w", errdefs.ErrInvalidArgument)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if req.CAPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(req.CAPEM)) {
			return nil, "", fmt.Errorf("migrate: the target's CA: no PEM certificate: %w", errdefs.ErrInvalidArgument)
		}
		cfg.RootCAs = pool
	}
	endpoint := "https://" + u.Host
	return NewRemote(endpoint, req.Token, cfg), endpoint, nil
}

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("endpoint %q: want https://HOST:PORT", c.Endpoint)
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSConfig != nil {
			cfg = c.TLSConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = u.Hostname()
		}
		d := tls.Dialer{Config: cfg}
		conn, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			return nil, fmt.Errorf("connect to molt daemon at %s: %w", c.Endpoint, err)
		}
		return conn, nil
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket())
	if err != nil {
		return nil, fmt.Errorf("connect to molt daemon at %s (is `molt daemon` running?): %w", c.socket(), err)
	}
	return conn, nil
}

func (c *Client) http() *http.Client {
	c.once.Do(func() {
		c.hc = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) },
		}}
	})
	return c.hc
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if streamed(resp) {
		return readStream(resp, method, path, progressOf(ctx), out)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode response: %w", method, path, err)
	}
	return nil
}

// send performs a request and returns the response if its status is 2xx.
// Each of opts may change the request first.
func (c *Client) send(ctx context.Context, method, path string, in any, opts ...func(*http.Request)) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://molt"+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if method == http.MethodPost && progressOf(ctx) != nil {
		req.Header.Set("Accept", "application/x-ndjson, application/json")
	}
	for _, o := range opts {
		o(req)
	}
	c.authorize(req)
	resp, err := c.http().Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// authorize adds the client's token to req (a remote daemon's).
func (c *Client) authorize(req *http.Request) {
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
}

func decodeError(resp *http.Response) error {
	var e v1.Error
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(b, &e) != nil || e.Message == "" {
		return &APIError{Status: resp.StatusCode, Kind: v1.ErrKindInternal, Message: fmt.Sprintf("daemon answered %s: %s", resp.Status, strings.TrimSpace(string(b)))}
	}
	return &APIError{Status: resp.StatusCode, Kind: e.Kind, Message: e.Message, Candidates: e.Candidates}
}

func esc(s string) string { return url.PathEscape(s) }

// Host reports the host and its features.
func (c *Client) Host(ctx context.Context) (v1.Host, error) {
	var h v1.Host
	return h, c.do(ctx, "GET", "/v1/host", nil, &h)
}

// Images lists images.
func (c *Client) Images(ctx context.Context) ([]v1.Image, error) {
	var l []v1.Image
	return l, c.do(ctx, "GET", "/v1/images", nil, &l)
}

// BuildImage builds a Debian image; progress lines go to progress (may be nil).
func (c *Client) BuildImage(ctx context.Context, req v1.ImageBuildRequest, progress func(string)) (v1.Image, error) {
	return c.imageStream(ctx, "image build", "/v1/images/build", req, progress)
}

// imageStream sends a request answered by a stream of progress lines
// ending with an image or an error.
func (c *Client) imageStream(ctx context.Context, op, path string, req any, progress func(string), opts ...func(*http.Request)) (v1.Image, error) {
	resp, err := c.send(ctx, "POST", path, req, opts...)
	if err != nil {
		return v1.Image{}, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var p v1.Progress
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return v1.Image{}, fmt.Errorf("%s: decode progress: %w", op, err)
		}
		switch {
		case p.Error != nil:
			return v1.Image{}, &APIError{Status: 200, Kind: p.Error.Kind, Message: p.Error.Message}
		case p.Image != nil:
			return *p.Image, nil
		default:
			if progress != nil {
				progress(p.Message)
			}
			if f := progressOf(ctx); f != nil {
				f(p)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return v1.Image{}, fmt.Errorf("%s: %w", op, err)
	}
	return v1.Image{}, fmt.Errorf("%s: the daemon closed the stream without a result", op)
}

// ImportImage imports a root filesystem (directory or tarball), a
// docker-save archive or an OCI image layout readable by the daemon.
func (c *Client) ImportImage(ctx context.Context, req v1.ImageImportRequest) (v1.Image, error) {
	var img v1.Image
	return img, c.do(ctx, "POST", "/v1/images/import", req, &img)
}

// ImportImageProgress is ImportImage with progress lines (one per layer
// of an OCI or Docker image) going to progress.
func (c *Client) ImportImageProgress(ctx context.Context, req v1.ImageImportRequest, progress func(string)) (v1.Image, error) {
	return c.imageStream(ctx, "image import", "/v1/images/import", req, progress,
		func(r *http.Request) { r.Header.Set("Accept", "application/x-ndjson") })
}

// PullImage pulls an image from a registry; progress lines go to
// progress (may be nil).
func (c *Client) PullImage(ctx context.Context, req v1.ImagePullRequest, progress func(string)) (v1.Image, error) {
	return c.imageStream(ctx, "image pull", "/v1/images/pull", req, progress)
}

// PushImage pushes the image name to a registry; the result carries the
// pushed manifest's digest.
func (c *Client) PushImage(ctx context.Context, name string, req v1.ImagePushRequest, progress func(string)) (v1.Image, error) {
	return c.imageStream(ctx, "image push", "/v1/images/"+esc(name)+"/push", req, progress)
}

// Commit makes an image of a sandbox's files.
func (c *Client) Commit(ctx context.Context, sandbox string, req v1.CommitRequest) (v1.Image, error) {
	var img v1.Image
	return img, c.do(ctx, "POST", "/v1/sandboxes/"+esc(sandbox)+"/commit", req, &img)
}

// RemoveImage deletes an image.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/images/"+esc(name), nil, nil)
}

// Create creates and starts a sandbox.
func (c *Client) Create(ctx context.Context, req v1.SandboxCreateRequest) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes", req, &sb)
}

// Sandboxes lists sandboxes.
func (c *Client) Sandboxes(ctx context.Context) ([]v1.Sandbox, error) {
	var l []v1.Sandbox
	return l, c.do(ctx, "GET", "/v1/sandboxes", nil, &l)
}

// Sandbox inspects one sandbox by ID or name.
func (c *Client) Sandbox(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "GET", "/v1/sandboxes/"+esc(ref), nil, &sb)
}

// Remove deletes a sandbox and its checkpoints.
func (c *Client) Remove(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+esc(ref), nil, nil)
}

// Stop kills a sandbox's processes.
func (c *Client) Stop(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/stop", nil, &sb)
}

// Start starts a stopped or lost sandbox.
func (c *Client) Start(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/start", nil, &sb)
}

// SessionRun runs shell text in a persistent session.
func (c *Client) SessionRun(ctx context.Context, ref, session string, req v1.SessionRunRequest) (v1.SessionRunResult, error) {
	var res v1.SessionRunResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/sessions/"+esc(session)+"/run", req, &res)
}

// SessionClose ends a session.
func (c *Client) SessionClose(ctx context.Context, ref, session string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+esc(ref)+"/sessions/"+esc(session), nil, nil)
}

// Checkpoint takes a checkpoint.
func (c *Client) Checkpoint(ctx context.Context, ref string, req v1.CheckpointRequest) (v1.Checkpoint, error) {
	var ck v1.Checkpoint
	return ck, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/checkpoints", req, &ck)
}

// CheckpointAuto ends the sandbox's turn with the checkpoint its effects
// need (none, fs or full): checkpoint kind auto.
func (c *Client) CheckpointAuto(ctx context.Context, ref, label string) (v1.TurnResult, error) {
	var res v1.TurnResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/checkpoints", v1.CheckpointRequest{Kind: v1.KindAuto, Label: label}, &res)
}

// EndTurn ends the sandbox's current turn and starts the next.
func (c *Client) EndTurn(ctx context.Context, ref string, req v1.TurnRequest) (v1.TurnResult, error) {
	var res v1.TurnResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/turn", req, &res)
}

// SetLLM gives a sandbox an LLM endpoint; give the agent its URL as the
// LLM base URL.
func (c *Client) SetLLM(ctx context.Context, ref string, req v1.LLMEndpointRequest) (v1.LLMEndpoint, error) {
	var ep v1.LLMEndpoint
	return ep, c.do(ctx, "PUT", "/v1/sandboxes/"+esc(ref)+"/llm", req, &ep)
}

// LLM returns a sandbox's LLM endpoint.
func (c *Client) LLM(ctx context.Context, ref string) (v1.LLMEndpoint, error) {
	var ep v1.LLMEndpoint
	return ep, c.do(ctx, "GET", "/v1/sandboxes/"+esc(ref)+"/llm", nil, &ep)
}

// RemoveLLM closes a sandbox's LLM endpoint.
func (c *Client) RemoveLLM(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+esc(ref)+"/llm", nil, nil)
}

// Turns returns a sandbox's turn log.
func (c *Client) Turns(ctx context.Context, ref string) ([]v1.TurnRecord, error) {
	var l []v1.TurnRecord
	return l, c.do(ctx, "GET", "/v1/sandboxes/"+esc(ref)+"/turns", nil, &l)
}

// Effects lists a sandbox's effect ledger; with since (a checkpoint),
// only what was recorded after it.
func (c *Client) Effects(ctx context.Context, ref, since string) ([]v1.Effect, error) {
	var l []v1.Effect
	p := "/v1/sandboxes/" + esc(ref) + "/effects"
	if since != "" {
		p += "?since=" + url.QueryEscape(since)
	}
	return l, c.do(ctx, "GET", p, nil, &l)
}

// DeclareEffect records an effect that did not pass through molt's
// egress proxy.
func (c *Client) DeclareEffect(ctx context.Context, ref string, req v1.EffectDeclareRequest) (v1.Effect, error) {
	var e v1.Effect
	return e, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/effects", req, &e)
}

// ConsumeEffect marks effect id consumed (someone acted on it).
func (c *Client) ConsumeEffect(ctx context.Context, id string, req v1.EffectConsumeRequest) (v1.Effect, error) {
	var e v1.Effect
	return e, c.do(ctx, "POST", "/v1/effects/"+esc(id)+"/consumers", req, &e)
}

// SetCompensator gives effect id a compensator after the fact (an agent
// learns how to undo a payment only after making it).
func (c *Client) SetCompensator(ctx context.Context, id string, comp v1.Compensator) (v1.Effect, error) {
	var e v1.Effect
	return e, c.do(ctx, "POST", "/v1/effects/"+esc(id)+"/compensator", comp, &e)
}

// Checkpoints lists a sandbox's checkpoints.
func (c *Client) Checkpoints(ctx context.Context, ref string) ([]v1.Checkpoint, error) {
	var l []v1.Checkpoint
	return l, c.do(ctx, "GET", "/v1/sandboxes/"+esc(ref)+"/checkpoints", nil, &l)
}

// CheckpointInfo returns one checkpoint.
func (c *Client) CheckpointInfo(ctx context.Context, ref string) (v1.Checkpoint, error) {
	var ck v1.Checkpoint
	return ck, c.do(ctx, "GET", "/v1/checkpoints/"+esc(ref), nil, &ck)
}

// DeleteCheckpoint deletes a checkpoint.
func (c *Client) DeleteCheckpoint(ctx context.Context, ref string) error {
	return c.do(ctx, "DELETE", "/v1/checkpoints/"+esc(ref), nil, nil)
}

// VerifyCheckpoint checks every stored object of a checkpoint against
// its manifest, as a restore does first.
func (c *Client) VerifyCheckpoint(ctx context.Context, ref string) (v1.Checkpoint, error) {
	var ck v1.Checkpoint
	return ck, c.do(ctx, "POST", "/v1/checkpoints/"+esc(ref)+"/verify", nil, &ck)
}

// VerifyChain verifies a checkpoint's lineage: every manifest up to the
// root signed by a trusted key and linked to its parent's digest.
func (c *Client) VerifyChain(ctx context.Context, ref string) (v1.ChainVerification, error) {
	var res v1.ChainVerification
	return res, c.do(ctx, "GET", "/v1/checkpoints/"+esc(ref)+"/chain", nil, &res)
}

// Rollback returns a sandbox to a checkpoint.
func (c *Client) Rollback(ctx context.Context, ref, checkpoint string) (v1.RollbackResult, error) {
	return c.RollbackWith(ctx, ref, v1.RollbackRequest{Checkpoint: checkpoint})
}

// RollbackWith returns a sandbox to a checkpoint with the request's
// options (the tier).
func (c *Client) RollbackWith(ctx context.Context, ref string, req v1.RollbackRequest) (v1.RollbackResult, error) {
	var res v1.RollbackResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/rollback", req, &res)
}

// Recover returns a sandbox to a committed turn checkpoint and arms the
// fast-forward of its restarted agent (see v1.RecoverRequest).
func (c *Client) Recover(ctx context.Context, ref string, req v1.RecoverRequest) (v1.RecoverResult, error) {
	var res v1.RecoverResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/recover", req, &res)
}

// Recovery reports where a sandbox's fast-forward stands.
func (c *Client) Recovery(ctx context.Context, ref string) (v1.RecoveryStatus, error) {
	var res v1.RecoveryStatus
	return res, c.do(ctx, "GET", "/v1/sandboxes/"+esc(ref)+"/recover", nil, &res)
}

// Fork creates sandboxes from a sandbox (via a new fs checkpoint).
func (c *Client) Fork(ctx context.Context, ref string, n int) (v1.ForkResult, error) {
	var res v1.ForkResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/fork", v1.ForkRequest{N: n}, &res)
}

// ForkWith creates sandboxes from a sandbox or checkpoint with options.
func (c *Client) ForkWith(ctx context.Context, ref string, req v1.ForkRequest) (v1.ForkResult, error) {
	var res v1.ForkResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/fork", req, &res)
}

// ForkCheckpoint creates sandboxes from a checkpoint.
func (c *Client) ForkCheckpoint(ctx context.Context, checkpoint string, n int) (v1.ForkResult, error) {
	var res v1.ForkResult
	return res, c.do(ctx, "POST", "/v1/checkpoints/"+esc(checkpoint)+"/fork", v1.ForkRequest{N: n}, &res)
}

// Hibernate checkpoints a sandbox and stops it.
func (c *Client) Hibernate(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/hibernate", nil, &sb)
}

// HibernateOffload hibernates a sandbox, then offloads it to the
// daemon's object store (see Offload).
func (c *Client) HibernateOffload(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/hibernate?offload=true", nil, &sb)
}

// Offload puts a hibernated sandbox's checkpoint into the daemon's
// object store and frees its local copy; Resume, on this daemon or any
// other sharing the store, fetches it back.
func (c *Client) Offload(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/offload", nil, &sb)
}

// Resume restores a hibernated sandbox.
func (c *Client) Resume(ctx context.Context, ref string) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/resume", nil, &sb)
}

// ResumeWith is Resume with a request body: a migration's source hands
// the target what moves with the sandbox but not through the store.
func (c *Client) ResumeWith(ctx context.Context, ref string, req v1.ResumeRequest) (v1.Sandbox, error) {
	var sb v1.Sandbox
	return sb, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/resume", req, &sb)
}

// StoreGC runs a garbage collection over the daemon's object store
// (the host admin's).
func (c *Client) StoreGC(ctx context.Context, req v1.StoreGCRequest) (v1.StoreGCReport, error) {
	var rep v1.StoreGCReport
	return rep, c.do(ctx, "POST", "/v1/store/gc", req, &rep)
}

// TrustKey makes the daemon trust another host's key (its host.pub, as
// Host reports it): what that host signed is accepted from then on (the
// host admin's).
func (c *Client) TrustKey(ctx context.Context, publicKey string) (v1.TrustedKey, error) {
	var k v1.TrustedKey
	return k, c.do(ctx, "POST", "/v1/host/trusted-keys", v1.TrustKeyRequest{PublicKey: publicKey}, &k)
}

// Migrate moves a running sandbox to the daemon req.To, which shares
// this daemon's object store and trusts its host key; the sandbox runs
// there, and no longer here, when it returns without error. The host
// admin's (the socket).
func (c *Client) Migrate(ctx context.Context, ref string, req v1.MigrateRequest) (v1.MigrateResult, error) {
	var res v1.MigrateResult
	return res, c.do(ctx, "POST", "/v1/sandboxes/"+esc(ref)+"/migrate", req, &res)
}

// AuditExport writes the daemon's audit log entries after seq since to
// w, byte for byte as the log holds them (JSON lines).
func (c *Client) AuditExport(ctx context.Context, since uint64, w io.Writer) error {
	p := "/v1/audit"
	if since > 0 {
		p += "?since=" + strconv.FormatUint(since, 10)
	}
	resp, err := c.send(ctx, "GET", p, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	return nil
}

// AuditVerify has the daemon verify its audit log against its anchor.
func (c *Client) AuditVerify(ctx context.Context) (v1.AuditVerifyResult, error) {
	var r v1.AuditVerifyResult
	return r, c.do(ctx, "POST", "/v1/audit/verify", nil, &r)
}

// CreateTenant makes a tenant (host admin).
func (c *Client) CreateTenant(ctx context.Context, name string) (v1.Tenant, error) {
	var t v1.Tenant
	return t, c.do(ctx, "POST", "/v1/tenants", v1.TenantCreateRequest{Name: name}, &t)
}

// Tenants lists the tenants (host admin).
func (c *Client) Tenants(ctx context.Context) ([]v1.Tenant, error) {
	var l []v1.Tenant
	return l, c.do(ctx, "GET", "/v1/tenants", nil, &l)
}

// DeleteTenant deletes a tenant that owns nothing, and its tokens.
func (c *Client) DeleteTenant(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/tenants/"+esc(name), nil, nil)
}

// DataKeys lists the tenants' data keys of encryption at rest (host
// admin).
func (c *Client) DataKeys(ctx context.Context) ([]v1.DataKey, error) {
	var l []v1.DataKey
	return l, c.do(ctx, "GET", "/v1/keys", nil, &l)
}

// RotateDataKey gives tenant a new current data key; data sealed before
// stays readable with the old one (host admin).
func (c *Client) RotateDataKey(ctx context.Context, tenant string) (v1.DataKey, error) {
	var k v1.DataKey
	return k, c.do(ctx, "POST", "/v1/keys/rotate", v1.DataKeyRequest{Tenant: tenant}, &k)
}

// ShredDataKeys deletes every data key of tenant: what they sealed can
// never be read again (host admin).
func (c *Client) ShredDataKeys(ctx context.Context, tenant string) (v1.ShredResult, error) {
	var r v1.ShredResult
	return r, c.do(ctx, "POST", "/v1/keys/shred", v1.DataKeyRequest{Tenant: tenant}, &r)
}

// CreateToken makes an API token of a tenant; the answer's Secret is the
// token, shown only now.
func (c *Client) CreateToken(ctx context.Context, req v1.TokenCreateRequest) (v1.Token, error) {
	var t v1.Token
	return t, c.do(ctx, "POST", "/v1/tokens", req, &t)
}

// Tokens lists the tokens of a tenant ("": all).
func (c *Client) Tokens(ctx context.Context, tenant string) ([]v1.Token, error) {
	var l []v1.Token
	return l, c.do(ctx, "GET", "/v1/tokens?tenant="+url.QueryEscape(tenant), nil, &l)
}

// DeleteToken revokes a token.
func (c *Client) DeleteToken(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/tokens/"+esc(id), nil, nil)
}
