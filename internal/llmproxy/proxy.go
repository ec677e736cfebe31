package llmproxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Defaults for Config.
const (
	DefaultMaxBodyBytes int64 = 32 << 20
	DefaultRecordBytes        = 1 << 20
)

// Hooks connect the proxy to the turn machinery. Both methods are called on
// the request's goroutine; several calls may be in flight at once, so they
// must be safe for concurrent use.
type Hooks interface {
	// TurnEnd is called when an LLM call arrives, before it is forwarded.
	// It starts the turn's checkpoint and returns a gate; the proxy calls
	// gate(ctx) before writing the response headers to the agent (so the
	// agent cannot act on the reply before the checkpoint's consistent
	// instant). gate may be nil (no gating). An error from TurnEnd is not
	// fatal to the agent: the proxy logs it via Recorded (Call.HookErr) and
	// forwards anyway.
	//
	// ctx is the request's context: it is cancelled when the agent goes
	// away. Forwarding waits for TurnEnd, so it should return promptly.
	// The gate is called at most once, also before an error response (502)
	// is written, and not at all for a call the agent abandoned before its
	// reply arrived. Once gate returns, the reply goes through whatever it
	// returned; an error is recorded in Call.HookErr.
	TurnEnd(ctx context.Context, c *Call) (gate func(context.Context) error, err error)
	// Recorded is called once per proxied LLM call with the complete
	// exchange. It is also called for LLM calls the proxy rejected before
	// forwarding (413), for which TurnEnd was not called. It runs after the
	// response body has been written but before the response is finished
	// (a chunked stream's terminator is written when it returns), so slow
	// work belongs on another goroutine.
	Recorded(c *Call)
}

// Replayer is implemented by Hooks that can answer an LLM call from a
// record: a recovery's fast-forward. Replay is called before TurnEnd. A
// non-nil Reply is written to the agent as it is; the call is then
// neither forwarded nor ends a turn, and Recorded is still called, with
// Call.Replayed set.
type Replayer interface {
	Replay(ctx context.Context, c *Call) *Reply
}

// Reply is a recorded answer to an LLM call.
type Reply struct {
	Status      int
	ContentType string
	Header      http.Header // more headers (e.g. one naming the record)
	Body        []byte
}

// Call is one LLM call through the proxy. ID, API, Method, Path, Model,
// Stream, Request, RequestTruncated and Started are set before TurnEnd and
// do not change afterwards; the other fields are written by the proxy's
// request goroutine until Recorded is called and are final from then on.
type Call struct {
	ID     uint64 // sequence number, from 1, per Proxy
	API    string // APIOpenAIChat, APIOpenAIResponses or APIAnthropicMessages
	Method string
	Path   string // the path the agent requested, before mapping
	Model  string // the body's "model", if any
	Stream bool   // the body's "stream" is true

	// Request is the request body, cut to Config.RecordBytes.
	Request          []byte
	RequestTruncated bool
	// RequestSHA256 is the hex SHA-256 of the whole request body and
	// RequestBytes its length: the call's identity, whatever was kept.
	RequestSHA256 string
	RequestBytes  int

	// Status and Response are what the agent received: the upstream's
	// status and body, or the proxy's own error. Status is 0 when the
	// agent went away before anything was sent. Response is cut to
	// Config.RecordBytes.
	Status            int
	Response          []byte
	ResponseTruncated bool
	// ContentType is the response's Content-Type.
	ContentType string
	// Replayed: the response came from a record (Replayer), not from
	// the upstream.
	Replayed bool

	Started   time.Time     // the request arrived
	Forwarded time.Time     // the request was handed to the upstream transport
	FirstByte time.Time     // the upstream's response headers arrived (zero if none did)
	Ended     time.Time     // the response to the agent was finished or abandoned
	GateWait  time.Duration // time spent in the gate

	HookErr string // errors from TurnEnd and from the gate; the call went on regardless
	Err     string // why the exchange failed, if it did
}

// Config configures a Proxy.
type Config struct {
	// Upstream is the LLM API's base URL (http or https); its path is the
	// prefix forwarded paths are joined onto (see the package doc).
	Upstream *url.URL
	// Hooks are told of every LLM call; nil means none.
	Hooks Hooks
	// MaxBodyBytes bounds request bodies (DefaultMaxBodyBytes if 0);
	// larger ones get 413.
	MaxBodyBytes int64
	// RecordBytes bounds the recorded copies of request and response
	// bodies (DefaultRecordBytes if 0, nothing if negative); the Call
	// says when a copy was cut.
	RecordBytes int
	// Header is set on every upstream request, replacing what the agent
	// sent under the same names (e.g. Authorization, x-api-key).
	Header http.Header
	// Transport sends upstream requests (a clone of
	// http.DefaultTransport if nil).
	Transport http.RoundTripper
	// Logger receives the proxy's diagnostics (discarded if nil).
	Logger *slog.Logger
	// Token is the endpoint's secret: every request must carry it, as the
	// first path segments "/t/TOKEN" (a base URL any SDK can use) or as
	// the agent's API key ("Authorization: Bearer TOKEN", "x-api-key" or
	// "api-key"). It is compared in constant time and never forwarded.
	// Required unless NoToken.
	Token string
	// NoToken serves without a token: for a proxy mounted behind a handler
	// that authenticates, or served on a socket only its user can reach.
	NoToken bool
	// Expose allows serving on an address that is not loopback. The proxy
	// adds Header (the operator's credentials) to every call it forwards,
	// so anyone who can reach its address can spend them: without Expose,
	// Serve and ListenAndServe refuse such an address (ErrNotLoopback).
	Expose bool
}

// ErrNotLoopback is returned for a listen address that is not loopback
// when Config.Expose is not set.
var ErrNotLoopback = errors.New("llmproxy: address is not loopback (the proxy adds the operator's credentials to every call; expose it explicitly)")

// CheckListen checks a TCP listen address before it is bound: without
// expose, its host must be a loopback IP or "localhost" (an empty host or
// an unspecified IP listens on every interface; another name may resolve
// to anything). ListenAndServe checks the bound address again.
func CheckListen(addr string, expose bool) error {
	if expose {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("llmproxy: listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("listen on %q: %w", addr, ErrNotLoopback)
	}
	return nil
}

// localAddr reports whether a bound address is reachable from this host
// only: a loopback IP or a unix socket.
func localAddr(a net.Addr) bool {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	case *net.UnixAddr:
		return true
	}
	return false
}

// Proxy is the LLM proxy. It is an http.Handler and can serve on its own
// listener.
type Proxy struct {
	upstream    *url.URL
	hooks       Hooks
	maxBody     int64
	recordBytes int
	header      http.Header
	log         *slog.Logger
	rp          *httputil.ReverseProxy
	srv         *http.Server
	seq         atomic.Uint64
	expose      bool
	token       []byte // nil: no token required
}

// New returns a proxy to cfg.Upstream.
func New(cfg Config) (*Proxy, error) {
	u := cfg.Upstream
	if u == nil {
		return nil, errors.New("llmproxy: no upstream")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("llmproxy: upstream %s: scheme must be http or https", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("llmproxy: upstream %s: no host", u.Redacted())
	}
	if u.User != nil {
		return nil, fmt.Errorf("llmproxy: upstream %s: credentials in the URL are not sent; use Config.Header", u.Redacted())
	}
	switch {
	case cfg.Token == "" && !cfg.NoToken:
		return nil, errors.New("llmproxy: no token (set Config.Token, or Config.NoToken for a proxy behind its own authentication)")
	case cfg.Token != "" && !validToken(cfg.Token):
		return nil, errors.New("llmproxy: a token is 16 to 128 characters of [A-Za-z0-9_-]")
	}
	up := *u
	up.Fragment, up.RawFragment = "", ""

	p := &Proxy{
		upstream:    &up,
		hooks:       cfg.Hooks,
		maxBody:     cfg.MaxBodyBytes,
		recordBytes: cfg.RecordBytes,
		header:      make(http.Header),
		log:         cfg.Logger,
		expose:      cfg.Expose,
	}
	if cfg.Token != "" {
		p.token = []byte(cfg.Token)
	}
	if p.hooks == nil {
		p.hooks = noHooks{}
	}
	if p.maxBody <= 0 {
		p.maxBody = DefaultMaxBodyBytes
	}
	switch {
	case p.recordBytes == 0:
		p.recordBytes = DefaultRecordBytes
	case p.recordBytes < 0:
		p.recordBytes = 0
	}
	for k, vs := range cfg.Header {
		for _, v := range vs {
			p.header.Add(k, v)
		}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	rt := cfg.Transport
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	errLog := slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     &upstreamTransport{rt: rt},
		FlushInterval: -1, // flush after every write: streams reach the agent as they arrive
		ErrorHandler:  p.proxyError,
		ErrorLog:      errLog,
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: time.Minute,
		ErrorLog:          errLog,
	}
	return p, nil
}

// Serve serves the proxy on l until Close or Shutdown; it then returns
// http.ErrServerClosed. l is closed on return. A listener that is not
// loopback (or a unix socket) is refused unless Config.Expose.
func (p *Proxy) Serve(l net.Listener) error {
	if !p.expose && !localAddr(l.Addr()) {
		l.Close()
		return fmt.Errorf("serve on %s: %w", l.Addr(), ErrNotLoopback)
	}
	return p.srv.Serve(l)
}

// ListenAndServe listens on the TCP address addr (e.g. "127.0.0.1:0"),
// serves in the background and returns the bound address. Without
// Config.Expose the address must be loopback (see CheckListen).
func (p *Proxy) ListenAndServe(addr string) (net.Addr, error) {
	if err := CheckListen(addr, p.expose); err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("llmproxy: %w", err)
	}
	if !p.expose && !localAddr(l.Addr()) { // "localhost" resolved elsewhere
		l.Close()
		return nil, fmt.Errorf("listen on %s: %w", l.Addr(), ErrNotLoopback)
	}
	go func() {
		if err := p.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("llmproxy: serve", "addr", l.Addr().String(), "err", err)
		}
	}()
	return l.Addr(), nil
}

// Close closes the proxy's listeners and connections at once; calls in
// flight are cancelled (upstream too) and are still Recorded, possibly after
// Close returns.
func (p *Proxy) Close() error {
	return p.srv.Close()
}

// Shutdown stops accepting connections and waits, until ctx is done, for the
// calls in flight to finish; streams in progress are not interrupted. Use
// Close afterwards to cut off what is left.
func (p *Proxy) Shutdown(ctx context.Context) error {
	return p.srv.Shutdown(ctx)
}

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	started := time.Now()
	if p.token != nil {
		var ok bool
		if r, ok = p.authenticate(r); !ok {
			p.log.Warn("llmproxy: request without the endpoint's token refused", "method", r.Method, "remote", r.RemoteAddr)
			p.refuse(w, r, http.StatusUnauthorized, "authentication_error", "llmproxy: this endpoint needs its token (in the base URL's path /t/TOKEN, or as the API key)")
			return
		}
	}
	if !forwarded(r.URL.Path) {
		// The operator's credentials go only to the LLM API's own paths.
		p.refuse(w, r, http.StatusForbidden, "permission_error", "llmproxy: "+r.URL.Path+" is not an LLM API path this proxy forwards")
		return
	}
	api := classify(r.Method, r.URL.Path)
	var c *Call
	if api != "" {
		c = &Call{ID: p.seq.Add(1), API: api, Method: r.Method, Path: r.URL.Path, Started: started}
	}

	body, status, err := p.readBody(w, r)
	if err != nil {
		msg := "llmproxy: " + err.Error()
		akind := "invalid_request_error"
		if status == http.StatusRequestEntityTooLarge {
			akind = "request_too_large"
		}
		eb := errorBody(anthropicStyle(api, r), "invalid_request_error", akind, msg)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "close") // the rest of the body stays unread
		w.WriteHeader(status)
		_, _ = w.Write(eb)
		if c != nil {
			c.Status = status
			c.Response, c.ResponseTruncated = clip(eb, p.recordBytes)
			c.Err = msg
			c.Ended = time.Now()
			p.hooks.Recorded(c)
		}
		return
	}

	ctx := r.Context()
	var st *callState
	if c != nil {
		c.Model, c.Stream = parseBody(body)
		c.Request, c.RequestTruncated = clip(body, p.recordBytes)
		sum := sha256.Sum256(body)
		c.RequestSHA256, c.RequestBytes = hex.EncodeToString(sum[:]), len(body)
		if rp, ok := p.hooks.(Replayer); ok {
			if rep := rp.Replay(ctx, c); rep != nil {
				p.replay(w, c, rep)
				return
			}
		}
		st = &callState{call: c, resp: capBuf{limit: p.recordBytes}}
		gate, err := p.hooks.TurnEnd(ctx, c)
		if err != nil {
			st.hookErr("turn end: " + err.Error())
			p.log.Warn("llmproxy: turn end hook failed; forwarding anyway", "call", c.ID, "err", err)
		}
		st.gate = gate
		ctx = context.WithValue(ctx, callKey{}, st)
	}

	// The body has been read whole: forward it from memory, with a known
	// length, replayable should the transport retry.
	out := r.WithContext(ctx)
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	out.Body = http.NoBody
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if len(body) > 0 {
		out.Body, _ = out.GetBody()
	}

	if st == nil {
		p.rp.ServeHTTP(w, out)
		return
	}
	// ReverseProxy panics with http.ErrAbortHandler when a response breaks
	// off mid-copy; record the call on the way out either way.
	completed := false
	defer func() { p.finish(r.Context(), st, !completed) }()
	p.rp.ServeHTTP(w, out)
	completed = true
}

// replay answers an LLM call from a record.
func (p *Proxy) replay(w http.ResponseWriter, c *Call, rep *Reply) {
	for k, vs := range rep.Header {
		w.Header()[k] = slices.Clone(vs)
	}
	if rep.ContentType != "" {
		w.Header().Set("Content-Type", rep.ContentType)
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(rep.Body)))
	w.WriteHeader(rep.Status)
	if _, err := w.Write(rep.Body); err != nil {
		c.Err = "replayed response to the client broke off: " + err.Error()
	}
	c.Status, c.ContentType, c.Replayed = rep.Status, rep.ContentType, true
	c.Response, c.ResponseTruncated = clip(rep.Body, p.recordBytes)
	c.Ended = time.Now()
	p.hooks.Recorded(c)
}

// refuse answers a request the proxy does not forward, in the API's style.
func (p *Proxy) refuse(w http.ResponseWriter, r *http.Request, status int, akind, msg string) {
	if r.Body != nil {
		w.Header().Set("Connection", "close") // the body stays unread
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorBody(anthropicStyle("", r), "invalid_request_error", akind, msg))
}

// authenticate finds the endpoint's token in r: as the path's leading
// "/t/TOKEN" (removed from the request's path) or in a header that
// carries an API key (removed from the request's headers). It returns
// the request to proxy and whether the token was there.
func (p *Proxy) authenticate(r *http.Request) (*http.Request, bool) {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/t/"); ok {
		tok, tail, _ := strings.Cut(rest, "/")
		if subtle.ConstantTimeCompare([]byte(tok), p.token) != 1 {
			return r, false
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + tail
		r2.URL.RawPath = ""
		if raw, ok := strings.CutPrefix(r.URL.RawPath, "/t/"+tok); ok {
			r2.URL.RawPath = "/" + strings.TrimPrefix(raw, "/")
		}
		p.keyHeaders(r2)
		return r2, true
	}
	r2 := r.Clone(r.Context())
	return r2, p.keyHeaders(r2)
}

// keyHeaders removes the API-key headers of r that hold the token, and
// reports whether one did.
func (p *Proxy) keyHeaders(r *http.Request) bool {
	found := false
	for _, h := range []string{"Authorization", "X-Api-Key", "Api-Key"} {
		v := r.Header.Get(h)
		if h == "Authorization" {
			var ok bool
			if v, ok = strings.CutPrefix(v, "Bearer "); !ok {
				continue
			}
		}
		if v != "" && subtle.ConstantTimeCompare([]byte(v), p.token) == 1 {
			r.Header.Del(h)
			found = true
		}
	}
	return found
}

// validToken reports whether s can be a token: long enough to guess
// nothing, and made of characters that need no escaping in a path.
func validToken(s string) bool {
	if len(s) < 16 || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// readBody reads the request body whole, up to the proxy's limit. On failure
// it returns the status to answer with.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if r.ContentLength > p.maxBody {
		return nil, http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, p.maxBody)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, p.maxBody)); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, http.StatusRequestEntityTooLarge,
				fmt.Errorf("request body exceeds the limit of %d bytes", p.maxBody)
		}
		return nil, http.StatusBadRequest, fmt.Errorf("read request body: %w", err)
	}
	return buf.Bytes(), 0, nil
}

// rewrite routes the outbound request to the upstream.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	in, out := pr.In, pr.Out
	up := p.upstream
	out.URL.Scheme = up.Scheme
	out.URL.Host = up.Host
	out.URL.User = nil
	out.URL.Opaque = ""
	out.URL.Path = mapPath(up.Path, in.URL.Path)
	out.URL.RawPath = ""
	if up.RawPath != "" || in.URL.RawPath != "" {
		out.URL.RawPath = mapPath(up.EscapedPath(), in.URL.EscapedPath())
	}
	out.URL.RawQuery = joinQuery(up.RawQuery, out.URL.RawQuery)
	out.Host = "" // the Host header is the upstream's
	out.Header.Del("Expect")
	if stateOf(out.Context()) != nil {
		// Let the transport negotiate compression and decode it, so that
		// the recorded response is plain text.
		out.Header.Del("Accept-Encoding")
	}
	for k, vs := range p.header {
		out.Header[k] = slices.Clone(vs)
	}
}

// proxyError answers a request the upstream did not: 502 in the API's style.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	ctx := r.Context()
	st := stateOf(ctx)
	if ctx.Err() != nil {
		// The agent went away (or the proxy is closing): nobody to answer.
		if st != nil && st.call.Err == "" {
			st.call.Err = "client went away before the response: " + describe(err)
		}
		return
	}
	msg := "llmproxy: upstream request failed: " + describe(err)
	api := ""
	if st != nil {
		api = st.call.API
		st.call.Err = msg
		if st.runGate(ctx) != nil {
			return
		}
	}
	p.log.Warn("llmproxy: upstream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	eb := errorBody(anthropicStyle(api, r), "proxy_error", "api_error", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	_, _ = w.Write(eb)
	if st != nil {
		st.call.Status = http.StatusBadGateway
		st.resp.write(eb)
	}
}

// finish completes a call's record and hands it to Recorded.
func (p *Proxy) finish(ctx context.Context, st *callState, aborted bool) {
	c := st.call
	c.Ended = time.Now()
	c.Response, c.ResponseTruncated = st.resp.bytes()
	if c.Err == "" {
		switch {
		case (aborted || st.readErr != nil) && ctx.Err() != nil:
			c.Err = "client went away during the response"
		case st.readErr != nil:
			c.Err = "upstream response broke off: " + describe(st.readErr)
		case aborted:
			c.Err = "response to the client broke off"
		}
	}
	p.log.Debug("llmproxy: call", "call", c.ID, "api", c.API, "model", c.Model, "stream", c.Stream,
		"status", c.Status, "gate_wait", c.GateWait, "duration", c.Ended.Sub(c.Started), "err", c.Err)
	p.hooks.Recorded(c)
}

// describe is an error's message without the URL a url.Error carries: the
// agent should not learn the upstream's query (which may hold a key).
func describe(err error) string {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	return err.Error()
}

// callKey keys the *callState in an LLM call's request context.
type callKey struct{}

func stateOf(ctx context.Context) *callState {
	st, _ := ctx.Value(callKey{}).(*callState)
	return st
}

// callState is an LLM call in progress. It is used only on the request's
// goroutine (ReverseProxy calls the transport, reads the body and calls the
// error handler there).
type callState struct {
	call    *Call
	gate    func(context.Context) error
	gated   bool
	resp    capBuf
	readErr error // the upstream body's read error, other than EOF
}

func (st *callState) hookErr(msg string) {
	if st.call.HookErr != "" {
		st.call.HookErr += "; "
	}
	st.call.HookErr += msg
}

// runGate calls the gate once. A gate error is recorded and otherwise
// ignored, unless ctx is done (the agent went away): that is returned.
func (st *callState) runGate(ctx context.Context) error {
	if st.gated {
		return nil
	}
	st.gated = true
	if st.gate == nil {
		return nil
	}
	t0 := time.Now()
	err := st.gate(ctx)
	st.call.GateWait = time.Since(t0)
	if err != nil {
		st.hookErr("gate: " + err.Error())
	}
	return ctx.Err()
}

// upstreamTransport times the upstream exchange of LLM calls, holds the
// response at the gate until the checkpoint allows it through, and tees the
// response body into the record. ReverseProxy copies the response headers
// downstream only after RoundTrip returns, so gating here is gating just
// before the headers are written.
type upstreamTransport struct {
	rt http.RoundTripper
}

func (t *upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st := stateOf(req.Context())
	if st == nil {
		return t.rt.RoundTrip(req)
	}
	st.call.Forwarded = time.Now()
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	st.call.FirstByte = time.Now()
	if err := st.runGate(req.Context()); err != nil {
		resp.Body.Close()
		return nil, err
	}
	st.call.Status = resp.StatusCode
	st.call.ContentType = resp.Header.Get("Content-Type")
	resp.Body = &teeBody{rc: resp.Body, st: st}
	return resp, nil
}

// teeBody copies what is read from an upstream body into the call's record.
type teeBody struct {
	rc io.ReadCloser
	st *callState
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.st.resp.write(p[:n])
	if err != nil && err != io.EOF && b.st.readErr == nil {
		b.st.readErr = err
	}
	return n, err
}

func (b *teeBody) Close() error { return b.rc.Close() }

// capBuf keeps the first limit bytes written to it.
type capBuf struct {
	b         []byte
	limit     int
	truncated bool
}

func (c *capBuf) write(p []byte) {
	if room := c.limit - len(c.b); len(p) > room {
		c.truncated = true
		p = p[:max(room, 0)]
	}
	c.b = append(c.b, p...)
}

func (c *capBuf) bytes() ([]byte, bool) { return c.b, c.truncated }

// clip returns a copy of b cut to limit bytes, and whether it was cut.
func clip(b []byte, limit int) ([]byte, bool) {
	if len(b) <= limit {
		return bytes.Clone(b), false
	}
	return bytes.Clone(b[:limit]), true
}

type noHooks struct{}

func (noHooks) TurnEnd(context.Context, *Call) (func(context.Context) error, error) { return nil, nil }
func (noHooks) Recorded(*Call)                                                      {}
