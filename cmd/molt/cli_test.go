package main

import (
	"encoding/json"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1": 1, "512": 512, "1k": 1 << 10, "2M": 2 << 20, "3G": 3 << 30, "4GiB": 4 << 30, "1T": 1 << 40,
		" 16g ": 16 << 30, "8388607T": 8388607 << 40, "9223372036854775807": math.MaxInt64,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{
		"17179869184G", // wraps to 0 (unlimited) without the overflow check
		"8388608T", "9223372036854775807K", "9223372036854775808",
		"-1", "-1G", "", "G", "  ", "1.5G", "1GB", "+1G", "0x10", "1 G",
	} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

// fakeDaemon records the request bodies of one path on a unix socket and
// answers each with status and body.
func fakeDaemon(t *testing.T, status int, answer any) (sock string, bodies *[]string) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "molt.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	bodies = new([]string)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		*bodies = append(*bodies, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(b)))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(answer)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock, bodies
}

func runCLI(t *testing.T, args ...string) error {
	t.Helper()
	c := newRootCmd()
	c.SetArgs(args)
	c.SetOut(io.Discard)
	c.SetErr(io.Discard)
	return c.Execute()
}

// The CLI passes -n as given: the daemon, not a silent default, decides
// what 0 means (it refuses it).
func TestForkCountPassedThrough(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"fork", "sb", "-n", "0"}, 0},
		{[]string{"fork", "sb", "-n", "-2"}, -2},
		{[]string{"fork", "sb"}, 1},
		{[]string{"fork", "sb", "-n", "5"}, 5},
	} {
		sock, bodies := fakeDaemon(t, http.StatusBadRequest, v1.Error{Kind: "invalid_argument", Message: "refused"})
		if err := runCLI(t, append([]string{"--socket", sock}, c.args...)...); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("molt %v: %v; want the daemon's refusal", c.args, err)
		}
		if len(*bodies) != 1 {
			t.Fatalf("molt %v: requests %q", c.args, *bodies)
		}
		_, body, _ := strings.Cut(strings.TrimPrefix((*bodies)[0], "POST /v1/sandboxes/sb/fork"), " ")
		var req map[string]any
		if err := json.Unmarshal([]byte(body), &req); err != nil {
			t.Fatalf("molt %v: body %q: %v", c.args, body, err)
		}
		if n, ok := req["n"].(float64); !ok || int(n) != c.want {
			t.Errorf("molt %v sent %s; want n=%d", c.args, body, c.want)
		}
	}
}

func TestLLMExposeFlag(t *testing.T) {
	for _, c := range []struct {
		args   []string
		expose bool
	}{
		{[]string{"llm", "sb", "--upstream", "http://127.0.0.1:1", "--listen", "0.0.0.0:0"}, false},
		{[]string{"llm", "sb", "--upstream", "http://127.0.0.1:1", "--listen", "0.0.0.0:0", "--expose"}, true},
	} {
		sock, bodies := fakeDaemon(t, http.StatusOK, v1.LLMEndpoint{URL: "http://x/v1"})
		if err := runCLI(t, append([]string{"--socket", sock}, c.args...)...); err != nil {
			t.Fatalf("molt %v: %v", c.args, err)
		}
		_, body, _ := strings.Cut(strings.TrimPrefix((*bodies)[0], "PUT /v1/sandboxes/sb/llm"), " ")
		var req v1.LLMEndpointRequest
		if err := json.Unmarshal([]byte(body), &req); err != nil {
			t.Fatal(err)
		}
		if req.Expose != c.expose || req.Listen != "0.0.0.0:0" {
			t.Errorf("molt %v sent %s; want expose=%v", c.args, body, c.expose)
		}
	}
}

// TestLLMHeaderFromFile: --header @FILE and @- read the headers, so a
// key need not be on the command line; a malformed line is refused
// without being echoed.
func TestLLMHeaderFromFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "hdr")
	if err := os.WriteFile(f, []byte("# operator key\nAuthorization: Bearer sk-from-file\n\nx-extra: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readHeaders([]string{"@" + f, "@-", "Anthropic-Version: 2023-06-01"}, strings.NewReader("x-api-key: sk-from-stdin\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"Authorization": "Bearer sk-from-file", "x-extra": "1", "x-api-key": "sk-from-stdin", "Anthropic-Version": "2023-06-01"}
	if !maps.Equal(got, want) {
		t.Fatalf("headers %v, want %v", got, want)
	}
	if _, err := readHeaders([]string{"@-"}, strings.NewReader("sk-secret-without-name\n")); err == nil || strings.Contains(err.Error(), "sk-secret") {
		t.Fatalf("malformed line: %v", err)
	}
	sock, bodies := fakeDaemon(t, http.StatusOK, v1.LLMEndpoint{URL: "http://x/v1"})
	if err := runCLI(t, "--socket", sock, "llm", "sb", "--upstream", "http://127.0.0.1:1", "--header", "@"+f); err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(strings.TrimPrefix((*bodies)[0], "PUT /v1/sandboxes/sb/llm"), " ")
	var req v1.LLMEndpointRequest
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	if req.Header["Authorization"] != "Bearer sk-from-file" {
		t.Fatalf("sent %s", body)
	}
}
