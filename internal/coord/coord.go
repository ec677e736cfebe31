// Package coord is the turn coordinator: it gives a sandbox an LLM
// endpoint (an HTTP reverse proxy to the agent's real LLM API) and ends
// the sandbox's turn whenever the agent calls its LLM through it.
//
// The agent changes nothing but its base URL. A call arriving at the
// proxy ends the current turn: the coordinator runs the turn's auto
// checkpoint (none, fs or full, as the inspector decides) while the call
// is forwarded, so the checkpoint overlaps the LLM's latency. A
// completion gate keeps the next turn's commands from running before
// the checkpoint's consistent instant is captured: with gate "response"
// (the default) the reply is held until then; with gate "exec" the reply
// goes at once and the sandbox's next command waits instead. Each call's
// request and response are recorded in the turn log next to the turn's
// commands and their output, for replay in recovery.
package coord

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/core"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/llmproxy"
	"github.com/molt-sh/molt/internal/meta"
)

// Gate modes.
const (
	GateResponse = "response"
	GateExec     = "exec"
)

// Coordinator owns the LLM endpoints of a Manager's sandboxes.
type Coordinator struct {
	m   *core.Manager
	log *slog.Logger

	mu sync.Mutex
	// By sandbox ID.
	eps map[string]*endpoint // +checklocks:mu
}

type endpoint struct {
	c       *Coordinator
	sandbox string
	gate    string
	proxy   *llmproxy.Proxy
	info    v1.LLMEndpoint
	// req is the request that set it, with its token: what a migration
	// sets on the target (Export).
	req v1.LLMEndpointRequest

	mu sync.Mutex
	// By call ID, until recorded.
	turns map[uint64]*turnWait // +checklocks:mu
}

// New returns a coordinator for m's sandboxes.
func New(m *core.Manager, log *slog.Logger) *Coordinator {
	if log == nil {
		log = slog.Default()
	}
	return &Coordinator{m: m, log: log, eps: map[string]*endpoint{}}
}

// Set gives a sandbox an LLM endpoint (replacing one it had).
func (c *Coordinator) Set(ctx context.Context, ref string, req v1.LLMEndpointRequest) (v1.LLMEndpoint, error) {
	u, err := url.Parse(req.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return v1.LLMEndpoint{}, fmt.Errorf("llm upstream %q: want an http(s) base URL: %w", req.Upstream, errdefs.ErrInvalidArgument)
	}
	switch req.Gate {
	case "":
		req.Gate = GateResponse
	case GateResponse, GateExec:
	default:
		return v1.LLMEndpoint{}, fmt.Errorf("llm gate %q: want response or exec: %w", req.Gate, errdefs.ErrInvalidArgument)
	}
	if req.Listen == "" {
		req.Listen = "127.0.0.1:0"
	}
	if err := llmproxy.CheckListen(req.Listen, req.Expose); err != nil {
		return v1.LLMEndpoint{}, fmt.Errorf("llm endpoint: %v (set expose to allow it): %w", err, errdefs.ErrInvalidArgument)
	}
	sb, err := c.m.Sandbox(ctx, ref)
	if err != nil {
		return v1.LLMEndpoint{}, err
	}
	if req.Ignore != nil {
		if err := c.m.SetTurnIgnore(sb.ID, req.Ignore); err != nil {
			return v1.LLMEndpoint{}, err
		}
	}
	ep := &endpoint{c: c, sandbox: sb.ID, gate: req.Gate, turns: map[uint64]*turnWait{}}
	h := http.Header{}
	for k, v := range req.Header {
		h.Set(k, v)
	}
	token := req.Token
	if token == "" {
		if token, err = newToken(); err != nil {
			return v1.LLMEndpoint{}, err
		}
	} else if !tokenRE.MatchString(token) {
		return v1.LLMEndpoint{}, fmt.Errorf("llm endpoint token: want 32 to 128 characters of A-Z, a-z, 0-9, '-' and '_': %w", errdefs.ErrInvalidArgument)
	}
	ep.req = req
	ep.req.Token = token
	// Responses are recorded whole (a recovery replays them); the turn
	// log bounds what it keeps per sandbox.
	p, err := llmproxy.New(llmproxy.Config{Upstream: u, Hooks: ep, Header: h, Logger: c.log, Expose: req.Expose, Token: token,
		RecordBytes: int(llmproxy.DefaultMaxBodyBytes)})
	if err != nil {
		return v1.LLMEndpoint{}, fmt.Errorf("llm endpoint: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	addr, err := p.ListenAndServe(req.Listen)
	if errors.Is(err, llmproxy.ErrNotLoopback) {
		return v1.LLMEndpoint{}, fmt.Errorf("llm endpoint: %v (set expose to allow it): %w", err, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		return v1.LLMEndpoint{}, fmt.Errorf("llm endpoint: listen on %s: %w", req.Listen, err)
	}
	if req.Expose {
		c.log.Warn("llm endpoint exposed beyond loopback: whoever reaches it spends the upstream credentials", "sandbox", sb.ID, "addr", addr.String())
	}
	ep.proxy = p
	host := addr.String()
	if ta, ok := addr.(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		host = net.JoinHostPort("127.0.0.1", fmt.Sprint(ta.Port))
	}
	// The token is shown once, in the answer to this call: Get gives the
	// base URL without it.
	ep.info = v1.LLMEndpoint{Sandbox: sb.ID, URL: "http://" + host + "/v1", Upstream: req.Upstream, Gate: req.Gate}
	c.mu.Lock()
	old := c.eps[sb.ID]
	c.eps[sb.ID] = ep
	c.mu.Unlock()
	if old != nil {
		old.proxy.Close()
	}
	shown := ep.info
	shown.URL = "http://" + host + "/t/" + token + "/v1"
	shown.Token = token
	return shown, nil
}

// tokenRE is what an endpoint token given by the caller must be.
var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{32,128}$`)

// Export returns what set sandbox id's LLM endpoint, its token
// included, for a migration to set it on the target; the listen
// address and exposure are this host's and are left out. false: none.
func (c *Coordinator) Export(id string) (v1.LLMEndpointRequest, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ep := c.eps[id]
	if ep == nil {
		return v1.LLMEndpointRequest{}, false
	}
	req := ep.req
	req.Listen, req.Expose = "", false
	req.Header = maps.Clone(req.Header)
	req.Ignore = slices.Clone(req.Ignore)
	return req, true
}

// newToken makes an endpoint token: 192 random bits, URL-safe.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("llm endpoint token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// Get returns a sandbox's LLM endpoint, without its token.
func (c *Coordinator) Get(ctx context.Context, ref string) (v1.LLMEndpoint, error) {
	sb, err := c.m.Sandbox(ctx, ref)
	if err != nil {
		return v1.LLMEndpoint{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ep := c.eps[sb.ID]
	if ep == nil {
		return v1.LLMEndpoint{}, fmt.Errorf("sandbox %s has no LLM endpoint: %w", sb.ID, errdefs.ErrNotFound)
	}
	return ep.info, nil
}

// Remove closes a sandbox's LLM endpoint. Removing none is not an error.
func (c *Coordinator) Remove(id string) {
	c.mu.Lock()
	ep := c.eps[id]
	delete(c.eps, id)
	c.mu.Unlock()
	if ep != nil {
		ep.proxy.Close()
	}
}

// Close closes every endpoint.
func (c *Coordinator) Close() {
	c.mu.Lock()
	eps := c.eps
	c.eps = map[string]*endpoint{}
	c.mu.Unlock()
	for _, ep := range eps {
		ep.proxy.Close()
	}
}

// turnWait is a turn end in progress, started by one LLM call.
type turnWait struct {
	done chan struct{}
	out  core.TurnOutcome // set when done is closed
}

// TurnEnd ends the sandbox's turn in the background while the call is
// forwarded; the returned gate waits for the checkpoint's capture.
func (ep *endpoint) TurnEnd(ctx context.Context, call *llmproxy.Call) (func(context.Context) error, error) {
	ch := ep.c.m.EndTurnAsync(ep.sandbox, v1.TurnRequest{})
	tw := &turnWait{done: make(chan struct{})}
	go func() { tw.out = <-ch; close(tw.done) }()
	ep.mu.Lock()
	ep.turns[call.ID] = tw
	ep.mu.Unlock()
	if ep.gate != GateResponse {
		return nil, nil
	}
	return func(ctx context.Context) error {
		select {
		case <-tw.done:
			return tw.out.Err
		case <-ctx.Done():
			return ctx.Err()
		}
	}, nil
}

// Replay answers the call from the sandbox's fast-forward when a
// recovery's is under way and the call is its next exchange: the agent
// gets the recorded reply, and no turn ends (the sandbox already is in
// the state that turn ended in).
func (ep *endpoint) Replay(_ context.Context, call *llmproxy.Call) *llmproxy.Reply {
	rec, turn, ok := ep.c.m.ReplayLLM(ep.sandbox, call.API, call.Path, call.RequestSHA256, call.RequestBytes)
	if !ok {
		return nil
	}
	ct := rec.ContentType
	if ct == "" {
		ct = "application/json"
	}
	return &llmproxy.Reply{
		Status: rec.Status, ContentType: ct, Body: []byte(rec.Response),
		Header: http.Header{"Molt-Replayed": {fmt.Sprintf("turn %d", turn)}},
	}
}

// Recorded files the call in the log of the turn it ended, before the
// agent sees the reply's end: a recovery replays what the log holds, so
// a reply the agent acted on must be in it.
func (ep *endpoint) Recorded(call *llmproxy.Call) {
	ep.mu.Lock()
	tw := ep.turns[call.ID]
	delete(ep.turns, call.ID)
	ep.mu.Unlock()
	if call.Replayed {
		return // its record is the one replayed
	}
	rec := meta.LLMCall{
		ID: int(call.ID), API: call.API, Path: call.Path, Model: call.Model, Stream: call.Stream,
		Status: call.Status, Request: string(call.Request), RequestTruncated: call.RequestTruncated,
		RequestSHA256: call.RequestSHA256, RequestBytes: call.RequestBytes, ContentType: call.ContentType,
		Response: string(call.Response), ResponseTruncated: call.ResponseTruncated,
		Started: call.Started.UTC(), Ended: call.Ended.UTC(),
		GateWaitMS: float64(call.GateWait.Microseconds()) / 1000, Error: joinErr(call.Err, call.HookErr),
	}
	if call.Status == 0 || strings.Contains(call.Err, "broke off") || strings.Contains(call.Err, "went away") {
		// What was kept is not a whole reply the agent received: a
		// recovery must not replay it as one.
		rec.ResponseTruncated = true
	}
	if tw == nil {
		ep.c.log.Warn("LLM call ended no turn", "sandbox", ep.sandbox, "call", call.ID, "err", rec.Error)
		return
	}
	select {
	case <-tw.done:
	case <-time.After(5 * time.Minute):
		ep.c.log.Warn("LLM call's turn end did not finish", "sandbox", ep.sandbox, "call", call.ID)
		return
	}
	if tw.out.Err != nil {
		ep.c.log.Warn("LLM call's turn end failed", "sandbox", ep.sandbox, "call", call.ID, "err", tw.out.Err)
		ep.c.m.TurnUnrecorded(ep.sandbox, fmt.Sprintf("LLM call %d was not recorded: its turn end failed: %v", call.ID, tw.out.Err))
		return
	}
	if err := ep.c.m.RecordLLM(ep.sandbox, tw.out.Result.Turn, rec); err != nil {
		ep.c.log.Warn("LLM call not recorded", "sandbox", ep.sandbox, "turn", tw.out.Result.Turn, "err", err)
	}
}

func joinErr(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
