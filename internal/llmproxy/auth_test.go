package llmproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// seenRequests is what a real upstream HTTP server received.
type seenRequests struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (s *seenRequests) handler(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.reqs = append(s.reqs, r.Clone(r.Context()))
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, chatReply)
}

func (s *seenRequests) take() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.reqs
	s.reqs = nil
	return r
}

func send(t *testing.T, method, u string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(chatReq))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}

// TestTokenRequired: a request without the endpoint's token is refused
// before anything reaches the upstream or the hooks; the token works in
// the base URL's path and as the agent's API key, and is never forwarded.
func TestTokenRequired(t *testing.T) {
	var seen seenRequests
	up := upstream(t, seen.handler)
	h := newHooks()
	base := start(t, Config{Upstream: mustURL(t, up.URL+"/v1"), Hooks: h,
		Header: http.Header{"Authorization": {"Bearer operator-secret"}}})
	root := strings.TrimSuffix(base, "/t/"+testToken)

	for _, tc := range []struct {
		name string
		url  string
		hdr  map[string]string
	}{
		{"none", root + "/v1/chat/completions", nil},
		{"wrong path token", root + "/t/test-token-0123456780/v1/chat/completions", nil},
		{"token prefix", root + "/t/test-token-012345678/v1/chat/completions", nil},
		{"token suffix", root + "/t/" + testToken + "0/v1/chat/completions", nil},
		{"wrong bearer", root + "/v1/chat/completions", map[string]string{"Authorization": "Bearer wrong-token-0123456789"}},
		{"token without Bearer", root + "/v1/chat/completions", map[string]string{"Authorization": testToken}},
		{"wrong api key", root + "/v1/messages", map[string]string{"X-Api-Key": "sk-ant-guess"}},
		{"token in query", root + "/v1/chat/completions?token=" + testToken, nil},
	} {
		code, body := send(t, "POST", tc.url, tc.hdr)
		if code != http.StatusUnauthorized || !strings.Contains(body, "token") {
			t.Errorf("%s: %d %s, want 401", tc.name, code, body)
		}
	}
	if r := seen.take(); len(r) != 0 {
		t.Fatalf("%d unauthenticated requests reached the upstream", len(r))
	}
	if n := h.turnCount(); n != 0 {
		t.Fatalf("TurnEnd called %d times for unauthenticated requests", n)
	}

	for _, tc := range []struct {
		name string
		url  string
		hdr  map[string]string
	}{
		{"path", base + "/v1/chat/completions", map[string]string{"Authorization": "Bearer sk-agent-dummy"}},
		{"bearer", root + "/v1/chat/completions", map[string]string{"Authorization": "Bearer " + testToken}},
		{"x-api-key", root + "/v1/messages", map[string]string{"X-Api-Key": testToken, "Anthropic-Version": "2023-06-01"}},
		{"api-key", root + "/chat/completions", map[string]string{"Api-Key": testToken}},
	} {
		code, body := send(t, "POST", tc.url, tc.hdr)
		if code != 200 || body != chatReply {
			t.Errorf("%s: %d %s", tc.name, code, body)
			continue
		}
		r := seen.take()
		if len(r) != 1 {
			t.Fatalf("%s: %d upstream requests", tc.name, len(r))
		}
		if got := r[0].Header.Get("Authorization"); got != "Bearer operator-secret" {
			t.Errorf("%s: upstream Authorization %q", tc.name, got)
		}
		for k, vs := range r[0].Header {
			for _, v := range vs {
				if strings.Contains(v, testToken) {
					t.Errorf("%s: the token reached the upstream in %s", tc.name, k)
				}
			}
		}
		if strings.Contains(r[0].RequestURI, testToken) || strings.HasPrefix(r[0].URL.Path, "/t/") {
			t.Errorf("%s: upstream URI %s", tc.name, r[0].RequestURI)
		}
		if c := h.next(t); strings.Contains(c.Path, testToken) {
			t.Errorf("%s: the turn log records the token: %s", tc.name, c.Path)
		}
	}

	// With no Authorization of the operator's, the agent's bearer token
	// is removed, not passed on.
	base2 := start(t, Config{Upstream: mustURL(t, up.URL), Header: http.Header{"X-Api-Key": {"sk-ant-operator"}}})
	root2 := strings.TrimSuffix(base2, "/t/"+testToken)
	if code, _ := send(t, "POST", root2+"/v1/messages", map[string]string{"Authorization": "Bearer " + testToken}); code != 200 {
		t.Fatalf("status %d", code)
	}
	if r := seen.take(); len(r) != 1 || r[0].Header.Get("Authorization") != "" || r[0].Header.Get("X-Api-Key") != "sk-ant-operator" {
		t.Fatalf("upstream headers %v", r[0].Header)
	}
}

// TestCredentialsOnlyOnLLMPaths: the operator's credentials are added to
// the LLM API paths only; a request for any other path of the upstream
// (files, fine-tuning, organisation admin, a path climbing out of an
// allowed one) is refused and never reaches it.
func TestCredentialsOnlyOnLLMPaths(t *testing.T) {
	var seen seenRequests
	up := upstream(t, seen.handler)
	base := start(t, Config{Upstream: mustURL(t, up.URL+"/v1"),
		Header: http.Header{"Authorization": {"Bearer operator-secret"}}})

	allowed := []struct{ method, path string }{
		{"POST", "/v1/chat/completions"}, {"POST", "/chat/completions"}, {"POST", "/v1/responses"},
		{"GET", "/v1/responses/resp_123"}, {"POST", "/v1/responses/resp_123/cancel"},
		{"POST", "/v1/messages"}, {"POST", "/v1/messages/count_tokens"}, {"POST", "/v1/embeddings"},
		{"GET", "/v1/models"}, {"GET", "/v1/models/gpt-4o"}, {"GET", "/models"},
	}
	for _, tc := range allowed {
		if code, body := send(t, tc.method, base+tc.path, nil); code != 200 {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, code, body)
		}
		r := seen.take()
		if len(r) != 1 || r[0].Header.Get("Authorization") != "Bearer operator-secret" {
			t.Errorf("%s %s: upstream got %d requests", tc.method, tc.path, len(r))
		}
	}

	refused := []struct{ method, path string }{
		{"GET", "/v1/files"}, {"POST", "/v1/files"}, {"GET", "/v1/organization/api_keys"},
		{"POST", "/v1/fine_tuning/jobs"}, {"POST", "/v1/batches"}, {"GET", "/v1/organizations/users"},
		{"GET", "/v1/models/a/b"}, {"GET", "/v1/models/a%2Fb"}, {"GET", "/"}, {"GET", "/v1"},
		{"POST", "/v2/chat/completions"}, {"POST", "/v1/chat/completions/x"},
	}
	for _, tc := range refused {
		code, body := send(t, tc.method, base+tc.path, nil)
		if code != http.StatusForbidden || !strings.Contains(body, "not an LLM API path") {
			t.Errorf("%s %s: %d %s, want 403", tc.method, tc.path, code, body)
		}
	}
	// Paths the client would clean, sent as written.
	host := mustURL(t, base).Host
	for _, p := range []string{"/v1/models/../files", "/v1/models/./x/../../files", "/v1/responses/../../admin"} {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /t/%s%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", testToken, p)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s: %d, want 403", p, resp.StatusCode)
		}
	}
	if r := seen.take(); len(r) != 0 {
		for _, x := range r {
			t.Errorf("reached the upstream: %s %s", x.Method, x.RequestURI)
		}
	}
}
