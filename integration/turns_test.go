package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeLLM is an OpenAI-compatible stub: every chat completion waits
// delay, then answers with the next command of its script as the
// assistant's message (streamed as SSE when the request asks for it).
type fakeLLM struct {
	delay  time.Duration
	mu     sync.Mutex
	script []string
	calls  int
	served []time.Duration // how long each call took the LLM itself
}

func (f *fakeLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() {
		f.mu.Lock()
		f.served = append(f.served, time.Since(start))
		f.mu.Unlock()
	}()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role, Content string
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Messages) == 0 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	cmd := "DONE"
	if f.calls < len(f.script) {
		cmd = f.script[f.calls]
	}
	f.calls++
	f.mu.Unlock()
	time.Sleep(f.delay)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": "chatcmpl-1", "object": "chat.completion", "model": req.Model,
			"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
				"message": map[string]string{"role": "assistant", "content": cmd}}},
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, part := range strings.SplitAfter(cmd, " ") {
		b, _ := json.Marshal(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk",
			"choices": []map[string]any{{"index": 0, "delta": map[string]string{"content": part}}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	fl.Flush()
}

// ask sends one chat completion to base and returns the assistant's text.
func ask(t *testing.T, base string, history []string, stream bool) string {
	t.Helper()
	var msgs []map[string]string
	for i, h := range history {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]string{"role": role, "content": h})
	}
	body, _ := json.Marshal(map[string]any{"model": "fake-1", "stream": stream, "messages": msgs})
	resp, err := http.Post(base+"/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("LLM call: %s: %s", resp.Status, b)
	}
	if !stream {
		var out struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) != 1 {
			t.Fatalf("LLM reply: %v %+v", err, out)
		}
		return out.Choices[0].Message.Content
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil || len(chunk.Choices) != 1 {
			t.Fatalf("SSE chunk %q: %v", line, err)
		}
		text.WriteString(chunk.Choices[0].Delta.Content)
	}
	return text.String()
}

// TestAgentThroughLLMProxy runs a scripted agent against a fake LLM
// through the sandbox's LLM endpoint: every LLM call ends a turn, the
// turn gets the checkpoint its commands need, and the latency molt adds
// to the agent is measured.
func TestAgentThroughLLMProxy(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	llm := &fakeLLM{delay: 400 * time.Millisecond, script: []string{
		"mkdir -p /work && echo 'print(1)' > /work/app.py", // full (the session starts)
		"cat /work/app.py && ls /work",                     // none
		"echo 'print(2)' >> /work/app.py",                  // fs
		"export APP_MODE=test",                             // full (session state)
		"python3 -B /work/app.py",                          // none
		"sleep 600 >/dev/null 2>&1 &",                      // full (long-lived process)
		"grep -r print /work",                              // none
	}}
	srv := httptest.NewServer(llm)
	defer srv.Close()
	var ep struct {
		URL  string `json:"url"`
		Gate string `json:"gate"`
	}
	mustJSON(t, &ep, "llm", sb, "--upstream", srv.URL+"/v1")
	if !strings.HasPrefix(ep.URL, "http://127.0.0.1:") || ep.Gate != "response" {
		t.Fatalf("endpoint %+v", ep)
	}

	history := []string{"fix the bug"}
	var agentLatency []time.Duration
	for i := 0; ; i++ {
		start := time.Now()
		cmd := ask(t, ep.URL, history, i%2 == 1)
		agentLatency = append(agentLatency, time.Since(start))
		if cmd == "DONE" {
			break
		}
		out := must(t, "exec", sb, "--session", "main", "--", cmd)
		history = append(history, cmd, out)
	}
	if llm.calls != len(llm.script)+1 {
		t.Fatalf("LLM saw %d calls, want %d", llm.calls, len(llm.script)+1)
	}

	var turns []struct {
		Turn       int      `json:"turn"`
		Decision   string   `json:"decision"`
		Checkpoint *string  `json:"checkpoint"`
		Reasons    []string `json:"reasons"`
		Commands   []struct {
			Command  string `json:"command"`
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
		} `json:"commands"`
		LLM []struct {
			Path       string  `json:"path"`
			Stream     bool    `json:"stream"`
			Status     int     `json:"status"`
			Request    string  `json:"request"`
			Response   string  `json:"response"`
			GateWaitMS float64 `json:"gate_wait_ms"`
		} `json:"llm"`
	}
	// The last call's record is filed once its reply is out: wait for it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		mustJSON(t, &turns, "turns", sb)
		if len(turns) == len(llm.script)+1 && len(turns[len(turns)-1].LLM) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(turns) != len(llm.script)+1 {
		t.Fatalf("%d turns logged, want %d: %+v", len(turns), len(llm.script)+1, turns)
	}
	// Turn 1 ends at the first call, before any command; turn k+1 holds
	// the script's command k.
	want := []string{"none", "full", "none", "fs", "full", "none", "full", "none"}
	for i, tr := range turns {
		if tr.Decision != want[i] {
			t.Errorf("turn %d: decision %s (%v), want %s", tr.Turn, tr.Decision, tr.Reasons, want[i])
		}
		if (tr.Checkpoint != nil) != (want[i] != "none") {
			t.Errorf("turn %d: checkpoint %v with decision %s", tr.Turn, tr.Checkpoint, tr.Decision)
		}
		if len(tr.LLM) != 1 || tr.LLM[0].Status != 200 || !strings.Contains(tr.LLM[0].Request, "fake-1") {
			t.Errorf("turn %d: LLM calls %+v", tr.Turn, tr.LLM)
			continue
		}
		if tr.LLM[0].Stream != (i%2 == 1) {
			t.Errorf("turn %d: stream %v", tr.Turn, tr.LLM[0].Stream)
		}
		if i > 0 {
			if len(tr.Commands) != 1 || tr.Commands[0].Command != llm.script[i-1] {
				t.Errorf("turn %d: commands %+v, want %q", tr.Turn, tr.Commands, llm.script[i-1])
			}
		}
		if i < len(llm.script) && !strings.Contains(tr.LLM[0].Response, strings.Fields(llm.script[i])[0]) {
			t.Errorf("turn %d: recorded response %q lacks the next command", tr.Turn, tr.LLM[0].Response)
		}
	}
	// The checkpoint runs under the LLM's latency: the agent waits for
	// the LLM, not for molt.
	// One turn of a loaded machine may see its checkpoint outlast
	// 100 ms of the LLM's 400 (a run with a load average of 15 on two
	// cores saw 169 ms once); a gate that waits on every turn, or for
	// longer than the LLM takes, is the failure.
	var added []float64
	slow := 0
	for i, tr := range turns {
		extra := agentLatency[i] - llm.served[i]
		t.Logf("turn %d %-4s: agent saw %6.1f ms, the LLM took %6.1f ms, gate wait %5.2f ms, molt added %5.1f ms",
			tr.Turn, tr.Decision, ms(agentLatency[i]), ms(llm.served[i]), tr.LLM[0].GateWaitMS, ms(extra))
		added = append(added, ms(extra))
		if w := tr.LLM[0].GateWaitMS; w > 100 {
			slow++
			if slow > 1 || w > ms(llm.delay) {
				t.Errorf("turn %d: the reply waited %.1f ms for the checkpoint, longer than it should under a %v LLM (%d turns over 100 ms)", tr.Turn, w, llm.delay, slow)
			}
		}
	}
	sort.Float64s(added)
	t.Logf("agent-visible latency added per turn: median %.1f ms, max %.1f ms (LLM %v per call)", added[len(added)/2], added[len(added)-1], llm.delay)

	// An LLM faster than the checkpoint: the gate holds the reply until
	// the turn's instant is captured, so the agent's next command cannot
	// run before it.
	llm.mu.Lock()
	llm.delay = 0
	llm.mu.Unlock()
	must(t, "exec", sb, "--session", "main", "--", "export FAST=1")
	start := time.Now()
	ask(t, ep.URL, history, false)
	seen := time.Since(start)
	deadline = time.Now().Add(10 * time.Second)
	for {
		mustJSON(t, &turns, "turns", sb)
		if len(turns) == len(llm.script)+2 && len(turns[len(turns)-1].LLM) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	last := turns[len(turns)-1]
	if last.Decision != "full" || len(last.LLM) != 1 || last.LLM[0].GateWaitMS <= 0 {
		t.Fatalf("fast LLM turn: %+v", last)
	}
	t.Logf("fast LLM: the agent waited %.1f ms, of which %.1f ms for the full checkpoint's capture", ms(seen), last.LLM[0].GateWaitMS)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// TestLLMGateExec: with gate "exec" the LLM's reply is not held; the
// agent's next command waits for the turn's checkpoint instead, so the
// checkpoint holds the state from before the command.
func TestLLMGateExec(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	llm := &fakeLLM{script: []string{"echo after > /root/after"}}
	srv := httptest.NewServer(llm)
	defer srv.Close()
	var ep struct{ URL, Gate string }
	mustJSON(t, &ep, "llm", sb, "--upstream", srv.URL+"/v1", "--gate", "exec")
	if ep.Gate != "exec" {
		t.Fatalf("endpoint %+v", ep)
	}
	// A session makes the turn full (a slow capture); the reply comes at
	// once and the command follows it immediately.
	must(t, "exec", sb, "--session", "main", "--", "export STEP=1")
	cmd := ask(t, ep.URL, []string{"go"}, false)
	must(t, "exec", sb, "--session", "main", "--", cmd)
	var turns []struct {
		Decision   string  `json:"decision"`
		Checkpoint *string `json:"checkpoint"`
		LLM        []struct {
			GateWaitMS float64 `json:"gate_wait_ms"`
		} `json:"llm"`
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mustJSON(t, &turns, "turns", sb)
		if len(turns) == 1 && len(turns[0].LLM) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(turns) != 1 || turns[0].Decision != "full" || turns[0].Checkpoint == nil || len(turns[0].LLM) != 1 {
		t.Fatalf("turns: %+v", turns)
	}
	if w := turns[0].LLM[0].GateWaitMS; w != 0 {
		t.Fatalf("gate exec held the reply %.1f ms", w)
	}
	// The command ran after the capture: the checkpoint does not have
	// its file.
	must(t, "rollback", sb, *turns[0].Checkpoint)
	if out := sh(t, sb, "test -e /root/after && echo present || echo absent"); out != "absent\n" {
		t.Fatalf("the command ran before the turn's checkpoint: /root/after is %s", out)
	}
}
