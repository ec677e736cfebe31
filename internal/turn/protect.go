package turn

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/molt-sh/molt/internal/meta"
	"github.com/molt-sh/molt/internal/secret"
)

// Secret hygiene of the turn log (docs/security.md, "Secret hygiene").
//
// Before a record is stored, the text of each command (its session text
// or argv, its outputs) and each LLM call (request and response bodies)
// is redacted: what looks like a credential, and the sandbox's secrets,
// become secret.Mark. A recovery replays recorded outputs and replies
// exactly, so the exact text is kept too, but only sealed with the
// tenant's data key (SealedCommands, SealedLLM), bound to the sandbox,
// the turn and the item: it is written when redaction changed the text,
// and always when encryption at rest is on, when the clear fields are
// left empty and the redacted text is sealed too. The API and exports
// read the redacted text (Log); only a recovery opens the exact one
// (ExactLog).

// SetVault sets what redacts and seals the log (nil: stored as given).
func (t *Tracker) SetVault(v *secret.Vault) { t.vault.Store(v) }

func (t *Tracker) vaultOf() *secret.Vault { return t.vault.Load() }

// commandText is what a record keeps of a command that may hold a
// secret.
type commandText struct {
	Command string   `json:"command,omitempty"`
	Args    []string `json:"args,omitempty"`
	Stdout  string   `json:"stdout,omitempty"`
	Stderr  string   `json:"stderr,omitempty"`
}

// llmText is what a record keeps of an LLM call that may hold a secret.
type llmText struct {
	Request  string `json:"request,omitempty"`
	Response string `json:"response,omitempty"`
}

// sealedText is the plaintext of a sealed item: the exact text, and the
// redacted one when it differs and the clear fields are empty (Whole).
type sealedText[T any] struct {
	Exact T    `json:"exact"`
	Shown *T   `json:"shown,omitempty"`
	Whole bool `json:"whole,omitempty"`
}

// itemAAD binds a sealed item to its sandbox, turn, kind and place.
func itemAAD(id string, turn int, kind string, key string) []byte {
	return []byte("molt turn v1\x00" + id + "\x00" + strconv.Itoa(turn) + "\x00" + kind + "\x00" + key)
}

func (c commandText) redact(v *secret.Vault, id string) commandText {
	out := commandText{Command: v.Redact(id, c.Command), Stdout: v.Redact(id, c.Stdout), Stderr: v.Redact(id, c.Stderr)}
	for _, a := range c.Args {
		out.Args = append(out.Args, v.Redact(id, a))
	}
	return out
}

func (c commandText) equal(o commandText) bool {
	return c.Command == o.Command && c.Stdout == o.Stdout && c.Stderr == o.Stderr && slices.Equal(c.Args, o.Args)
}

func (l llmText) redact(v *secret.Vault, id string) llmText {
	return llmText{Request: v.Redact(id, l.Request), Response: v.Redact(id, l.Response)}
}

// protect redacts exact for sandbox id, and returns what the clear
// fields keep and the sealed item (nil: none needed).
func protect[T any](v *secret.Vault, id string, exact T, shown T, same bool, aad []byte) (clear T, sealed []byte, err error) {
	whole := v.Whole()
	if !whole && same {
		return exact, nil, nil
	}
	st := sealedText[T]{Exact: exact, Whole: whole}
	if whole && !same {
		st.Shown = &shown
	}
	plain, err := json.Marshal(st)
	if err != nil {
		return clear, nil, err
	}
	if sealed, err = v.Seal(id, plain, aad); err != nil {
		return clear, nil, err
	}
	if whole {
		return clear, sealed, nil // nothing in the clear
	}
	return shown, sealed, nil
}

// reveal opens a sealed item: the exact text, or the redacted one.
func reveal[T any](v *secret.Vault, id string, clear T, sealed []byte, aad []byte, exact bool) (T, error) {
	if len(sealed) == 0 {
		return clear, nil
	}
	if v == nil {
		return clear, fmt.Errorf("turn log of %s: sealed text, and no keys to open it", id)
	}
	plain, err := v.Open(id, sealed, aad)
	if err != nil {
		return clear, fmt.Errorf("turn log: %w", err)
	}
	var st sealedText[T]
	if err := json.Unmarshal(plain, &st); err != nil {
		return clear, fmt.Errorf("turn log of %s: sealed text: %w", id, err)
	}
	switch {
	case exact || (st.Whole && st.Shown == nil):
		return st.Exact, nil
	case st.Shown != nil:
		return *st.Shown, nil
	}
	return clear, nil
}

// protectCommands redacts and seals tr's commands before it is stored.
func (t *Tracker) protectCommands(tr *meta.TurnRecord) error {
	v := t.vaultOf()
	if v == nil {
		return nil
	}
	tr.SealedCommands = nil
	sealed := make([][]byte, len(tr.Commands))
	any := false
	for i := range tr.Commands {
		c := &tr.Commands[i]
		exact := commandText{Command: c.Command, Args: c.Args, Stdout: c.Stdout, Stderr: c.Stderr}
		shown := exact.redact(v, tr.Sandbox)
		clear, s, err := protect(v, tr.Sandbox, exact, shown, exact.equal(shown), itemAAD(tr.Sandbox, tr.Turn, "cmd", strconv.Itoa(i)))
		if err != nil {
			return err
		}
		c.Command, c.Args, c.Stdout, c.Stderr = clear.Command, clear.Args, clear.Stdout, clear.Stderr
		sealed[i], any = s, any || s != nil
	}
	if any {
		tr.SealedCommands = sealed
	}
	return nil
}

// protectLLM redacts and seals LLM call c of sandbox id's turn, returning
// its sealed item.
func (t *Tracker) protectLLM(id string, turn int, c *meta.LLMCall) ([]byte, error) {
	v := t.vaultOf()
	if v == nil {
		return nil, nil
	}
	exact := llmText{Request: c.Request, Response: c.Response}
	shown := exact.redact(v, id)
	clear, s, err := protect(v, id, exact, shown, exact == shown, itemAAD(id, turn, "llm", strconv.Itoa(c.ID)))
	if err != nil {
		return nil, err
	}
	c.Request, c.Response = clear.Request, clear.Response
	return s, nil
}

// reveal opens tr's sealed items in place: the exact text, or the
// redacted one. The sealed items are dropped from tr.
func (t *Tracker) reveal(tr *meta.TurnRecord, exact bool) error {
	v := t.vaultOf()
	for i := range tr.Commands {
		if i >= len(tr.SealedCommands) || len(tr.SealedCommands[i]) == 0 {
			continue
		}
		c := &tr.Commands[i]
		clear := commandText{Command: c.Command, Args: c.Args, Stdout: c.Stdout, Stderr: c.Stderr}
		x, err := reveal(v, tr.Sandbox, clear, tr.SealedCommands[i], itemAAD(tr.Sandbox, tr.Turn, "cmd", strconv.Itoa(i)), exact)
		if err != nil {
			return fmt.Errorf("turn %d, command %d: %w", tr.Turn, i, err)
		}
		c.Command, c.Args, c.Stdout, c.Stderr = x.Command, x.Args, x.Stdout, x.Stderr
	}
	for i := range tr.LLM {
		if i >= len(tr.SealedLLM) || len(tr.SealedLLM[i]) == 0 {
			continue
		}
		c := &tr.LLM[i]
		x, err := reveal(v, tr.Sandbox, llmText{Request: c.Request, Response: c.Response}, tr.SealedLLM[i], itemAAD(tr.Sandbox, tr.Turn, "llm", strconv.Itoa(c.ID)), exact)
		if err != nil {
			return fmt.Errorf("turn %d, LLM call %d: %w", tr.Turn, c.ID, err)
		}
		c.Request, c.Response = x.Request, x.Response
	}
	tr.SealedCommands, tr.SealedLLM = nil, nil
	return nil
}

// learn notes the secrets a recorded command assigns (a session's
// `export DB_PASSWORD=...`), so that they are redacted from then on.
func (t *Tracker) learn(id string, c meta.TurnCommand) {
	if v := t.vaultOf(); v != nil {
		v.Learn(id, c.Command+"\n"+strings.Join(c.Args, " "))
	}
}

// storedBytes is what tr holds of outputs and LLM exchanges, against
// the sandbox's recording limit: a sealed item counts its sealed size
// (its exact text, and the redacted one with encryption at rest), the
// others their clear text.
func storedBytes(tr meta.TurnRecord) int64 {
	var n int64
	for i, c := range tr.Commands {
		if i < len(tr.SealedCommands) && len(tr.SealedCommands[i]) > 0 {
			n += int64(len(tr.SealedCommands[i]))
		} else {
			n += int64(len(c.Stdout) + len(c.Stderr))
		}
	}
	for i, c := range tr.LLM {
		if i < len(tr.SealedLLM) && len(tr.SealedLLM[i]) > 0 {
			n += int64(len(tr.SealedLLM[i]))
		} else {
			n += int64(len(c.Request) + len(c.Response))
		}
	}
	return n
}
