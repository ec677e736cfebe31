package turn

import (
	"strings"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/meta"
)

func llmCall(id int, sha string, at time.Time) meta.LLMCall {
	return meta.LLMCall{ID: id, API: "openai.chat", Path: "/v1/chat/completions", RequestSHA256: sha, Response: "r" + sha, Status: 200, Started: at}
}

func cmd(text string, at time.Time) meta.TurnCommand {
	return meta.TurnCommand{Time: at, Session: "main", Command: text, Ident: SessionIdent("main", text, 0), Stdout: "out:" + text}
}

// The script is each turn's commands and LLM call in the order the
// agent sent them; the agent's requests are answered in that order, and
// the first that differs ends the fast-forward, reported with its turn.
func TestFastForward(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	chain := []meta.TurnRecord{
		{TurnResult: meta.TurnResult{Turn: 1}, LLM: []meta.LLMCall{llmCall(1, "a", at(1))}},
		// A turn whose first end failed: an LLM call between its commands.
		{TurnResult: meta.TurnResult{Turn: 2}, Prev: 1,
			Commands: []meta.TurnCommand{cmd("ls", at(2)), cmd("pwd", at(4))},
			LLM:      []meta.LLMCall{llmCall(2, "b", at(3)), llmCall(3, "c", at(5))}},
	}
	ff, err := NewFastForward("ck", chain)
	if err != nil {
		t.Fatal(err)
	}
	if llm, cmds := ff.Count(); llm != 3 || cmds != 2 || ff.Turn != 2 {
		t.Fatalf("count %d llm, %d commands, turn %d", llm, cmds, ff.Turn)
	}
	want := []Request{
		{Kind: ExchangeLLM, Ident: LLMIdent("openai.chat", "a")},
		{Kind: ExchangeSession, Ident: SessionIdent("main", "ls", 0)},
		{Kind: ExchangeLLM, Ident: LLMIdent("openai.chat", "b")},
		{Kind: ExchangeSession, Ident: SessionIdent("main", "pwd", 0)},
	}
	for i, r := range want {
		x, ok, div := ff.Next(r)
		if !ok || div != nil || x.Kind != r.Kind {
			t.Fatalf("request %d: ok %v, divergence %+v", i, ok, div)
		}
	}
	if st := ff.Status(); st.State != FFActive || st.Replayed != 4 || st.Total != 5 || st.Bytes != int64(len("ra")+len("out:ls")+len("rb")+len("out:pwd")) {
		t.Fatalf("status %+v", st)
	}
	// The last exchange asked differently: live from here, reported.
	if _, ok, div := ff.Next(Request{Kind: ExchangeLLM, Ident: LLMIdent("openai.chat", "other"), What: "the other call"}); ok || div == nil ||
		div.Turn != 2 || div.Index != 4 || !strings.Contains(div.Expected, "sha256 c") || div.Got != "the other call" {
		t.Fatalf("diverging request: ok %v, %+v", ok, div)
	}
	if _, ok, div := ff.Next(want[0]); ok || div != nil {
		t.Fatalf("after the divergence a request was answered (%v) or diverged again (%+v)", ok, div)
	}
	if st := ff.Status(); st.State != FFDiverged || st.Divergence == nil {
		t.Fatalf("status %+v", st)
	}
}

// A chain with a cut output, a cut response or a command without an
// identity cannot be fast-forwarded; an empty chain is done at once.
func TestFastForwardRefuses(t *testing.T) {
	ok := meta.TurnRecord{TurnResult: meta.TurnResult{Turn: 1}, LLM: []meta.LLMCall{llmCall(1, "a", time.Time{})}}
	for name, tr := range map[string]meta.TurnRecord{
		"incomplete":  {TurnResult: meta.TurnResult{Turn: 2}, Incomplete: "limit"},
		"cut output":  {TurnResult: meta.TurnResult{Turn: 2}, Commands: []meta.TurnCommand{{Ident: "x", Cut: true}}},
		"no identity": {TurnResult: meta.TurnResult{Turn: 2}, Commands: []meta.TurnCommand{{Command: "ls"}}},
		"cut reply":   {TurnResult: meta.TurnResult{Turn: 2}, LLM: []meta.LLMCall{{RequestSHA256: "s", ResponseTruncated: true}}},
	} {
		if _, err := NewFastForward("ck", []meta.TurnRecord{ok, tr}); err == nil || !strings.Contains(err.Error(), "turn 2") {
			t.Errorf("%s: %v, want turn 2 refused", name, err)
		}
	}
	ff, err := NewFastForward("ck", nil)
	if err != nil || ff.Status().State != FFDone {
		t.Fatalf("empty chain: %v %+v", err, ff)
	}
}

// Identities differ with anything that changes what runs.
func TestIdents(t *testing.T) {
	base := ExecIdent([]string{"ls", "-l"}, map[string]string{"A": "1", "B": "2"}, "/", "", false, false, 0)
	if ExecIdent([]string{"ls", "-l"}, map[string]string{"B": "2", "A": "1"}, "/", "", false, false, 0) != base {
		t.Error("env order changed the identity")
	}
	for name, id := range map[string]string{
		"args":    ExecIdent([]string{"ls -l"}, map[string]string{"A": "1", "B": "2"}, "/", "", false, false, 0),
		"env":     ExecIdent([]string{"ls", "-l"}, map[string]string{"A": "1"}, "/", "", false, false, 0),
		"cwd":     ExecIdent([]string{"ls", "-l"}, map[string]string{"A": "1", "B": "2"}, "/tmp", "", false, false, 0),
		"user":    ExecIdent([]string{"ls", "-l"}, map[string]string{"A": "1", "B": "2"}, "/", "nobody", false, false, 0),
		"detach":  ExecIdent([]string{"ls", "-l"}, map[string]string{"A": "1", "B": "2"}, "/", "", true, false, 0),
		"timeout": ExecIdent([]string{"ls", "-l"}, map[string]string{"A": "1", "B": "2"}, "/", "", false, false, 5),
	} {
		if id == base {
			t.Errorf("%s did not change the identity", name)
		}
	}
	if SessionIdent("a", "ls", 0) == SessionIdent("b", "ls", 0) {
		t.Error("the session did not change the identity")
	}
}
