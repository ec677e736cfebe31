package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
)

// scriptLLM answers each chat completion with the command of its
// script at the position the conversation has reached (the number of
// assistant messages in the request), so a restarted agent gets the same
// answers as the first run. It counts the calls it served.
type scriptLLM struct {
	script []string
	mu     sync.Mutex
	calls  int
}

func (f *scriptLLM) served() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func (f *scriptLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Messages []struct{ Role, Content string } `json:"messages"`
	}
	if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	n := 0
	for _, m := range req.Messages {
		if m.Role == "assistant" {
			n++
		}
	}
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	cmd := "DONE"
	if n < len(f.script) {
		cmd = f.script[n]
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-%d", n), "object": "chat.completion", "model": "script-1",
		"choices": []map[string]any{{"index": 0, "finish_reason": "stop",
			"message": map[string]string{"role": "assistant", "content": cmd}}},
	})
}

// agentStep is one command the agent ran and how molt answered.
type agentStep struct {
	cmd      string
	out      string
	replayed bool
}

// runAgent is a scripted agent that starts from scratch: it asks its LLM
// (base) for the next command with the whole conversation so far, runs
// it in sandbox sb, and appends the output. Commands starting "exec:"
// run as a fresh exec (bash -c), the others in the session "main". It
// stops at DONE or (its crash) once it made calls LLM calls or ran runs
// commands (-1: no such limit). rewrite, if set, changes a command
// before it runs (a diverging agent).
func runAgent(t *testing.T, c *client.Client, base, sb string, calls, runs int, rewrite func(i int, cmd string) string) []agentStep {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	history := []string{"keep a log of the work"}
	var steps []agentStep
	for i := 0; ; i++ {
		if i == runs {
			return steps
		}
		cmd := ask(t, base, history, false)
		if cmd == "DONE" || i+1 == calls {
			return steps
		}
		if rewrite != nil {
			cmd = rewrite(i, cmd)
		}
		st := agentStep{cmd: cmd}
		if text, ok := strings.CutPrefix(cmd, "exec:"); ok {
			var out bytes.Buffer
			es, err := c.Exec(ctx, sb, v1.ExecRequest{Args: []string{"bash", "-c", text}}, client.ExecIO{Stdout: &out, Stderr: &out})
			if err != nil {
				t.Fatalf("agent exec %q: %v", text, err)
			}
			st.out, st.replayed = fmt.Sprintf("%s[exit %d]", out.String(), es.ExitCode), es.Replayed
		} else {
			res, err := c.SessionRun(ctx, sb, "main", v1.SessionRunRequest{Command: cmd})
			if err != nil {
				t.Fatalf("agent session run %q: %v", cmd, err)
			}
			st.out, st.replayed = fmt.Sprintf("%s%s[exit %d]", res.Stdout, res.Stderr, res.ExitCode), res.Replayed
		}
		steps = append(steps, st)
		history = append(history, cmd, st.out)
	}
}

// payCmd posts payment order from inside a sandbox with a fresh
// idempotency key each time it runs (as a retrying agent does), and
// appends the answer's payment number to /root/pays.
func payCmd(order string) string {
	return "exec:python3 -c 'import json,urllib.request,uuid\n" +
		"r=urllib.request.Request(\"" + payURL + "\",data=json.dumps({\"order\":\"" + order + "\",\"amount\":7}).encode(),method=\"POST\")\n" +
		"r.add_header(\"Content-Type\",\"application/json\");r.add_header(\"Idempotency-Key\",str(uuid.uuid4()))\n" +
		"print(json.loads(urllib.request.urlopen(r,timeout=20).read())[\"payment\"])' >> /root/pays && echo paid"
}

// recoverScript is the agent's work: files, session state, two
// payments, a read-only turn.
func recoverScript() []string {
	return []string{
		"echo one >> /root/log && mkdir -p /w", // turn 2: fs
		"export X=1 && echo two >> /root/log",  // turn 3: full (the session changed)
		payCmd("r1"),                           // turn 4: fs, an effect
		"exec:cat /root/log",                   // turn 5: none
		// Turn 6 (in progress at crash B): a file and an effect.
		"echo three >> /root/log && " + strings.TrimPrefix(payCmd("r2"), "exec:"),
		"exec:ls /w", // turn 7: none
	}
}

// recoverSetup makes an egress sandbox with an LLM endpoint to a
// scriptLLM.
func recoverSetup(t *testing.T) (sb, base string, llm *scriptLLM, c *client.Client) {
	sb, base, llm, c, _ = recoverSetupUp(t)
	return
}

// recoverSetupUp is recoverSetup, also returning the LLM's URL.
func recoverSetupUp(t *testing.T) (sb, base string, llm *scriptLLM, c *client.Client, up string) {
	t.Helper()
	requireCRIU(t)
	sb = newEgressSandbox(t)
	llm = &scriptLLM{script: recoverScript()}
	srv := httptest.NewServer(llm)
	t.Cleanup(srv.Close)
	up = srv.URL + "/v1"
	var ep struct {
		URL string `json:"url"`
	}
	mustJSON(t, &ep, "llm", sb, "--upstream", up)
	return sb, ep.URL, llm, client.New(env.socket), up
}

// checkFinal checks the sandbox's state after a whole run: each command
// took effect once.
func checkFinal(t *testing.T, sb string) {
	t.Helper()
	if got := strings.TrimSpace(must(t, "exec", sb, "--aside", "--", "cat", "/root/log")); got != "one\ntwo\nthree" {
		t.Errorf("/root/log = %q, want one, two, three once each", got)
	}
	if got := strings.Fields(must(t, "exec", sb, "--aside", "--", "cat", "/root/pays")); len(got) != 2 {
		t.Errorf("/root/pays = %q, want two payments", got)
	}
	if got := strings.TrimSpace(must(t, "exec", sb, "--aside", "--session", "main", "--", "echo $X")); got != "1" {
		t.Errorf("the session's X = %q, want 1 (its state from the replayed turn)", got)
	}
}

func recoverStatus(t *testing.T, sb string) v1.RecoveryStatus {
	t.Helper()
	var st v1.RecoveryStatus
	mustJSON(t, &st, "recover", sb, "--status")
	return st
}

// TestRecoverFastForward: an agent crashes; molt recover brings the
// sandbox back to its latest committed turn checkpoint and the restarted
// agent is answered from the turn log up to that turn (no LLM call, no
// command run again), then runs live: every command took effect once,
// and the payments reached the service once each.
func TestRecoverFastForward(t *testing.T) {
	// Crash A: right after the turn with a full checkpoint (turn 3, the
	// session's state) ended, before its reply's command ran.
	t.Run("at a full checkpoint", func(t *testing.T) {
		sb, base, llm, c := recoverSetup(t)
		pays := env.lab.PayCount()
		first := runAgent(t, c, base, sb, 3, -1, nil)
		if len(first) != 2 || llm.served() != 3 {
			t.Fatalf("first run: %d commands, %d LLM calls; want 2 and 3", len(first), llm.served())
		}
		var res v1.RecoverResult
		mustJSON(t, &res, "recover", sb)
		if res.Turn != 3 || fmt.Sprint(res.Turns) != "[1 2 3]" || res.LLMCalls != 3 || res.Commands != 2 {
			t.Fatalf("recover: %+v; want turns 1-3 with 3 LLM calls and 2 commands", res)
		}
		second := runAgent(t, c, base, sb, -1, -1, nil)
		if len(second) != len(recoverScript()) {
			t.Fatalf("restarted agent ran %d commands, want %d", len(second), len(recoverScript()))
		}
		for i, s := range second {
			if want := i < 2; s.replayed != want {
				t.Errorf("command %d (%q): replayed %v, want %v", i, s.cmd, s.replayed, want)
			}
			if i < 2 && s.out != first[i].out {
				t.Errorf("command %d replayed %q, the first run printed %q", i, s.out, first[i].out)
			}
		}
		// 3 calls of the first run; of the second, the 3 replayed ones
		// never reached the LLM: the ones after them and the last did.
		if n, want := llm.served(), 3+len(recoverScript())-3+1; n != want {
			t.Errorf("the LLM served %d calls, want %d", n, want)
		}
		if st := recoverStatus(t, sb); st.State != v1.RecoveryDone || st.Replayed != 5 || st.Total != 5 {
			t.Errorf("status %+v, want done, 5 of 5", st)
		}
		checkFinal(t, sb)
		if n := env.lab.PayCount() - pays; n != 2 {
			t.Errorf("the payment service got %d payments, want 2", n)
		}
	})

	// Crash B: in the middle of a turn (its command ran) whose last
	// checkpoint is older: turn 5 decided none, so the state is turn 4's
	// checkpoint; the commands after it run live again, and the payment
	// among them is answered from the ledger, not sent twice.
	t.Run("past the last checkpoint", func(t *testing.T) {
		sb, base, llm, c := recoverSetup(t)
		pays := env.lab.PayCount()
		first := runAgent(t, c, base, sb, -1, 5, nil)
		if len(first) != 5 || env.lab.PayCount()-pays != 2 {
			t.Fatalf("first run: %d commands, %d payments", len(first), env.lab.PayCount()-pays)
		}
		var dry v1.RecoverResult
		mustJSON(t, &dry, "recover", sb, "--dry-run")
		if !dry.DryRun || dry.Turn != 5 || dry.Rollback == nil || dry.Rollback.Plan == nil || len(dry.Rollback.Plan.Orphan) == 0 {
			t.Fatalf("dry run %+v (plan %+v): want turn 5 and the session's payment orphaned", dry, dry.Rollback)
		}
		if got := strings.TrimSpace(must(t, "exec", sb, "--aside", "--", "cat", "/root/log")); got != "one\ntwo\nthree" {
			t.Fatalf("the dry run changed the sandbox: /root/log = %q", got)
		}
		out := must(t, "recover", sb)
		if !strings.Contains(out, "(turn 5)") || !strings.Contains(out, "turns 1-5") {
			t.Errorf("recover printed %q", out)
		}
		if got := strings.TrimSpace(must(t, "exec", sb, "--aside", "--", "cat", "/root/log")); got != "one\ntwo" {
			t.Fatalf("after recover /root/log = %q, want turn 4's state", got)
		}
		second := runAgent(t, c, base, sb, -1, -1, nil)
		for i, s := range second {
			if want := i < 4; s.replayed != want {
				t.Errorf("command %d (%q): replayed %v, want %v", i, s.cmd, s.replayed, want)
			}
		}
		if st := recoverStatus(t, sb); st.State != v1.RecoveryDone || st.Replayed != 9 || st.Divergence != nil {
			t.Errorf("status %+v, want done after 9 exchanges", st)
		}
		checkFinal(t, sb)
		if n := env.lab.PayCount() - pays; n != 2 {
			t.Errorf("the payment service got %d payments, want 2 (the re-run one answered from the ledger)", n)
		}
		if n, want := llm.served(), 5+len(recoverScript())-5+1; n != want {
			t.Errorf("the LLM served %d calls, want %d (5, then the ones after turn 5)", n, want)
		}
	})

	// Recovering to an older checkpoint leaves the later turns on a dead
	// branch; deleting that branch's checkpoint deletes its recording,
	// and the live chain stays recoverable.
	t.Run("deleted with its checkpoints", func(t *testing.T) {
		sb, base, _, c := recoverSetup(t)
		runAgent(t, c, base, sb, -1, 5, nil)
		var turns []v1.TurnRecord
		mustJSON(t, &turns, "turns", sb)
		if len(turns) != 5 || turns[2].Checkpoint == nil || turns[3].Checkpoint == nil {
			t.Fatalf("turns %+v: want 5, turns 3 and 4 with checkpoints", turns)
		}
		ck3, ck4 := *turns[2].Checkpoint, *turns[3].Checkpoint
		var res v1.RecoverResult
		mustJSON(t, &res, "recover", sb, "--to", ck3)
		if res.Turn != 3 {
			t.Fatalf("recover --to %s: %+v", ck3, res)
		}
		runAgent(t, c, base, sb, -1, -1, nil)
		must(t, "checkpoint", "rm", ck4)
		turns = nil
		mustJSON(t, &turns, "turns", sb)
		var ns []int
		for _, tr := range turns {
			ns = append(ns, tr.Turn)
			if tr.Turn > 5 && tr.Prev != tr.Turn-1 && !(tr.Turn == 6 && tr.Prev == 3) {
				t.Errorf("turn %d continues %d", tr.Turn, tr.Prev)
			}
		}
		if fmt.Sprint(ns[:4]) != "[1 2 3 6]" {
			t.Fatalf("turns after deleting %s: %v, want 4 and 5 (its branch) gone", ck4, ns)
		}
		mustJSON(t, &res, "recover", sb, "--dry-run")
		if res.Turns[0] != 1 || res.Turns[2] != 3 || res.Turns[3] != 6 {
			t.Errorf("the live chain after the prune: %v", res.Turns)
		}
	})

	// Every process of the sandbox killed (its init, so its PID
	// namespace): the sandbox is lost; recover restores its processes
	// from the checkpoints and fast-forwards the agent.
	t.Run("every process killed", func(t *testing.T) {
		sb, base, _, c := recoverSetup(t)
		pays := env.lab.PayCount()
		runAgent(t, c, base, sb, -1, 5, nil)
		if err := syscall.Kill(inspect(t, sb).Pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the sandbox lost", 10*time.Second, func() bool { return inspect(t, sb).State == "lost" })
		var res v1.RecoverResult
		mustJSON(t, &res, "recover", sb)
		if res.Turn != 5 {
			t.Fatalf("recover: %+v, want turn 5", res)
		}
		second := runAgent(t, c, base, sb, -1, -1, nil)
		if len(second) != len(recoverScript()) || !second[3].replayed || second[4].replayed {
			t.Fatalf("restarted agent: %d commands; the 4th replayed %v, the 5th %v", len(second), second[3].replayed, second[4].replayed)
		}
		checkFinal(t, sb)
		if n := env.lab.PayCount() - pays; n != 2 {
			t.Errorf("the payment service got %d payments, want 2", n)
		}
	})

	// A restarted agent that asks something else than the record: the
	// first differing request runs live and is reported.
	t.Run("divergence", func(t *testing.T) {
		sb, base, _, c := recoverSetup(t)
		runAgent(t, c, base, sb, -1, 4, nil)
		must(t, "recover", sb)
		second := runAgent(t, c, base, sb, -1, 3, func(i int, cmd string) string {
			if i == 1 {
				return strings.Replace(cmd, "X=1", "X=2", 1)
			}
			return cmd
		})
		if !second[0].replayed || second[1].replayed || second[2].replayed {
			t.Errorf("replayed: %v %v %v, want only the first", second[0].replayed, second[1].replayed, second[2].replayed)
		}
		st := recoverStatus(t, sb)
		d := st.Divergence
		if st.State != v1.RecoveryDiverged || d == nil || d.Index != 3 || d.Turn != 3 ||
			!strings.Contains(d.Expected, "X=1") || !strings.Contains(d.Got, "X=2") {
			t.Fatalf("status %+v (divergence %+v): want diverged at exchange 3 (turn 3), X=1 expected, X=2 got", st, d)
		}
		out := must(t, "recover", sb, "--status")
		if !strings.Contains(out, "diverged at exchange 3 (turn 3)") {
			t.Errorf("recover --status printed %q", out)
		}
	})
}

// TestRecoverAfterDaemonCrash: the daemon is killed mid-turn; after it
// restarts, the agent's endpoint is made again and recover
// fast-forwards the restarted agent from the durable turn log.
func TestRecoverAfterDaemonCrash(t *testing.T) {
	if env.daemon == nil {
		t.Skip("the daemon is not this test's to kill")
	}
	sb, base, llm, c, up := recoverSetupUp(t)
	pays := env.lab.PayCount()
	runAgent(t, c, base, sb, -1, 5, nil)
	killDaemon()
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
	var ep struct {
		URL string `json:"url"`
	}
	mustJSON(t, &ep, "llm", sb, "--upstream", up)
	var res v1.RecoverResult
	mustJSON(t, &res, "recover", sb)
	if res.Turn < 4 {
		t.Fatalf("recover after the daemon's crash: %+v, want at least turn 4", res)
	}
	served := llm.served()
	second := runAgent(t, c, ep.URL, sb, -1, -1, nil)
	if len(second) != len(recoverScript()) || !second[0].replayed {
		t.Fatalf("restarted agent: %d commands, first replayed %v", len(second), second[0].replayed)
	}
	if st := recoverStatus(t, sb); st.State != v1.RecoveryDone {
		t.Errorf("status %+v, want done", st)
	}
	checkFinal(t, sb)
	if n := env.lab.PayCount() - pays; n != 2 {
		t.Errorf("the payment service got %d payments, want 2", n)
	}
	if n := llm.served() - served; n > len(recoverScript())-res.Commands+1 {
		t.Errorf("the LLM served %d calls after recovery, more than the %d not replayed", n, len(recoverScript())-res.Commands+1)
	}
}
