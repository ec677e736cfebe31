// The recovery benchmark's scripts: what each run's agent is told to do
// turn by turn (a trajectory's commands with effect turns inserted), the
// fake LLM that tells it, and where crashes land.

package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
)

// Crash kinds.
const (
	CrashAgent   = "agent"   // kill -9 of the agent process
	CrashSandbox = "sandbox" // kill -9 of every process in the sandbox (and then the agent)
	CrashDaemon  = "daemon"  // kill -9 of molt's daemon (and then the agent)
)

// CrashKinds are the kinds, in the order crash points take them.
var CrashKinds = []string{CrashAgent, CrashSandbox, CrashDaemon}

// Action is one turn of a script: the command the fake LLM gives the
// agent (empty: a reply without a command, as a recorded turn that ran
// nothing), and the logical effect it sends, if it is an effect turn.
type Action struct {
	Command string `json:"command,omitempty"`
	Effect  string `json:"effect,omitempty"`
}

// PaymentsName is the host of the payment service the effect turns pay.
const PaymentsName = "payments.lab.test"

// effectCommand is an effect turn's command: a payment whose body names
// the logical effect, with an Idempotency-Key made afresh on every
// execution (the text stays the same, each run sends a new key), as an
// agent regenerating its request would. It prints only the service's
// answer, so its output is the same whenever the payment is made once.
func effectCommand(run, effect string) string {
	body := fmt.Sprintf(`{"run": %q, "effect": %q, "amount": "1.00"}`, run, effect)
	return "python3 -c 'import urllib.request as u, uuid\n" +
		"r = u.Request(\"http://" + PaymentsName + "/pay\", data=" + pyBytes(body) + ", method=\"POST\",\n" +
		"  headers={\"Content-Type\": \"application/json\", \"Idempotency-Key\": str(uuid.uuid4())})\n" +
		"print(u.urlopen(r, timeout=60).read().decode())'"
}

// pyBytes is s as a Python bytes literal without single quotes (the
// command is single-quoted for the shell).
func pyBytes(s string) string {
	var b strings.Builder
	b.WriteString(`b"`)
	for _, c := range []byte(s) {
		switch {
		case c == '"' || c == '\\' || c == '\'' || c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// BuildScript returns the actions of one run of trajectory t: its first
// maxTurns turns (0: all), and after every effectEvery of them an effect
// turn paying effect "e1", "e2", ... tagged with run (0: no effects).
func BuildScript(t Trajectory, run string, maxTurns, effectEvery int) []Action {
	turns := t.Turns
	if maxTurns > 0 && len(turns) > maxTurns {
		turns = turns[:maxTurns]
	}
	var out []Action
	n := 0
	for i, tu := range turns {
		cmd, _ := TurnCommand(t.Agent, tu)
		out = append(out, Action{Command: cmd})
		if effectEvery > 0 && (i+1)%effectEvery == 0 {
			n++
			e := fmt.Sprintf("e%d", n)
			out = append(out, Action{Command: effectCommand(run, e), Effect: e})
		}
	}
	return out
}

// Effects lists a script's logical effects.
func Effects(script []Action) []string {
	var out []string
	for _, a := range script {
		if a.Effect != "" {
			out = append(out, a.Effect)
		}
	}
	return out
}

// CrashPoint is one injected crash: after the command of turn Turn (0
// based) ran, before the agent's next LLM call.
type CrashPoint struct {
	Turn int    `json:"turn"`
	Kind string `json:"kind"`
}

// PickCrashes chooses n distinct crash turns in [1, turns-2] (a crash
// leaves at least one turn to run live, and is not before the first
// command), seeded by seed and the trajectory's index, sorted; the kinds
// go round CrashKinds, starting at the trajectory's index so that every
// kind crashes every agent.
func PickCrashes(seed uint64, traj, turns, n int) []CrashPoint {
	if turns < 3 || n <= 0 {
		return nil
	}
	r := rand.New(rand.NewPCG(seed, uint64(traj)))
	cands := r.Perm(turns - 2)
	if n > len(cands) {
		n = len(cands)
	}
	picked := cands[:n]
	for i := range picked {
		picked[i]++
	}
	// Sorted, so the kinds' assignment does not depend on the draw order.
	for i := 1; i < len(picked); i++ {
		for j := i; j > 0 && picked[j] < picked[j-1]; j-- {
			picked[j], picked[j-1] = picked[j-1], picked[j]
		}
	}
	out := make([]CrashPoint, n)
	for i, t := range picked {
		out[i] = CrashPoint{Turn: t, Kind: CrashKinds[(traj+i)%len(CrashKinds)]}
	}
	return out
}

// chatMessage is one message of an OpenAI chat completion.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatRequest is what the agent sends.
type chatRequest struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
}

// DoneReply is the fake LLM's reply once the script is done.
const DoneReply = "The task is done. COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

// TurnOf returns the turn a chat request asks for: the number of
// assistant messages it holds (each earlier turn left one). The fake
// LLM answers from it alone, so a restarted agent resending a request
// gets the same answer.
func TurnOf(msgs []chatMessage) int {
	n := 0
	for _, m := range msgs {
		if m.Role == "assistant" {
			n++
		}
	}
	return n
}

// ReplyFor is the fake LLM's reply to the request for turn i of script:
// a thought and the action's command in one fenced bash block, as
// mini-swe-agent's format asks; no block for a turn without a command;
// DoneReply past the end.
func ReplyFor(script []Action, i int) string {
	if i < 0 || i >= len(script) {
		return DoneReply
	}
	if script[i].Command == "" {
		return fmt.Sprintf("Turn %d: thinking, no command this turn.", i)
	}
	return fmt.Sprintf("Turn %d.\n\n```bash\n%s\n```", i, script[i].Command)
}

// CommandOf extracts the command of a reply: the text of its last
// fenced bash block, and whether there is one.
func CommandOf(reply string) (string, bool) {
	start := strings.Index(reply, "```bash\n")
	end := strings.LastIndex(reply, "\n```")
	if start < 0 || end < start+len("```bash\n")-1 {
		return "", false
	}
	return reply[start+len("```bash\n") : end], true
}

// FakeLLM is an OpenAI-compatible chat completions server answering each
// run's agent (named by the request's model) from its script. Replies
// are deterministic: the same request always gets the same bytes.
type FakeLLM struct {
	mu      sync.Mutex
	scripts map[string][]Action // +checklocks:mu
	calls   map[string]int      // +checklocks:mu
}

// NewFakeLLM returns an empty FakeLLM.
func NewFakeLLM() *FakeLLM {
	return &FakeLLM{scripts: map[string][]Action{}, calls: map[string]int{}}
}

// Set registers the script of model.
func (f *FakeLLM) Set(model string, script []Action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripts[model] = script
}

// Calls returns how many requests model's agent made.
func (f *FakeLLM) Calls(model string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[model]
}

// ServeHTTP answers POST /v1/chat/completions.
func (f *FakeLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.NotFound(w, r)
		return
	}
	var req chatRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&req); err != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	script, ok := f.scripts[req.Model]
	f.calls[req.Model]++
	f.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":{"message":"unknown model"}}`, http.StatusNotFound)
		return
	}
	i := TurnOf(req.Messages)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%s-%d", req.Model, i), "object": "chat.completion", "model": req.Model,
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": chatMessage{Role: "assistant", Content: ReplyFor(script, i)}}},
	})
}
