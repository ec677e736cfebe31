package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/tenant"
)

// Handler returns the API handler for the engine m and the LLM endpoints
// co, with the extra routes (the audit log's) served alongside.
func Handler(m Engine, co LLMEndpoints, log *slog.Logger, extra ...Route) http.Handler {
	_, h := newServer(m, co, log, extra...)
	return h
}

// newServer is Handler, also returning the server (its routes).
func newServer(m Engine, co LLMEndpoints, log *slog.Logger, extra ...Route) (*server, http.Handler) {
	s := &server{m: m, co: co, log: log}
	mux := http.NewServeMux()
	s.routes = []apiRoute{
		{"GET /v1/host", pHost, http.HandlerFunc(s.host)},
		{"GET /v1/metrics", pAdmin, m.MetricsHandler()},
		{"GET /v1/images", pHost, http.HandlerFunc(s.images)},
		{"POST /v1/images/build", pAdmin, http.HandlerFunc(s.imageBuild)},
		{"POST /v1/images/import", pAdmin, http.HandlerFunc(s.imageImport)},
		{"POST /v1/images/pull", pAdmin, http.HandlerFunc(s.imagePull)},
		{"POST /v1/images/{name}/push", pAdmin, http.HandlerFunc(s.imagePush)},
		{"GET /v1/images/{name}", pHost, http.HandlerFunc(s.image)},
		{"DELETE /v1/images/{name}", pAdmin, http.HandlerFunc(s.imageRemove)},
		{"GET /v1/sandboxes", pList, http.HandlerFunc(s.sandboxes)},
		{"POST /v1/sandboxes", pCreate, http.HandlerFunc(s.create)},
		{"GET /v1/sandboxes/{id}", sb(tenant.ScopeRead), http.HandlerFunc(s.sandbox)},
		{"DELETE /v1/sandboxes/{id}", sb(tenant.ScopeAdmin), http.HandlerFunc(s.remove)},
		{"POST /v1/sandboxes/{id}/stop", sb(tenant.ScopeAdmin), http.HandlerFunc(s.stop)},
		{"POST /v1/sandboxes/{id}/start", sb(tenant.ScopeAdmin), http.HandlerFunc(s.start)},
		{"POST /v1/sandboxes/{id}/exec", sb(tenant.ScopeExec), http.HandlerFunc(s.exec)},
		{"POST /v1/sandboxes/{id}/sessions/{name}/run", sb(tenant.ScopeExec), http.HandlerFunc(s.sessionRun)},
		{"DELETE /v1/sandboxes/{id}/sessions/{name}", sb(tenant.ScopeExec), http.HandlerFunc(s.sessionClose)},
		{"GET /v1/sandboxes/{id}/checkpoints", sb(tenant.ScopeRead), http.HandlerFunc(s.checkpoints)},
		{"POST /v1/sandboxes/{id}/checkpoints", sb(tenant.ScopeCheckpoint), http.HandlerFunc(s.checkpoint)},
		{"POST /v1/sandboxes/{id}/rollback", sb(tenant.ScopeRollback), http.HandlerFunc(s.rollback)},
		{"POST /v1/sandboxes/{id}/recover", sb(tenant.ScopeRollback), http.HandlerFunc(s.recover)},
		{"GET /v1/sandboxes/{id}/recover", sb(tenant.ScopeRead), http.HandlerFunc(s.recovery)},
		{"POST /v1/sandboxes/{id}/turn", sb(tenant.ScopeCheckpoint), http.HandlerFunc(s.turn)},
		{"GET /v1/sandboxes/{id}/turns", sb(tenant.ScopeRead), http.HandlerFunc(s.turns)},
		{"PUT /v1/sandboxes/{id}/llm", sb(tenant.ScopeAdmin), http.HandlerFunc(s.llmSet)},
		{"GET /v1/sandboxes/{id}/llm", sb(tenant.ScopeRead), http.HandlerFunc(s.llmGet)},
		{"DELETE /v1/sandboxes/{id}/llm", sb(tenant.ScopeAdmin), http.HandlerFunc(s.llmRemove)},
		{"POST /v1/sandboxes/{id}/fork", sb(tenant.ScopeRollback), http.HandlerFunc(s.forkSandbox)},
		// Images are the host's: only its admin makes one of a sandbox.
		{"POST /v1/sandboxes/{id}/commit", pAdmin, http.HandlerFunc(s.commit)},
		{"GET /v1/sandboxes/{id}/effects", sb(tenant.ScopeRead), http.HandlerFunc(s.effects)},
		{"POST /v1/sandboxes/{id}/effects", sb(tenant.ScopeAdmin), http.HandlerFunc(s.declareEffect)},
		{"POST /v1/effects/{id}/consumers", eff(tenant.ScopeAdmin), http.HandlerFunc(s.consumeEffect)},
		{"POST /v1/effects/{id}/compensator", eff(tenant.ScopeAdmin), http.HandlerFunc(s.setCompensator)},
		{"POST /v1/sandboxes/{id}/hibernate", sb(tenant.ScopeCheckpoint), http.HandlerFunc(s.hibernate)},
		{"POST /v1/sandboxes/{id}/offload", sb(tenant.ScopeCheckpoint), http.HandlerFunc(s.offload)},
		{"POST /v1/sandboxes/{id}/resume", stored(tenant.ScopeCheckpoint), http.HandlerFunc(s.resume)},
		// The daemon connects where the request says: the host admin's.
		{"POST /v1/sandboxes/{id}/migrate", pAdmin, http.HandlerFunc(s.migrate)},
		{"GET /v1/checkpoints/{id}", ck(tenant.ScopeRead), http.HandlerFunc(s.checkpointInfo)},
		{"DELETE /v1/checkpoints/{id}", ck(tenant.ScopeAdmin), http.HandlerFunc(s.checkpointDelete)},
		{"POST /v1/checkpoints/{id}/verify", ck(tenant.ScopeRead), http.HandlerFunc(s.checkpointVerify)},
		{"GET /v1/checkpoints/{id}/chain", ck(tenant.ScopeRead), http.HandlerFunc(s.checkpointChain)},
		{"POST /v1/checkpoints/{id}/fork", ck(tenant.ScopeRollback), http.HandlerFunc(s.forkCheckpoint)},
		{"GET /v1/checkpoints/{id}/export", ck(tenant.ScopeAdmin), http.HandlerFunc(s.checkpointExport)},
		{"POST /v1/checkpoints/import", pCreate, http.HandlerFunc(s.checkpointImport)},
	}
	for _, rt := range s.routes {
		h := rt.h
		if strings.HasPrefix(rt.pattern, "POST ") && !unstreamed[rt.pattern] {
			h = streamable(h)
		}
		mux.Handle(rt.pattern, s.guard(rt.policy, h))
	}
	for _, rt := range extra {
		// Served beside the API (the audit log's, the tenants'): the
		// host admin's only.
		s.routes = append(s.routes, apiRoute{rt.Pattern, pAdmin, rt.Handler})
		mux.Handle(rt.Pattern, s.guard(pAdmin, rt.Handler))
	}
	return s, apiMux{mux}
}

// unstreamed are the POST routes that the generic wrapper (streamable)
// leaves alone: exec is upgraded to its own protocol, and the image
// routes stream their own progress lines (build, pull and push always,
// import on request), ending with the image.
var unstreamed = map[string]bool{
	"POST /v1/sandboxes/{id}/exec": true,
	"POST /v1/images/build":        true,
	"POST /v1/images/pull":         true,
	"POST /v1/images/{name}/push":  true,
	"POST /v1/images/import":       true, // streams on request on its own
}

// apiMux gives the mux's own answers (no such path, or a path that
// exists for other methods) the API's JSON error body. The mux must have
// no catch-all pattern: a "/" pattern matches every method, so the mux
// would never find that a path exists only for other methods and would
// answer 404 instead of 405.
type apiMux struct{ mux *http.ServeMux }

func (a apiMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, pattern := a.mux.Handler(r); pattern == "" {
		w = &muxErrorWriter{ResponseWriter: w, r: r}
	}
	a.mux.ServeHTTP(w, r)
}

// muxErrorWriter replaces the plain-text body of the mux's 404 and 405
// (keeping its Allow header) with a JSON error; redirects pass through.
type muxErrorWriter struct {
	http.ResponseWriter
	r       *http.Request
	replied bool
}

func (e *muxErrorWriter) WriteHeader(code int) {
	switch code {
	case http.StatusNotFound:
		e.replied = true
		writeError(e.ResponseWriter, fmt.Errorf("%s %s: no such endpoint: %w", e.r.Method, e.r.URL.Path, errdefs.ErrNotFound))
	case http.StatusMethodNotAllowed:
		e.replied = true
		h := e.ResponseWriter.Header()
		h.Del("X-Content-Type-Options")
		writeJSON(e.ResponseWriter, code, v1.Error{Kind: v1.ErrKindMethodNotAllowed,
			Message: fmt.Sprintf("%s %s: method not allowed (allowed: %s)", e.r.Method, e.r.URL.Path, h.Get("Allow"))})
	default:
		e.ResponseWriter.WriteHeader(code)
	}
}

func (e *muxErrorWriter) Write(b []byte) (int, error) {
	if e.replied {
		return len(b), nil
	}
	return e.ResponseWriter.Write(b)
}

type server struct {
	m   Engine
	co  LLMEndpoints
	log *slog.Logger
	// routes is every route with its policy (guard.go).
	routes []apiRoute
}

// Status maps an error kind to its HTTP status and wire name.
func Status(err error) (int, string) {
	switch errdefs.Kind(err) {
	case errdefs.ErrNotFound:
		return http.StatusNotFound, v1.ErrKindNotFound
	case errdefs.ErrAlreadyExists:
		return http.StatusConflict, v1.ErrKindAlreadyExists
	case errdefs.ErrInvalidArgument:
		return http.StatusBadRequest, v1.ErrKindInvalidArgument
	case errdefs.ErrFailedPrecondition:
		return http.StatusPreconditionFailed, v1.ErrKindFailedPrecondition
	case errdefs.ErrUnavailable:
		return http.StatusServiceUnavailable, v1.ErrKindUnavailable
	case errdefs.ErrNotSupported:
		return http.StatusNotImplemented, v1.ErrKindNotSupported
	case errdefs.ErrResourceExhausted:
		return http.StatusInsufficientStorage, v1.ErrKindResourceExhausted
	case errdefs.ErrConflict:
		return http.StatusConflict, v1.ErrKindConflict
	case errdefs.ErrUnauthenticated:
		return http.StatusUnauthorized, v1.ErrKindUnauthenticated
	case errdefs.ErrPermissionDenied:
		return http.StatusForbidden, v1.ErrKindPermissionDenied
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return http.StatusServiceUnavailable, v1.ErrKindUnavailable
	}
	return http.StatusInternalServerError, v1.ErrKindInternal
}

func writeError(w http.ResponseWriter, err error) {
	code, kind := Status(err)
	e := v1.Error{Kind: kind, Message: err.Error()}
	var amb *errdefs.AmbiguousError
	if errors.As(err, &amb) {
		e.Candidates = amb.Candidates
	}
	writeJSON(w, code, e)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// MaxBody bounds a request body.
const MaxBody = 1 << 20

// decode reads a JSON body into v; see DecodeBody.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	return DecodeBody(http.MaxBytesReader(w, r.Body, MaxBody), v)
}

// DecodeBody reads one JSON value into v and refuses what would make the
// request mean something other than what was sent: fields v does not
// have, anything but white space after the value, and values the request
// type's Validate refuses. An empty body leaves v as is (and validates
// it: a request type whose zero value is not a request is refused).
func DecodeBody(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("decode request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err == nil {
			err = errors.New("more than one JSON value")
		}
		return fmt.Errorf("decode request body: data after the request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if val, ok := v.(interface{ Validate() error }); ok {
		if err := val.Validate(); err != nil {
			return fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// reply writes v with status 200, or the error.
func reply[T any](w http.ResponseWriter, v T, err error) {
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *server) host(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, toHost(s.m.Host()))
}

func (s *server) images(w http.ResponseWriter, r *http.Request) {
	l, err := s.m.Images()
	reply(w, toImages(l), err)
}

func (s *server) image(w http.ResponseWriter, r *http.Request) {
	img, err := s.m.Image(r.PathValue("name"))
	reply(w, toImage(img), err)
}

func (s *server) imageRemove(w http.ResponseWriter, r *http.Request) {
	reply(w, struct{}{}, s.m.RemoveImage(r.Context(), r.PathValue("name")))
}

// progressWriter turns written text into NDJSON progress lines.
type progressWriter struct {
	mu  sync.Mutex
	enc *json.Encoder // +checklocks:mu
	f   http.Flusher  // +checklocks:mu
	buf []byte        // +checklocks:mu
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := strings.IndexByte(string(p.buf), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(p.buf[:i]), "\r")
		p.buf = p.buf[i+1:]
		if line != "" {
			_ = p.enc.Encode(v1.Progress{Message: line})
		}
	}
	if p.f != nil {
		p.f.Flush()
	}
	return len(b), nil
}

func (p *progressWriter) final(v v1.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.enc.Encode(v)
	if p.f != nil {
		p.f.Flush()
	}
}

func (s *server) imageBuild(w http.ResponseWriter, r *http.Request) {
	var req v1.ImageBuildRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	streamImage(w, func(log io.Writer) (meta.Image, error) { return s.m.BuildImage(r.Context(), req, log) })
}

// streamImage answers with NDJSON progress lines written by op, ending
// with its image or its error.
func streamImage(w http.ResponseWriter, op func(log io.Writer) (meta.Image, error)) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	f, _ := w.(http.Flusher)
	pw := &progressWriter{enc: json.NewEncoder(w), f: f}
	img, err := op(pw)
	if err != nil {
		_, kind := Status(err)
		pw.final(v1.Progress{Error: &v1.Error{Kind: kind, Message: err.Error()}})
		return
	}
	wire := toImage(img)
	pw.final(v1.Progress{Image: &wire})
}

func (s *server) imageImport(w http.ResponseWriter, r *http.Request) {
	var req v1.ImageImportRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if wantsProgress(r) {
		streamImage(w, func(log io.Writer) (meta.Image, error) { return s.m.ImportImage(r.Context(), req, log) })
		return
	}
	img, err := s.m.ImportImage(r.Context(), req, io.Discard)
	reply(w, toImage(img), err)
}

func (s *server) imagePull(w http.ResponseWriter, r *http.Request) {
	var req v1.ImagePullRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	streamImage(w, func(log io.Writer) (meta.Image, error) { return s.m.PullImage(r.Context(), req, log) })
}

func (s *server) imagePush(w http.ResponseWriter, r *http.Request) {
	var req v1.ImagePushRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	streamImage(w, func(log io.Writer) (meta.Image, error) {
		return s.m.PushImage(r.Context(), r.PathValue("name"), req, log)
	})
}

func (s *server) commit(w http.ResponseWriter, r *http.Request) {
	var req v1.CommitRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	img, err := s.m.CommitSandbox(r.Context(), r.PathValue("id"), req)
	reply(w, toImage(img), err)
}

func (s *server) sandboxes(w http.ResponseWriter, r *http.Request) {
	l, err := s.m.Sandboxes()
	reply(w, toSandboxes(visible(r, l)), err)
}

func (s *server) create(w http.ResponseWriter, r *http.Request) {
	var req v1.SandboxCreateRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := ownedCreate(r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.m.Create(r.Context(), req)
	reply(w, toSandbox(sb), err)
}

func (s *server) sandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Sandbox(r.Context(), r.PathValue("id"))
	reply(w, toSandbox(sb), err)
}

func (s *server) remove(w http.ResponseWriter, r *http.Request) {
	if sb, err := s.m.Sandbox(r.Context(), r.PathValue("id")); err == nil {
		s.co.Remove(sb.ID)
	}
	reply(w, struct{}{}, s.m.Remove(r.Context(), r.PathValue("id")))
}

func (s *server) llmSet(w http.ResponseWriter, r *http.Request) {
	var req v1.LLMEndpointRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if !tenant.Of(r.Context()).Admin && (req.Listen != "" || req.Expose) {
		writeError(w, fmt.Errorf("llm endpoint: listen and expose are the host admin's: %w", errdefs.ErrPermissionDenied))
		return
	}
	ep, err := s.co.Set(r.Context(), r.PathValue("id"), req)
	reply(w, ep, err)
}

func (s *server) llmGet(w http.ResponseWriter, r *http.Request) {
	ep, err := s.co.Get(r.Context(), r.PathValue("id"))
	reply(w, ep, err)
}

func (s *server) llmRemove(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Sandbox(r.Context(), r.PathValue("id"))
	if err == nil {
		s.co.Remove(sb.ID)
	}
	reply(w, struct{}{}, err)
}

func (s *server) stop(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Stop(r.Context(), r.PathValue("id"))
	reply(w, toSandbox(sb), err)
}

func (s *server) start(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Start(r.Context(), r.PathValue("id"))
	reply(w, toSandbox(sb), err)
}

// exec runs a command. A detached exec answers with JSON. Otherwise the
// request must ask to upgrade to molt-exec/1; after "101 Switching
// Protocols" the connection carries frames both ways (api/v1 stream.go),
// relayed unchanged between the client and the sandbox's init.
func (s *server) exec(w http.ResponseWriter, r *http.Request) {
	var req v1.ExecRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if !req.Detach && !strings.EqualFold(r.Header.Get("Upgrade"), v1.UpgradeProtocol) {
		writeError(w, fmt.Errorf("exec without detach needs the header Upgrade: %s: %w", v1.UpgradeProtocol, errdefs.ErrInvalidArgument))
		return
	}
	pid, ic, err := s.m.Exec(r.Context(), r.PathValue("id"), req)
	if err != nil {
		writeError(w, err)
		return
	}
	if req.Detach {
		writeJSON(w, http.StatusOK, v1.ExecDetached{Pid: pid})
		return
	}
	defer ic.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeError(w, errors.New("connection cannot be upgraded"))
		return
	}
	cc, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	defer cc.Close()
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + v1.UpgradeProtocol + "\r\n\r\n")
	if err := rw.Flush(); err != nil {
		return
	}
	relay(cc, rw.Reader, ic)
}

// relay copies frames until init closes its side (the command ended) or
// the client goes away (then init kills the command). A frame the client
// sends after init has closed (stdin's end, racing the command's exit)
// fails to reach init; that must not close init's connection before its
// last frames, the exit status among them, are relayed.
func relay(cc net.Conn, cr *bufio.Reader, ic net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, rerr := cr.Read(buf)
			if n > 0 {
				if _, werr := ic.Write(buf[:n]); werr != nil {
					return // init is done: the other direction drains it
				}
			}
			if rerr != nil {
				ic.Close() // the client is gone: init kills the command
				return
			}
		}
	}()
	_, _ = io.Copy(cc, ic)
	cc.Close()
	<-done
}

func (s *server) sessionRun(w http.ResponseWriter, r *http.Request) {
	if err := v1.ValidName("session", r.PathValue("name")); err != nil {
		writeError(w, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument))
		return
	}
	var req v1.SessionRunRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	res, err := s.m.SessionRun(r.Context(), r.PathValue("id"), r.PathValue("name"), req)
	reply(w, toSessionRunResult(res), err)
}

func (s *server) sessionClose(w http.ResponseWriter, r *http.Request) {
	if err := v1.ValidName("session", r.PathValue("name")); err != nil {
		writeError(w, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument))
		return
	}
	reply(w, struct{}{}, s.m.SessionClose(r.Context(), r.PathValue("id"), r.PathValue("name")))
}

func (s *server) checkpoints(w http.ResponseWriter, r *http.Request) {
	l, err := s.m.Checkpoints(r.PathValue("id"))
	reply(w, toCheckpoints(l), err)
}

func (s *server) checkpoint(w http.ResponseWriter, r *http.Request) {
	var req v1.CheckpointRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Kind == v1.KindAuto {
		// auto ends the turn: the inspector decides the kind (decode
		// checked the request: no --keep, no --wait).
		res, err := s.m.EndTurn(r.Context(), r.PathValue("id"), v1.TurnRequest{Label: req.Label})
		reply(w, toTurnResult(res), err)
		return
	}
	ck, err := s.m.Checkpoint(r.Context(), r.PathValue("id"), req)
	reply(w, toCheckpoint(ck), err)
}

func (s *server) turn(w http.ResponseWriter, r *http.Request) {
	var req v1.TurnRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	res, err := s.m.EndTurn(r.Context(), r.PathValue("id"), req)
	reply(w, toTurnResult(res), err)
}

func (s *server) turns(w http.ResponseWriter, r *http.Request) {
	l, err := s.m.Turns(r.PathValue("id"))
	wire := toTurnRecords(l)
	if wire == nil {
		wire = []v1.TurnRecord{}
	}
	reply(w, wire, err)
}

func (s *server) effects(w http.ResponseWriter, r *http.Request) {
	since, err := s.bodyCheckpoint(r, r.URL.Query().Get("since"))
	if err != nil {
		writeError(w, err)
		return
	}
	l, orphans, err := s.m.Effects(r.Context(), r.PathValue("id"), since)
	wire := make([]v1.Effect, 0, len(l))
	for _, x := range l {
		wire = append(wire, toEffect(x, orphans[x.ID]))
	}
	reply(w, wire, err)
}

func (s *server) declareEffect(w http.ResponseWriter, r *http.Request) {
	var req v1.EffectDeclareRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.ownCompensator(r, req.Compensator); err != nil {
		writeError(w, err)
		return
	}
	rec, err := s.m.DeclareEffect(r.Context(), r.PathValue("id"), req)
	reply(w, toEffect(rec, false), err)
}

func (s *server) consumeEffect(w http.ResponseWriter, r *http.Request) {
	var req v1.EffectConsumeRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	rec, err := s.m.ConsumeEffect(r.Context(), r.PathValue("id"), req)
	reply(w, toEffect(rec, false), err)
}

func (s *server) setCompensator(w http.ResponseWriter, r *http.Request) {
	var req v1.Compensator
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := s.ownCompensator(r, &req); err != nil {
		writeError(w, err)
		return
	}
	rec, err := s.m.SetCompensator(r.Context(), r.PathValue("id"), req)
	reply(w, toEffect(rec, false), err)
}

func (s *server) checkpointInfo(w http.ResponseWriter, r *http.Request) {
	ck, err := s.m.CheckpointInfo(r.PathValue("id"))
	reply(w, toCheckpoint(ck), err)
}

func (s *server) checkpointDelete(w http.ResponseWriter, r *http.Request) {
	reply(w, struct{}{}, s.m.DeleteCheckpoint(r.Context(), r.PathValue("id")))
}

func (s *server) rollback(w http.ResponseWriter, r *http.Request) {
	var req v1.RollbackRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	var err error
	if req.Checkpoint, err = s.bodyCheckpoint(r, req.Checkpoint); err != nil {
		writeError(w, err)
		return
	}
	res, err := s.m.RollbackWith(r.Context(), r.PathValue("id"), req)
	reply(w, toRollbackResult(res), err)
}

func (s *server) recover(w http.ResponseWriter, r *http.Request) {
	var req v1.RecoverRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	var err error
	if req.To, err = s.bodyCheckpoint(r, req.To); err != nil {
		writeError(w, err)
		return
	}
	res, err := s.m.Recover(r.Context(), r.PathValue("id"), req)
	reply(w, toRecoverResult(res), err)
}

func (s *server) recovery(w http.ResponseWriter, r *http.Request) {
	res, err := s.m.Recovery(r.PathValue("id"))
	reply(w, toRecoveryStatus(res), err)
}

func (s *server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	req := v1.ForkRequest{N: 1} // a request without "n" makes one
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	var err error
	if req.Checkpoint, err = s.bodyCheckpoint(r, req.Checkpoint); err != nil {
		writeError(w, err)
		return
	}
	res, err := s.m.Fork(r.Context(), r.PathValue("id"), req)
	reply(w, toForkResult(res), err)
}

func (s *server) forkCheckpoint(w http.ResponseWriter, r *http.Request) {
	req := v1.ForkRequest{N: 1} // a request without "n" makes one
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	req.Checkpoint = r.PathValue("id")
	res, err := s.m.Fork(r.Context(), "", req)
	reply(w, toForkResult(res), err)
}

// hibernate hibernates a sandbox; with ?offload=true, it then offloads
// it to the store.
func (s *server) hibernate(w http.ResponseWriter, r *http.Request) {
	offload, err := boolQuery(r, "offload")
	if err != nil {
		reply(w, v1.Sandbox{}, err)
		return
	}
	sb, err := s.m.Hibernate(r.Context(), r.PathValue("id"))
	if err == nil && offload {
		sb, err = s.m.Offload(r.Context(), sb.ID)
	}
	reply(w, toSandbox(sb), err)
}

func (s *server) offload(w http.ResponseWriter, r *http.Request) {
	sb, err := s.m.Offload(r.Context(), r.PathValue("id"))
	reply(w, toSandbox(sb), err)
}

func (s *server) resume(w http.ResponseWriter, r *http.Request) {
	var req v1.ResumeRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.m.ResumeWith(r.Context(), r.PathValue("id"), req)
	reply(w, toSandbox(sb), err)
}

func (s *server) migrate(w http.ResponseWriter, r *http.Request) {
	var req v1.MigrateRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	ctx := r.Context()
	// The LLM endpoint's settings (credentials in its headers) go to the
	// target over the migration's own TLS channel, never to the store.
	var llm v1.LLMEndpointRequest
	moving := false
	if sb, err := s.m.Sandbox(ctx, r.PathValue("id")); err == nil {
		llm, moving = s.co.Export(sb.ID)
	}
	res, err := s.m.MigrateTo(ctx, r.PathValue("id"), req)
	out := toMigrateResult(res)
	if err == nil && moving {
		out.LLMEndpoint, out.Note = s.moveLLM(ctx, req, res.Sandbox, llm)
		s.co.Remove(res.Sandbox)
	}
	reply(w, out, err)
}

// moveLLM sets a migrated sandbox's LLM endpoint on the target, with the
// token the agent's URL holds; it returns the target's endpoint, or a
// note saying why it did not move.
func (s *server) moveLLM(ctx context.Context, req v1.MigrateRequest, id string, llm v1.LLMEndpointRequest) (*v1.LLMEndpoint, string) {
	c, _, err := client.ForMigration(req)
	if err == nil {
		var ep v1.LLMEndpoint
		if ep, err = c.SetLLM(ctx, id, llm); err == nil {
			return &ep, ""
		}
	}
	s.log.Warn("migrate: the sandbox's LLM endpoint did not move", "sandbox", id, "err", err)
	return nil, fmt.Sprintf("the LLM endpoint did not move (setting it on the target needs a token with the admin scope there): %v; set it there with the same upstream and headers", err)
}

func (s *server) checkpointChain(w http.ResponseWriter, r *http.Request) {
	res, err := s.m.VerifyChain(r.PathValue("id"))
	reply(w, toChainVerification(res), err)
}

func (s *server) checkpointVerify(w http.ResponseWriter, r *http.Request) {
	ck, err := s.m.VerifyCheckpoint(r.PathValue("id"))
	reply(w, toCheckpoint(ck), err)
}

// boolQuery reads query parameter name: absent is false.
func boolQuery(r *http.Request, name string) (bool, error) {
	q := r.URL.Query().Get(name)
	if q == "" {
		return false, nil
	}
	v, err := strconv.ParseBool(q)
	if err != nil {
		return false, fmt.Errorf("query %s=%q: want true or false: %w", name, q, errdefs.ErrInvalidArgument)
	}
	return v, nil
}
