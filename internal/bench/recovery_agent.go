// The recovery benchmark's scripted agent: a separate OS process (so a
// crash can kill -9 it) that talks only to molt's LLM endpoint and
// molt's exec and session API, keeps its chat in memory, and runs one
// command per turn.

package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/client"
)

// Agent modes: how a (re)started agent begins.
const (
	// AgentFresh starts from scratch with an empty chat: the first run,
	// and molt's recovery (the agent is fast-forwarded by molt).
	AgentFresh = "fresh"
	// AgentChat loads its transcript, re-runs the commands of entries
	// from ReplayFrom on, and continues live with the loaded chat.
	AgentChat = "chat"
)

// AgentSpec is what a recovery-agent process is told.
type AgentSpec struct {
	Socket  string `json:"socket"`
	Sandbox string `json:"sandbox"`
	// BaseURL is molt's LLM endpoint for the sandbox (OpenAI base URL).
	BaseURL string `json:"base_url"`
	Model   string `json:"model"`
	Agent   string `json:"agent"` // the trajectory's agent: how commands run
	Mode    string `json:"mode"`
	// ReplayFrom is the first transcript entry AgentChat re-runs.
	ReplayFrom int `json:"replay_from"`
	// PauseAfter stops the agent (it prints "paused" and waits to be
	// killed) once the command of that turn ran; -1: never.
	PauseAfter int    `json:"pause_after"`
	Transcript string `json:"transcript"` // the chat, one entry per turn (JSON lines)
	Events     string `json:"events"`     // what the agent did, when (JSON lines)
	CmdTimeout int64  `json:"cmd_timeout_ms"`
}

// TranscriptEntry is one turn of an agent's chat, as it persists it.
type TranscriptEntry struct {
	Turn        int    `json:"turn"`
	Reply       string `json:"reply"`
	Command     string `json:"command,omitempty"`
	HasCommand  bool   `json:"has_command"`
	Observation string `json:"observation"`
}

// Agent events.
const (
	EvLLM     = "llm"     // an LLM reply arrived (Bytes: its size)
	EvExec    = "exec"    // a turn's command ran (Bytes: its output)
	EvRerun   = "rerun"   // a transcript command re-ran (chat recovery)
	EvResumed = "resumed" // the chat is loaded and its commands re-run
	EvDone    = "done"
)

// AgentEvent is one line of the events file.
type AgentEvent struct {
	Phase    string `json:"phase"`
	Turn     int    `json:"turn"`
	Bytes    int64  `json:"bytes,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	T        int64  `json:"t"` // unix nanoseconds
}

// The system and task messages every run's chat starts with.
const (
	agentSystem = "You are a coding agent. Reply with one bash command per turn in a fenced ```bash block."
	agentTask   = "Work on the task."
)

// RunRecoveryAgent runs the agent of spec until its script is done, the
// pause, or an error (a crashed sandbox or daemon). stdout gets
// "paused" at the pause.
func RunRecoveryAgent(ctx context.Context, spec AgentSpec, stdout io.Writer) error {
	c := client.New(spec.Socket)
	ev, err := os.OpenFile(spec.Events, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer ev.Close()
	emit := func(e AgentEvent) {
		e.T = time.Now().UnixNano()
		b, _ := json.Marshal(e)
		_, _ = ev.Write(append(b, '\n'))
	}
	tr, err := os.OpenFile(spec.Transcript, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer tr.Close()
	msgs := []chatMessage{{Role: "system", Content: agentSystem}, {Role: "user", Content: agentTask}}
	turn := 0
	if spec.Mode == AgentChat {
		entries, err := readTranscript(tr)
		if err != nil {
			return err
		}
		for i, e := range entries {
			if i >= spec.ReplayFrom && e.HasCommand {
				out, _, err := agentRun(ctx, c, spec, e.Command)
				if err != nil {
					return fmt.Errorf("re-run turn %d: %w", e.Turn, err)
				}
				emit(AgentEvent{Phase: EvRerun, Turn: e.Turn, Bytes: int64(len(out))})
			}
			msgs = append(msgs, chatMessage{Role: "assistant", Content: e.Reply}, chatMessage{Role: "user", Content: e.Observation})
		}
		turn = len(entries)
		emit(AgentEvent{Phase: EvResumed, Turn: turn})
	}
	hc := &http.Client{Timeout: 10 * time.Minute}
	for ; ; turn++ {
		reply, err := askLLM(ctx, hc, spec, msgs)
		if err != nil {
			return fmt.Errorf("turn %d: llm: %w", turn, err)
		}
		emit(AgentEvent{Phase: EvLLM, Turn: turn, Bytes: int64(len(reply))})
		if strings.Contains(reply, "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT") {
			emit(AgentEvent{Phase: EvDone, Turn: turn})
			return nil
		}
		e := TranscriptEntry{Turn: turn, Reply: reply}
		e.Command, e.HasCommand = CommandOf(reply)
		if e.HasCommand {
			out, replayed, err := agentRun(ctx, c, spec, e.Command)
			if err != nil {
				return fmt.Errorf("turn %d: %w", turn, err)
			}
			e.Observation = out
			emit(AgentEvent{Phase: EvExec, Turn: turn, Bytes: int64(len(out)), Replayed: replayed})
		} else {
			e.Observation = "No command found: reply with one fenced bash block."
		}
		b, _ := json.Marshal(e)
		if _, err := tr.Write(append(b, '\n')); err != nil {
			return err
		}
		if err := tr.Sync(); err != nil {
			return err
		}
		msgs = append(msgs, chatMessage{Role: "assistant", Content: reply}, chatMessage{Role: "user", Content: e.Observation})
		if turn == spec.PauseAfter {
			fmt.Fprintln(stdout, "paused")
			<-ctx.Done()
			return ctx.Err()
		}
	}
}

func readTranscript(f *os.File) ([]TranscriptEntry, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var out []TranscriptEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		var e TranscriptEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("transcript: %w", err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// askLLM sends the chat to molt's LLM endpoint and returns the reply.
func askLLM(ctx context.Context, hc *http.Client, spec AgentSpec, msgs []chatMessage) (string, error) {
	body, err := json.Marshal(chatRequest{Model: spec.Model, Messages: msgs})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(spec.BaseURL, "/")+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var out struct {
		Choices []struct {
			Message chatMessage `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
		return "", fmt.Errorf("reply %q: %v", b, err)
	}
	return out.Choices[0].Message.Content, nil
}

// agentRun runs one command the agent's way (a fresh bash -c for
// mini-swe-agent, the persistent session otherwise) and returns the
// observation the agent is shown.
func agentRun(ctx context.Context, c *client.Client, spec AgentSpec, cmd string) (obs string, replayed bool, err error) {
	if spec.Agent == AgentMini {
		var out bytes.Buffer
		st, err := c.Exec(ctx, spec.Sandbox, v1.ExecRequest{Args: []string{"bash", "-c", cmd}, Env: miniEnv, Cwd: "/testbed", TimeoutMS: spec.CmdTimeout},
			client.ExecIO{Stdout: &out, Stderr: &out})
		if err != nil {
			return "", false, err
		}
		if st.ExitCode < 0 && !st.TimedOut {
			return "", false, errors.New("exec ended without an exit status")
		}
		return fmt.Sprintf("<returncode>%d</returncode>\n<output>\n%s</output>", st.ExitCode, out.String()), st.Replayed, nil
	}
	res, err := c.SessionRun(ctx, spec.Sandbox, "main", v1.SessionRunRequest{Command: cmd, TimeoutMS: spec.CmdTimeout})
	if err != nil {
		return "", false, err
	}
	return fmt.Sprintf("%s%s\n[exit code %d]", res.Stdout, res.Stderr, res.ExitCode), res.Replayed, nil
}
