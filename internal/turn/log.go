package turn

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/meta"
)

// The turn log: one record per ended turn in bucket meta.Turns, keyed
// "<sandbox>/<turn number, 9 digits>" so that a prefix scan lists a
// sandbox's turns oldest first.

func turnKey(id string, n int) string { return fmt.Sprintf("%s/%09d", id, n) }

// lastTurn is the number of sandbox id's last logged turn (0: none).
func (t *Tracker) lastTurn(id string) int {
	// Keys are zero-padded: the last in key order is the highest.
	k, ok := t.cfg.DB.LastWithPrefix(meta.Turns, id+"/")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimPrefix(k, id+"/"))
	if err != nil {
		return 0
	}
	return n
}

// record writes an ended turn to the log; a failure is logged, not
// returned: the turn's checkpoint is taken either way.
func (t *Tracker) record(tr meta.TurnRecord) {
	if err := t.cfg.DB.Put(meta.Turns, turnKey(tr.Sandbox, tr.Turn), tr); err != nil {
		t.cfg.Log.Warn("turn not recorded", "sandbox", tr.Sandbox, "turn", tr.Turn, "err", err)
	}
}

// Log lists sandbox id's turn log, oldest first.
func (t *Tracker) Log(id string) ([]meta.TurnRecord, error) {
	var out []meta.TurnRecord
	err := t.cfg.DB.ForEachPrefix(meta.Turns, id+"/", func(_ string, b []byte) error {
		var tr meta.TurnRecord
		if err := meta.Unmarshal(b, &tr); err != nil {
			return err
		}
		out = append(out, tr)
		return nil
	})
	return out, err
}

// RecordLLM attaches an LLM call to the record of the turn it ended.
func (t *Tracker) RecordLLM(id string, turn int, c meta.LLMCall) error {
	if ts := t.of(id); ts != nil {
		// Waits for a turn end in progress to have written its record.
		ts.mu.Lock()
		defer ts.mu.Unlock()
	}
	return t.cfg.DB.Update(func(tx *meta.Tx) error {
		var tr meta.TurnRecord
		if err := tx.Get(meta.Turns, turnKey(id, turn), &tr); err != nil {
			return err
		}
		tr.LLM = append(tr.LLM, c)
		return tx.Put(meta.Turns, turnKey(id, turn), tr)
	})
}

// keepOutput bounds what the log keeps of each output stream of a
// command.
const keepOutput = 64 << 10

// Record appends a command to the sandbox's current turn.
func (t *Tracker) Record(id string, c meta.TurnCommand) {
	ts := t.of(id)
	if ts == nil {
		return
	}
	if len(c.Stdout) > keepOutput {
		c.Stdout, c.Truncated = c.Stdout[:keepOutput], true
	}
	if len(c.Stderr) > keepOutput {
		c.Stderr, c.Truncated = c.Stderr[:keepOutput], true
	}
	t.mu.Lock()
	ts.commands = append(ts.commands, c)
	t.mu.Unlock()
}

// Recording wraps an exec stream from init so that, when it is closed,
// the command, its output (the first 64 KiB of each stream) and its exit
// status are appended to the sandbox's turn log.
func (t *Tracker) Recording(id string, c net.Conn, args []string) net.Conn {
	return &recConn{Conn: c, t: t, id: id, cmd: meta.TurnCommand{Time: time.Now().UTC(), Args: args, ExitCode: -1}}
}

type recConn struct {
	net.Conn
	t    *Tracker
	id   string
	mu   sync.Mutex
	buf  []byte // an incomplete frame
	cmd  meta.TurnCommand
	once sync.Once
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.buf = append(c.buf, p[:n]...)
		c.parse()
		c.mu.Unlock()
	}
	return n, err
}

// parse consumes the complete frames in buf.
func (c *recConn) parse() {
	for len(c.buf) >= 5 {
		size := int(c.buf[1])<<24 | int(c.buf[2])<<16 | int(c.buf[3])<<8 | int(c.buf[4])
		if size > v1.MaxFrame {
			c.buf = nil // not a stream we understand: stop recording output
			return
		}
		if len(c.buf) < 5+size {
			return
		}
		typ, payload := c.buf[0], c.buf[5:5+size]
		switch typ {
		case v1.FrameStdout:
			if room := keepOutput - len(c.cmd.Stdout); room > 0 {
				c.cmd.Stdout += string(payload[:min(room, len(payload))])
			}
			c.cmd.Truncated = c.cmd.Truncated || len(c.cmd.Stdout) >= keepOutput
		case v1.FrameStderr:
			if room := keepOutput - len(c.cmd.Stderr); room > 0 {
				c.cmd.Stderr += string(payload[:min(room, len(payload))])
			}
			c.cmd.Truncated = c.cmd.Truncated || len(c.cmd.Stderr) >= keepOutput
		case v1.FrameExit:
			var st v1.ExitStatus
			if json.Unmarshal(payload, &st) == nil {
				c.cmd.ExitCode = st.ExitCode
			}
		}
		c.buf = c.buf[5+size:]
	}
}

func (c *recConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		cmd := c.cmd
		c.mu.Unlock()
		c.t.Record(c.id, cmd)
	})
	return c.Conn.Close()
}

// Current is the number of sandbox id's turn in progress: the one after
// its last logged turn.
func (t *Tracker) Current(id string) int { return t.lastTurn(id) + 1 }
