package turn

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/meta"
)

// A fast-forward answers a restarted agent from the turn log. After a
// recovery the sandbox is in the state some turn T ended in; the agent,
// restarted from scratch, asks again what it asked before. Its LLM
// calls and commands up to T are answered from the record of the chain
// of turns that ends at T (in order: each turn's commands, then the LLM
// call that ended it), without running anything; the sandbox already
// holds their effects. The first request that differs from the record
// ends the fast-forward: it and everything after it run live, and the
// difference is reported.

// Exchange kinds.
const (
	ExchangeLLM     = "llm"
	ExchangeExec    = "exec"
	ExchangeSession = "session"
)

// Exchange is one recorded request of a fast-forward and its answer.
type Exchange struct {
	Turn  int
	Kind  string
	Ident string
	Cmd   *meta.TurnCommand // exec and session
	LLM   *meta.LLMCall     // llm
}

// describe names what the exchange asked, for a divergence report.
func (x Exchange) describe() string {
	switch x.Kind {
	case ExchangeLLM:
		return fmt.Sprintf("LLM call %s %s (request sha256 %s, %d bytes)", x.LLM.API, x.LLM.Path, short(x.LLM.RequestSHA256), x.LLM.RequestBytes)
	case ExchangeSession:
		return fmt.Sprintf("session %s: %s", x.Cmd.Session, clipText(x.Cmd.Command, 200))
	}
	return "exec " + clipText(strings.Join(x.Cmd.Args, " "), 200)
}

// at is when the agent sent the request.
func (x Exchange) at() time.Time {
	if x.LLM != nil {
		return x.LLM.Started
	}
	return x.Cmd.Time
}

// size is the recorded output the exchange answers with.
func (x Exchange) size() int64 {
	if x.LLM != nil {
		return int64(len(x.LLM.Response))
	}
	return int64(len(x.Cmd.Stdout) + len(x.Cmd.Stderr))
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Request is a request a fast-forward is asked to answer.
type Request struct {
	Kind  string
	Ident string
	// What describes the request for a divergence report.
	What string
}

// Divergence is the first request that did not match the record.
type Divergence struct {
	Turn     int
	Index    int
	Expected string
	Got      string
	At       time.Time
}

// Fast-forward states.
const (
	FFActive   = "fast-forward"
	FFDone     = "done"
	FFDiverged = "diverged"
)

// FastForward is a sandbox's fast-forward: the script of recorded
// exchanges and how far the agent has come through it.
//
// Checkpoint, Turn and Script do not change once it is made.
type FastForward struct {
	Checkpoint string
	Turn       int // the last turn of the script
	Script     []Exchange

	mu sync.Mutex
	// +checklocks:mu
	pos int
	// +checklocks:mu
	state string
	// +checklocks:mu
	div *Divergence
	// +checklocks:mu
	replayedBytes int64
}

// NewFastForward makes the fast-forward of chain (the turn records from
// the first to the last, each continuing the one before): every
// record must be complete.
func NewFastForward(ck string, chain []meta.TurnRecord) (*FastForward, error) {
	ff := &script{}
	for i := range chain {
		tr := &chain[i]
		first := len(ff.Script)
		if tr.Incomplete != "" {
			return nil, fmt.Errorf("turn %d's record is incomplete: %s", tr.Turn, tr.Incomplete)
		}
		for j := range tr.Commands {
			c := &tr.Commands[j]
			if c.Cut {
				return nil, fmt.Errorf("turn %d's record is incomplete: command %d's output was cut", tr.Turn, j)
			}
			if c.Ident == "" {
				return nil, fmt.Errorf("turn %d's command %d has no request identity (recorded by an older molt)", tr.Turn, j)
			}
			kind := ExchangeExec
			if c.Session != "" {
				kind = ExchangeSession
			}
			ff.Script = append(ff.Script, Exchange{Turn: tr.Turn, Kind: kind, Ident: c.Ident, Cmd: c})
		}
		for j := range tr.LLM {
			c := &tr.LLM[j]
			if c.Replayed {
				continue
			}
			if c.ResponseTruncated || c.RequestSHA256 == "" {
				return nil, fmt.Errorf("turn %d's LLM call %d cannot be replayed (response cut or no request identity)", tr.Turn, c.ID)
			}
			ff.Script = append(ff.Script, Exchange{Turn: tr.Turn, Kind: ExchangeLLM, Ident: LLMIdent(c.API, c.RequestSHA256), LLM: c})
		}
		// In the order the agent sent them: a turn whose end failed
		// holds an LLM call between its commands.
		sort.SliceStable(ff.Script[first:], func(i, j int) bool {
			return ff.Script[first+i].at().Before(ff.Script[first+j].at())
		})
		ff.Turn = tr.Turn
	}
	state := FFActive
	if len(ff.Script) == 0 {
		state = FFDone
	}
	return &FastForward{Checkpoint: ck, Turn: ff.Turn, Script: ff.Script, state: state}, nil
}

// script is a FastForward's script while it is made.
type script struct {
	Turn   int
	Script []Exchange
}

// Next answers req from the record if it is the next exchange; ok false
// means the request runs live (the fast-forward is over, or req is the
// first request that differs: that is recorded as the divergence, and
// returned).
func (ff *FastForward) Next(req Request) (x Exchange, ok bool, div *Divergence) {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	if ff.state != FFActive {
		return Exchange{}, false, nil
	}
	x = ff.Script[ff.pos]
	if x.Kind != req.Kind || x.Ident != req.Ident {
		ff.state = FFDiverged
		ff.div = &Divergence{Turn: x.Turn, Index: ff.pos, Expected: x.describe(), Got: req.What, At: time.Now().UTC()}
		d := *ff.div
		return Exchange{}, false, &d
	}
	ff.pos++
	ff.replayedBytes += x.size()
	if ff.pos == len(ff.Script) {
		ff.state = FFDone
	}
	return x, true, nil
}

// Status is where the fast-forward stands.
type Status struct {
	Checkpoint string
	Turn       int
	State      string
	Replayed   int
	Total      int
	Bytes      int64
	Divergence *Divergence
}

// Status reports the fast-forward's progress.
func (ff *FastForward) Status() Status {
	s := Status{Checkpoint: ff.Checkpoint, Turn: ff.Turn, Total: len(ff.Script)}
	ff.mu.Lock()
	defer ff.mu.Unlock()
	s.State, s.Replayed, s.Bytes = ff.state, ff.pos, ff.replayedBytes
	if ff.div != nil {
		d := *ff.div
		s.Divergence = &d
	}
	return s
}

// Bytes is the recorded output the whole script holds.
func (ff *FastForward) Bytes() int64 {
	var n int64
	for _, x := range ff.Script {
		n += x.size()
	}
	return n
}

// Count returns how many LLM calls and commands the script holds.
func (ff *FastForward) Count() (llm, cmds int) {
	for _, x := range ff.Script {
		if x.Kind == ExchangeLLM {
			llm++
		} else {
			cmds++
		}
	}
	return llm, cmds
}

// Arm installs ff as sandbox id's fast-forward (replacing one).
func (t *Tracker) Arm(id string, ff *FastForward) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ff[id] = ff
}

// Disarm drops sandbox id's fast-forward: its state was replaced by
// something else than the recovery (a rollback, a removal).
func (t *Tracker) Disarm(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.ff, id)
}

// FastForwardOf returns sandbox id's fast-forward, or nil.
func (t *Tracker) FastForwardOf(id string) *FastForward {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ff[id]
}

// Replay answers req from sandbox id's fast-forward, if one is under
// way and req is its next exchange.
func (t *Tracker) Replay(id string, req Request) (Exchange, bool) {
	ff := t.FastForwardOf(id)
	if ff == nil {
		return Exchange{}, false
	}
	x, ok, div := ff.Next(req)
	if div != nil {
		t.cfg.Log.Warn("fast-forward diverged: running live from here", "sandbox", id,
			"turn", div.Turn, "index", div.Index, "expected", div.Expected, "got", div.Got)
	}
	return x, ok
}

// LLMIdent is the identity of an LLM call: its API and the hash of its
// whole request body.
func LLMIdent(api, requestSHA256 string) string { return api + ":" + requestSHA256 }

// ExecIdent is the identity of an exec request: what runs, where, as
// whom, with what.
func ExecIdent(args []string, env map[string]string, cwd, user string, detach, stdin bool, timeoutMS int64) string {
	return ident(struct {
		Args    []string          `json:"args"`
		Env     map[string]string `json:"env,omitempty"`
		Cwd     string            `json:"cwd,omitempty"`
		User    string            `json:"user,omitempty"`
		Detach  bool              `json:"detach,omitempty"`
		Stdin   bool              `json:"stdin,omitempty"`
		Timeout int64             `json:"timeout_ms,omitempty"`
	}{args, env, cwd, user, detach, stdin, timeoutMS})
}

// SessionIdent is the identity of a session run.
func SessionIdent(session, command string, timeoutMS int64) string {
	return ident(struct {
		Session string `json:"session"`
		Command string `json:"command"`
		Timeout int64  `json:"timeout_ms,omitempty"`
	}{session, command, timeoutMS})
}

func ident(v any) string {
	b, _ := json.Marshal(v) // maps marshal with sorted keys
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
