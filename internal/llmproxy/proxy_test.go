package llmproxy

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const wait = 5 * time.Second

// testHooks remembers what the proxy told it.
type testHooks struct {
	mu       sync.Mutex
	turns    []Call // copies taken inside TurnEnd
	gate     func(context.Context) error
	err      error
	recorded chan *Call
}

func newHooks() *testHooks { return &testHooks{recorded: make(chan *Call, 16)} }

func (h *testHooks) TurnEnd(ctx context.Context, c *Call) (func(context.Context) error, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.turns = append(h.turns, *c)
	return h.gate, h.err
}

func (h *testHooks) Recorded(c *Call) { h.recorded <- c }

func (h *testHooks) turnCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.turns)
}

func (h *testHooks) next(t *testing.T) *Call {
	t.Helper()
	select {
	case c := <-h.recorded:
		return c
	case <-time.After(wait):
		t.Fatal("no call recorded")
		return nil
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// upstream starts a fake LLM API.
func upstream(t *testing.T, h http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// testToken is the endpoint token of the proxies start serves.
const testToken = "test-token-0123456789"

// start serves a proxy on a loopback port and returns its base URL, the
// token's path included.
func start(t *testing.T, cfg Config) string {
	t.Helper()
	if cfg.Token == "" && !cfg.NoToken {
		cfg.Token = testToken
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := p.ListenAndServe("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if cfg.NoToken {
		return "http://" + addr.String()
	}
	return "http://" + addr.String() + "/t/" + cfg.Token
}

// post sends an SDK-shaped JSON request.
func post(t *testing.T, ctx context.Context, u, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "OpenAI/Python 1.0")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkTimes(t *testing.T, c *Call) {
	t.Helper()
	if c.Started.IsZero() || c.Forwarded.Before(c.Started) || c.FirstByte.Before(c.Forwarded) || c.Ended.Before(c.FirstByte) {
		t.Errorf("times out of order: started %v forwarded %v first byte %v ended %v", c.Started, c.Forwarded, c.FirstByte, c.Ended)
	}
}

const chatReq = `{"model":"gpt-4o-mini","messages":[{"role":"user","content":"say hi"}]}`
const chatReply = `{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`

func TestOpenAIChat(t *testing.T) {
	type seen struct {
		method, path, host, body string
		hdr                      http.Header
	}
	seenc := make(chan seen, 1)
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seenc <- seen{r.Method, r.URL.Path, r.Host, string(b), r.Header.Clone()}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Request-Id", "req-1")
		io.WriteString(w, chatReply)
	})
	h := newHooks()
	base := start(t, Config{
		Upstream: mustURL(t, up.URL+"/v1"),
		Hooks:    h,
		Header:   http.Header{"Authorization": {"Bearer real-key"}},
	})

	resp := post(t, t.Context(), base+"/v1/chat/completions", chatReq, map[string]string{
		"Authorization": "Bearer agent-key",
		"Connection":    "X-Hop",
		"X-Hop":         "1",
		"X-Keep":        "yes",
	})
	got := readAll(t, resp)
	if resp.StatusCode != 200 || got != chatReply {
		t.Fatalf("agent got %d %q", resp.StatusCode, got)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" || resp.Header.Get("X-Request-Id") != "req-1" {
		t.Errorf("response headers not passed on: %v", resp.Header)
	}

	s := <-seenc
	upHost := mustURL(t, up.URL).Host
	if s.method != "POST" || s.path != "/v1/chat/completions" || s.host != upHost || s.body != chatReq {
		t.Errorf("upstream got %s %s host %s body %q", s.method, s.path, s.host, s.body)
	}
	if a := s.hdr.Get("Authorization"); a != "Bearer real-key" {
		t.Errorf("upstream Authorization = %q, want the configured one", a)
	}
	if s.hdr.Get("X-Hop") != "" || s.hdr.Get("X-Keep") != "yes" {
		t.Errorf("hop-by-hop headers not handled: %v", s.hdr)
	}

	c := h.next(t)
	if c.ID != 1 || c.API != APIOpenAIChat || c.Method != "POST" || c.Path != "/v1/chat/completions" ||
		c.Model != "gpt-4o-mini" || c.Stream {
		t.Errorf("call = %+v", c)
	}
	if string(c.Request) != chatReq || c.RequestTruncated || c.Status != 200 || string(c.Response) != chatReply || c.ResponseTruncated {
		t.Errorf("recorded exchange: %d %q %q (truncated %v %v)", c.Status, c.Request, c.Response, c.RequestTruncated, c.ResponseTruncated)
	}
	if c.Err != "" || c.HookErr != "" {
		t.Errorf("errors recorded: %q %q", c.Err, c.HookErr)
	}
	checkTimes(t, c)
	if n := h.turnCount(); n != 1 {
		t.Fatalf("TurnEnd called %d times", n)
	}
	if turn := h.turns[0]; turn.ID != 1 || turn.Model != "gpt-4o-mini" || turn.Status != 0 || !turn.Forwarded.IsZero() {
		t.Errorf("TurnEnd saw %+v; want it before forwarding", turn)
	}
}

// TestStreaming checks that streamed responses reach the agent as they
// arrive: the upstream holds its last chunk back until the agent has the
// first, so a proxy that buffers fails.
func TestStreaming(t *testing.T) {
	for _, tc := range []struct {
		name, ctype string
		chunks      []string
	}{
		{"sse", "text/event-stream", []string{
			"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
			"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
			"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
			"data: [DONE]\n\n",
		}},
		{"chunked", "application/x-ndjson", []string{
			"{\"message\":{\"content\":\"Hel\"}}\n",
			"{\"message\":{\"content\":\"lo\"}}\n",
			"{\"done\":true}\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotFirst := make(chan struct{})
			var late atomic.Bool
			up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				for i, chunk := range tc.chunks {
					if i == len(tc.chunks)-1 {
						select {
						case <-gotFirst:
						case <-time.After(3 * time.Second):
							late.Store(true)
						}
					}
					io.WriteString(w, chunk)
					w.(http.Flusher).Flush()
					time.Sleep(20 * time.Millisecond)
				}
			})
			h := newHooks()
			base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})

			resp := post(t, t.Context(), base+"/v1/chat/completions",
				`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
			defer resp.Body.Close()
			if ct := resp.Header.Get("Content-Type"); ct != tc.ctype {
				t.Errorf("Content-Type = %q", ct)
			}
			first := make([]byte, len(tc.chunks[0]))
			if _, err := io.ReadFull(resp.Body, first); err != nil {
				t.Fatal(err)
			}
			close(gotFirst)
			rest, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if late.Load() {
				t.Fatal("the agent got the first chunk only after the upstream sent the last: the response was buffered")
			}
			all := strings.Join(tc.chunks, "")
			if got := string(first) + string(rest); got != all {
				t.Errorf("agent got %q, want %q", got, all)
			}

			c := h.next(t)
			if !c.Stream || c.Model != "gpt-4o" || c.Status != 200 || string(c.Response) != all || c.Err != "" {
				t.Errorf("recorded %+v", c)
			}
			checkTimes(t, c)
		})
	}
}

func TestAnthropicMessages(t *testing.T) {
	const req = `{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	const reply = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn"}`
	hdrc := make(chan http.Header, 1)
	pathc := make(chan string, 1)
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		hdrc <- r.Header.Clone()
		pathc <- r.URL.Path
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, reply)
	})
	h := newHooks()
	base := start(t, Config{
		Upstream: mustURL(t, up.URL),
		Hooks:    h,
		Header:   http.Header{"x-api-key": {"sk-ant-real"}},
	})
	resp := post(t, t.Context(), base+"/v1/messages", req, map[string]string{
		"x-api-key":         "sk-ant-agent",
		"anthropic-version": "2023-06-01",
	})
	if got := readAll(t, resp); resp.StatusCode != 200 || got != reply {
		t.Fatalf("agent got %d %q", resp.StatusCode, got)
	}
	hdr := <-hdrc
	if p := <-pathc; p != "/v1/messages" {
		t.Errorf("upstream path %q", p)
	}
	if hdr.Get("X-Api-Key") != "sk-ant-real" || hdr.Get("Anthropic-Version") != "2023-06-01" {
		t.Errorf("upstream headers %v", hdr)
	}
	c := h.next(t)
	if c.API != APIAnthropicMessages || c.Model != "claude-sonnet-4-5" || c.Stream || string(c.Response) != reply {
		t.Errorf("recorded %+v", c)
	}
	if h.turnCount() != 1 {
		t.Errorf("TurnEnd called %d times", h.turnCount())
	}
}

func TestNonLLMPathDoesNotEndTurn(t *testing.T) {
	const models = `{"object":"list","data":[{"id":"gpt-4o"}]}`
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "GET" && r.URL.Path == "/v1/models" {
			io.WriteString(w, models)
			return
		}
		io.WriteString(w, chatReply)
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL+"/v1"), Hooks: h})

	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != models {
		t.Fatalf("agent got %q", got)
	}
	// A GET to an LLM path is not an LLM call either.
	resp, err = http.Get(base + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if n := h.turnCount(); n != 0 {
		t.Fatalf("TurnEnd called %d times for non-LLM requests", n)
	}
	// The first call recorded is the next LLM call, numbered 1.
	readAll(t, post(t, t.Context(), base+"/v1/chat/completions", chatReq, nil))
	if c := h.next(t); c.ID != 1 || c.API != APIOpenAIChat {
		t.Errorf("first recorded call %d %s, want the chat call as 1", c.ID, c.API)
	}
}

// TestGate checks that the reply is held until the gate opens while the
// request is already upstream.
func TestGate(t *testing.T) {
	upstreamGot := make(chan struct{})
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		close(upstreamGot)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, chatReply)
	})
	gateEntered := make(chan struct{})
	gateOpen := make(chan struct{})
	var opened time.Time
	h := newHooks()
	h.gate = func(ctx context.Context) error {
		close(gateEntered)
		select {
		case <-gateOpen:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})

	conn, err := net.Dial("tcp", mustURL(t, base).Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /t/"+testToken+"/v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatReq), chatReq)

	select {
	case <-upstreamGot:
	case <-time.After(wait):
		t.Fatal("the request did not reach the upstream while the gate was closed")
	}
	select {
	case <-gateEntered:
	case <-time.After(wait):
		t.Fatal("the gate was not called")
	}
	// The upstream has answered and the proxy is in the gate: the agent
	// must get nothing, not even the status line.
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 1)
	if n, err := conn.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("agent read %d bytes (%v) while the gate was closed", n, err)
	}

	opened = time.Now()
	close(gateOpen)
	conn.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); resp.StatusCode != 200 || got != chatReply {
		t.Fatalf("agent got %d %q", resp.StatusCode, got)
	}
	c := h.next(t)
	if c.GateWait < 300*time.Millisecond {
		t.Errorf("GateWait = %v, want at least the time the gate was held", c.GateWait)
	}
	if !c.Forwarded.Before(opened) || !c.FirstByte.Before(opened) {
		t.Errorf("forwarded %v, first byte %v, gate opened %v: want forwarding to run concurrently with the gate", c.Forwarded, c.FirstByte, opened)
	}
	if c.HookErr != "" || c.Err != "" {
		t.Errorf("errors recorded: %q %q", c.HookErr, c.Err)
	}
}

func TestGateClientGone(t *testing.T) {
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, chatReply) })
	gateEntered := make(chan struct{})
	h := newHooks()
	h.gate = func(ctx context.Context) error {
		close(gateEntered)
		<-ctx.Done()
		return ctx.Err()
	}
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/chat/completions", strings.NewReader(chatReq))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-gateEntered:
	case <-time.After(wait):
		t.Fatal("the gate was not called")
	}
	cancel()
	if err := <-errc; err == nil {
		t.Error("the agent got a reply through a closed gate")
	}
	c := h.next(t)
	if c.Status != 0 || !strings.Contains(c.Err, "before the response") || !strings.Contains(c.HookErr, "gate") {
		t.Errorf("recorded status %d err %q hook err %q", c.Status, c.Err, c.HookErr)
	}
}

func TestUpstreamDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String() + "/v1?key=secret-in-query"
	l.Close()

	var gates atomic.Int32
	h := newHooks()
	h.gate = func(context.Context) error { gates.Add(1); return nil }
	base := start(t, Config{Upstream: mustURL(t, dead), Hooks: h})

	for _, tc := range []struct {
		path, want string
		anthropic  bool
	}{
		{"/v1/chat/completions", APIOpenAIChat, false},
		{"/v1/messages", APIAnthropicMessages, true},
	} {
		before := gates.Load()
		resp := post(t, t.Context(), base+tc.path, `{"model":"m"}`, nil)
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: agent got %d %s", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var v struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("%s: body %q: %v", tc.path, body, err)
		}
		if tc.anthropic {
			if v.Type != "error" || v.Error.Type != "api_error" || v.Error.Message == "" {
				t.Errorf("%s: not an Anthropic error: %s", tc.path, body)
			}
		} else if v.Type != "" || v.Error.Type != "proxy_error" || v.Error.Message == "" {
			t.Errorf("%s: not an OpenAI error: %s", tc.path, body)
		}
		if strings.Contains(body, "secret") {
			t.Errorf("%s: error leaks the upstream URL: %s", tc.path, body)
		}
		if gates.Load() != before+1 {
			t.Errorf("%s: the gate was not called before the error reply", tc.path)
		}
		c := h.next(t)
		if c.API != tc.want || c.Status != http.StatusBadGateway || !strings.Contains(c.Err, "upstream request failed") ||
			string(c.Response) != body || c.Forwarded.IsZero() || !c.FirstByte.IsZero() {
			t.Errorf("%s: recorded %+v", tc.path, c)
		}
	}

	// Non-LLM requests fail the same way, without hooks.
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `"proxy_error"`) {
		t.Errorf("GET /v1/models: %d %s", resp.StatusCode, body)
	}
	if n := h.turnCount(); n != 2 {
		t.Errorf("TurnEnd called %d times, want 2", n)
	}
}

func TestBodyTooLarge(t *testing.T) {
	var hits atomic.Int32
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, chatReply)
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h, MaxBodyBytes: 1024})

	big := `{"model":"m","pad":"` + strings.Repeat("x", 2048) + `"}`
	for _, tc := range []struct {
		name, path string
		chunked    bool
		anthropic  bool
	}{
		{"content-length", "/v1/chat/completions", false, false},
		{"chunked", "/v1/chat/completions", true, false},
		{"anthropic", "/v1/messages", false, true},
	} {
		var body io.Reader = strings.NewReader(big)
		if tc.chunked {
			body = io.MultiReader(body) // length unknown: sent chunked
		}
		req, _ := http.NewRequest("POST", base+tc.path, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := readAll(t, resp)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("%s: status %d, want 413", tc.name, resp.StatusCode)
		}
		if tc.anthropic != strings.Contains(got, `"type":"error"`) {
			t.Errorf("%s: error body in the wrong style: %s", tc.name, got)
		}
		c := h.next(t)
		if c.Status != http.StatusRequestEntityTooLarge || c.Err == "" || c.Request != nil {
			t.Errorf("%s: recorded %+v", tc.name, c)
		}
	}
	if hits.Load() != 0 || h.turnCount() != 0 {
		t.Fatalf("oversized requests reached the upstream (%d) or ended turns (%d)", hits.Load(), h.turnCount())
	}

	atLimit := `{"model":"m","pad":"` + strings.Repeat("x", 1024-len(`{"model":"m","pad":""}`)) + `"}`
	if len(atLimit) != 1024 {
		t.Fatal(len(atLimit))
	}
	if resp := post(t, t.Context(), base+"/v1/chat/completions", atLimit, nil); resp.StatusCode != 200 {
		t.Errorf("a body at the limit got %d", resp.StatusCode)
	} else {
		readAll(t, resp)
	}
	if c := h.next(t); c.Status != 200 || string(c.Request) != atLimit {
		t.Errorf("recorded %+v", c)
	}
}

func TestRecordTruncation(t *testing.T) {
	reply := strings.Repeat("R", 200)
	gotc := make(chan string, 1)
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotc <- string(b)
		io.WriteString(w, reply)
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h, RecordBytes: 16})
	req := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("q", 100) + `"}]}`
	resp := post(t, t.Context(), base+"/v1/responses", req, nil)
	if got := readAll(t, resp); got != reply {
		t.Fatalf("agent got %d bytes, want all %d", len(got), len(reply))
	}
	if got := <-gotc; got != req {
		t.Fatalf("upstream got %d bytes, want all %d", len(got), len(req))
	}
	c := h.next(t)
	if c.API != APIOpenAIResponses || c.Model != "gpt-4o" {
		t.Errorf("recorded %s model %q", c.API, c.Model)
	}
	if string(c.Request) != req[:16] || !c.RequestTruncated {
		t.Errorf("recorded request %q truncated %v", c.Request, c.RequestTruncated)
	}
	if string(c.Response) != reply[:16] || !c.ResponseTruncated {
		t.Errorf("recorded response %q truncated %v", c.Response, c.ResponseTruncated)
	}
}

func TestMapPath(t *testing.T) {
	for _, tc := range []struct{ prefix, path, want string }{
		{"", "/v1/chat/completions", "/v1/chat/completions"},
		{"/", "/chat/completions", "/chat/completions"},
		{"/v1", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/", "/v1/chat/completions", "/v1/chat/completions"},
		{"/v1", "/chat/completions", "/v1/chat/completions"},
		{"/v1", "/v1", "/v1"},
		{"/v1", "/v1beta/models", "/v1/v1beta/models"},
		{"/api/v1", "/v1/models", "/api/v1/models"},
		{"/api/v1", "/messages", "/api/v1/messages"},
		{"/openai", "/v1/chat/completions", "/openai/v1/chat/completions"},
		{"/api/v1beta", "/v1/models", "/api/v1beta/v1/models"},
		{"/xv1", "/v1/models", "/xv1/v1/models"},
	} {
		if got := mapPath(tc.prefix, tc.path); got != tc.want {
			t.Errorf("mapPath(%q, %q) = %q, want %q", tc.prefix, tc.path, got, tc.want)
		}
	}
}

func TestPathMappingWithPrefix(t *testing.T) {
	type seen struct{ path, query, uri string }
	seenc := make(chan seen, 1)
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		seenc <- seen{r.URL.Path, r.URL.RawQuery, r.RequestURI}
		io.WriteString(w, `{}`)
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL+"/api/v1?api-version=2024-06-01"), Hooks: h})

	for _, tc := range []struct {
		method, path, wantURI, api string
	}{
		{"POST", "/v1/chat/completions", "/api/v1/chat/completions?api-version=2024-06-01", APIOpenAIChat},
		{"POST", "/responses", "/api/v1/responses?api-version=2024-06-01", APIOpenAIResponses},
		{"POST", "/messages", "/api/v1/messages?api-version=2024-06-01", APIAnthropicMessages},
		{"GET", "/v1/models?limit=2", "/api/v1/models?api-version=2024-06-01&limit=2", ""},
		{"GET", "/v1/models/ft%3Agpt-4o", "/api/v1/models/ft%3Agpt-4o?api-version=2024-06-01", ""},
	} {
		req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(`{"model":"m"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if s := <-seenc; s.uri != tc.wantURI {
			t.Errorf("%s %s reached the upstream as %s, want %s", tc.method, tc.path, s.uri, tc.wantURI)
		}
		if tc.api != "" {
			if c := h.next(t); c.API != tc.api {
				t.Errorf("%s: recorded as %q, want %q", tc.path, c.API, tc.api)
			}
		}
	}
	if n := h.turnCount(); n != 3 {
		t.Errorf("TurnEnd called %d times, want 3", n)
	}
}

func TestClientCancelMidStream(t *testing.T) {
	const first = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"
	upstreamCancelled := make(chan struct{})
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(upstreamCancelled)
		case <-time.After(10 * time.Second):
		}
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp := post(t, ctx, base+"/v1/chat/completions", `{"model":"gpt-4o","stream":true}`, nil)
	defer resp.Body.Close()
	buf := make([]byte, len(first))
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-upstreamCancelled:
	case <-time.After(wait):
		t.Fatal("the upstream request was not cancelled when the agent went away")
	}
	c := h.next(t)
	if c.Status != 200 || !strings.Contains(c.Err, "client went away") || string(c.Response) != first {
		t.Errorf("recorded status %d err %q response %q", c.Status, c.Err, c.Response)
	}
}

func TestUpstreamBreaksOffMidStream(t *testing.T) {
	const first = "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, first)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // cut the connection mid-stream
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})
	resp := post(t, t.Context(), base+"/v1/chat/completions", `{"model":"gpt-4o","stream":true}`, nil)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || string(got) != first {
		t.Errorf("agent got %q, err %v; want the first chunk and then an error", got, err)
	}
	c := h.next(t)
	if c.Status != 200 || !strings.Contains(c.Err, "upstream response broke off") || string(c.Response) != first {
		t.Errorf("recorded status %d err %q response %q", c.Status, c.Err, c.Response)
	}
}

func TestParseBody(t *testing.T) {
	for _, tc := range []struct {
		body   string
		model  string
		stream bool
	}{
		{`{"model":"gpt-4o","stream":true}`, "gpt-4o", true},
		{`{ "stream" : true , "model" : "claude-x" }`, "claude-x", true},
		{`{"model":"gpt-4o","stream":false}`, "gpt-4o", false},
		{`{"model":"gpt-4o"}`, "gpt-4o", false},
		{`{"model":42,"stream":"true"}`, "", false},
		{`{"metadata":{"model":"x","stream":true}}`, "", false},
		{`[{"model":"x"}]`, "", false},
		{`not json`, "", false},
		{``, "", false},
	} {
		if m, s := parseBody([]byte(tc.body)); m != tc.model || s != tc.stream {
			t.Errorf("parseBody(%s) = %q %v, want %q %v", tc.body, m, s, tc.model, tc.stream)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"POST", "/v1/chat/completions", APIOpenAIChat},
		{"POST", "/chat/completions", APIOpenAIChat},
		{"POST", "/v1/responses", APIOpenAIResponses},
		{"POST", "/responses", APIOpenAIResponses},
		{"POST", "/v1/messages", APIAnthropicMessages},
		{"POST", "/messages", APIAnthropicMessages},
		{"GET", "/v1/chat/completions", ""},
		{"GET", "/v1/models", ""},
		{"POST", "/v1/messages/count_tokens", ""},
		{"POST", "/v1/embeddings", ""},
		{"POST", "/v1/responses/resp_1/cancel", ""},
		{"POST", "/v2/chat/completions", ""},
		{"POST", "/v1chat/completions", ""},
	} {
		if got := classify(tc.method, tc.path); got != tc.want {
			t.Errorf("classify(%s %s) = %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

func TestHookErrorsDoNotFailTheCall(t *testing.T) {
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, chatReply) })
	h := newHooks()
	h.err = errors.New("checkpoint refused")
	h.gate = func(context.Context) error { return errors.New("checkpoint failed") }
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})
	resp := post(t, t.Context(), base+"/v1/chat/completions", chatReq, nil)
	if got := readAll(t, resp); resp.StatusCode != 200 || got != chatReply {
		t.Fatalf("agent got %d %q", resp.StatusCode, got)
	}
	c := h.next(t)
	if !strings.Contains(c.HookErr, "checkpoint refused") || !strings.Contains(c.HookErr, "checkpoint failed") || c.Err != "" || c.Status != 200 {
		t.Errorf("recorded hook err %q err %q status %d", c.HookErr, c.Err, c.Status)
	}
}

func TestConcurrentCalls(t *testing.T) {
	arrived := make(chan struct{}, 2)
	release := make(chan struct{})
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, chatReply)
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})

	var wg sync.WaitGroup
	status := make(chan int, 2)
	for range 2 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatReq))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				status <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status <- resp.StatusCode
		})
	}
	for range 2 {
		select {
		case <-arrived:
		case <-time.After(wait):
			close(release)
			t.Fatal("the two calls were not in flight at once")
		}
	}
	close(release)
	wg.Wait()
	for range 2 {
		if s := <-status; s != 200 {
			t.Errorf("status %d", s)
		}
	}
	ids := map[uint64]bool{h.next(t).ID: true, h.next(t).ID: true}
	if !ids[1] || !ids[2] || h.turnCount() != 2 {
		t.Errorf("ids %v, %d turns", ids, h.turnCount())
	}
}

func TestNewValidates(t *testing.T) {
	for _, u := range []string{"ftp://x/v1", "/v1", "http:///v1", "https://user:pw@api.x.com/v1"} {
		if _, err := New(Config{Upstream: mustURL(t, u)}); err == nil {
			t.Errorf("New accepted upstream %q", u)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New accepted no upstream")
	}
	for _, tok := range []string{"", "short", "has/slash-0123456789", "has space 0123456789"} {
		if _, err := New(Config{Upstream: mustURL(t, "http://x/v1"), Token: tok}); err == nil {
			t.Errorf("New accepted token %q", tok)
		}
	}
}

func TestServeAndShutdown(t *testing.T) {
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, chatReply) })
	p, err := New(Config{Upstream: mustURL(t, up.URL), NoToken: true}) // no hooks
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Serve(l) }()
	if got := readAll(t, post(t, t.Context(), "http://"+l.Addr().String()+"/v1/chat/completions", chatReq, nil)); got != chatReply {
		t.Errorf("got %q", got)
	}
	// It is a Handler too.
	mounted := httptest.NewServer(http.StripPrefix("/llm", p))
	defer mounted.Close()
	if got := readAll(t, post(t, t.Context(), mounted.URL+"/llm/v1/chat/completions", chatReq, nil)); got != chatReply {
		t.Errorf("mounted: got %q", got)
	}
	if err := p.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve returned %v", err)
	}
	if _, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		t.Error("still listening after Shutdown")
	}
}

// TestRecordedResponseDecoded checks that a compressing upstream still
// yields a plain-text record while the agent gets the reply intact.
func TestRecordedResponseDecoded(t *testing.T) {
	up := upstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			io.WriteString(w, chatReply)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, chatReply)
		zw.Close()
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL), Hooks: h})
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(chatReq))
	req.Header.Set("Accept-Encoding", "gzip") // set by hand: the client does not decode
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(zr)
		body = string(b)
	}
	if body != chatReply {
		t.Errorf("agent got %q", body)
	}
	if c := h.next(t); string(c.Response) != chatReply {
		t.Errorf("recorded response %q, want it decoded", c.Response)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestCustomTransport(t *testing.T) {
	var got atomic.Value
	rt := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got.Store(r.URL.String())
		return &http.Response{ // no Request, as a minimal transport might do
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"application/json"}},
			Body:       io.NopCloser(strings.NewReader(chatReply)),
		}, nil
	})
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, "https://api.example.com/v1"), Hooks: h, Transport: rt})
	resp := post(t, t.Context(), base+"/chat/completions", chatReq, nil)
	if body := readAll(t, resp); resp.StatusCode != 200 || body != chatReply {
		t.Fatalf("agent got %d %q", resp.StatusCode, body)
	}
	if u, _ := got.Load().(string); u != "https://api.example.com/v1/chat/completions" {
		t.Errorf("transport got %q", u)
	}
	if c := h.next(t); c.Status != 200 || string(c.Response) != chatReply {
		t.Errorf("recorded %+v", c)
	}
}

// The proxy adds the operator's credentials to every call: it serves only
// on loopback unless told to expose them.
func TestListenLoopbackOnly(t *testing.T) {
	up, _ := url.Parse("http://127.0.0.1:1")
	newProxy := func(expose bool) *Proxy {
		p, err := New(Config{Upstream: up, Header: http.Header{"Authorization": {"Bearer secret"}}, Expose: expose, Token: testToken})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	refused := []string{"0.0.0.0:0", ":0", "[::]:0", "example.com:0", "10.0.0.1:0"}
	// An address of this host that is not loopback, if it has one.
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				refused = append(refused, net.JoinHostPort(n.IP.String(), "0"))
				break
			}
		}
	}
	for _, addr := range refused {
		if a, err := newProxy(false).ListenAndServe(addr); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("ListenAndServe(%q) = %v, %v; want ErrNotLoopback", addr, a, err)
		}
		if err := CheckListen(addr, false); !errors.Is(err, ErrNotLoopback) {
			t.Errorf("CheckListen(%q) = %v; want ErrNotLoopback", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "127.0.0.2:0", "localhost:0"} {
		a, err := newProxy(false).ListenAndServe(addr)
		if err != nil {
			t.Errorf("ListenAndServe(%q): %v", addr, err)
			continue
		}
		if !a.(*net.TCPAddr).IP.IsLoopback() {
			t.Errorf("ListenAndServe(%q) bound %s", addr, a)
		}
	}
	// Serve refuses a listener of another's making on every interface.
	l, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := newProxy(false).Serve(l); !errors.Is(err, ErrNotLoopback) {
		t.Errorf("Serve on %s = %v; want ErrNotLoopback", l.Addr(), err)
	}
	if _, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(l.Addr().(*net.TCPAddr).Port))); err == nil {
		t.Errorf("the refused listener on %s still accepts", l.Addr())
	}
	// Expose allows it.
	if _, err := newProxy(true).ListenAndServe("0.0.0.0:0"); err != nil {
		t.Errorf("ListenAndServe(0.0.0.0:0) with Expose: %v", err)
	}
}
