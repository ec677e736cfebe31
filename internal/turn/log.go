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

func turnKey(id string, n int) string { return meta.TurnKey(id, n) }

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
	if err := t.protectCommands(&tr); err != nil {
		// The exact text is never stored in the clear: keep the
		// redacted text only, and the turn cannot be replayed.
		v := t.vaultOf()
		for i := range tr.Commands {
			c := &tr.Commands[i]
			x := commandText{Command: c.Command, Args: c.Args, Stdout: c.Stdout, Stderr: c.Stderr}.redact(v, tr.Sandbox)
			c.Command, c.Args, c.Stdout, c.Stderr = x.Command, x.Args, x.Stdout, x.Stderr
		}
		tr.SealedCommands = nil
		tr.Incomplete = "its commands' exact text could not be sealed: " + err.Error()
		t.cfg.Log.Warn("turn's commands not sealed; kept redacted only", "sandbox", tr.Sandbox, "turn", tr.Turn, "err", err)
	}
	if err := t.cfg.DB.Put(meta.Turns, turnKey(tr.Sandbox, tr.Turn), tr); err != nil {
		t.cfg.Log.Warn("turn not recorded", "sandbox", tr.Sandbox, "turn", tr.Turn, "err", err)
	}
}

// Log lists sandbox id's turn log, oldest first, as it is shown:
// redacted. A record whose sealed text cannot be opened (its tenant's key
// was shredded) is an error.
func (t *Tracker) Log(id string) ([]meta.TurnRecord, error) { return t.log(id, false) }

// ExactLog is Log with the exact text a recovery replays.
func (t *Tracker) ExactLog(id string) ([]meta.TurnRecord, error) { return t.log(id, true) }

// Stored lists the records as stored (sealed items unopened, the clear
// fields redacted or empty): for what needs only their numbers, heads
// and links.
func (t *Tracker) Stored(id string) ([]meta.TurnRecord, error) { return t.rawLog(id) }

// rawLog lists the records as stored (sealed items unopened).
func (t *Tracker) rawLog(id string) ([]meta.TurnRecord, error) {
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

func (t *Tracker) log(id string, exact bool) ([]meta.TurnRecord, error) {
	out, err := t.rawLog(id)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if err := t.reveal(&out[i], exact); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// limit is sandbox id's recording limit.
func (t *Tracker) limit(id string) int64 {
	if t.cfg.RecordLimit != nil {
		if n := t.cfg.RecordLimit(id); n > 0 {
			return n
		}
	}
	return DefaultRecordLimit
}

// charge counts n more bytes against sandbox id's recording limit, and
// reports false (counting nothing) when they do not fit.
func (t *Tracker) charge(id string, n int64) bool {
	t.mu.Lock()
	used, ok := t.usage[id]
	t.mu.Unlock()
	if !ok {
		used = t.logBytes(id)
	}
	lim := t.limit(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.usage[id]; ok {
		used = cur
	}
	if used+n > lim {
		t.usage[id] = used
		return false
	}
	t.usage[id] = used + n
	return true
}

// refund gives back n bytes counted against sandbox id's limit.
func (t *Tracker) refund(id string, n int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if u, ok := t.usage[id]; ok {
		t.usage[id] = max(u-n, 0)
	}
}

// logBytes is what sandbox id's turn log holds of outputs and LLM
// exchanges.
func (t *Tracker) logBytes(id string) int64 {
	var n int64
	recs, _ := t.rawLog(id)
	for _, tr := range recs {
		n += storedBytes(tr)
	}
	return n
}

// keepRequest bounds the recorded copy of an LLM request: its identity
// (a hash of the whole) is what a fast-forward matches; the copy is for
// reading.
const keepRequest = 1 << 20

// RecordLLM attaches an LLM call to the record of the turn it ended. It
// writes before it returns (the turn log is the record a recovery
// replays): the caller lets the agent see the end of the reply only
// then. A call that does not fit the sandbox's recording limit is kept
// cut, and its turn cannot be replayed.
func (t *Tracker) RecordLLM(id string, turn int, c meta.LLMCall) error {
	if len(c.Request) > keepRequest {
		c.Request, c.RequestTruncated = c.Request[:keepRequest], true
	}
	incomplete := ""
	if !t.charge(id, int64(len(c.Request)+len(c.Response))) {
		c.Request, c.RequestTruncated = clipString(c.Request, keepOutput)
		c.Response, c.ResponseTruncated = clipString(c.Response, keepOutput)
		incomplete = fmt.Sprintf("LLM call %d's response was cut: the sandbox's recording limit of %d bytes was reached", c.ID, t.limit(id))
	}
	sealed, err := t.protectLLM(id, turn, &c)
	if err != nil {
		// Never the exact bodies in the clear: keep them redacted only.
		x := llmText{Request: c.Request, Response: c.Response}.redact(t.vaultOf(), id)
		c.Request, c.Response, sealed = x.Request, x.Response, nil
		incomplete = fmt.Sprintf("LLM call %d's exact bodies could not be sealed: %v", c.ID, err)
	}
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
		if sealed != nil || tr.SealedLLM != nil {
			for len(tr.SealedLLM) < len(tr.LLM) {
				tr.SealedLLM = append(tr.SealedLLM, nil)
			}
			tr.SealedLLM = append(tr.SealedLLM, sealed)
		}
		tr.LLM = append(tr.LLM, c)
		if incomplete != "" && tr.Incomplete == "" {
			tr.Incomplete = incomplete
		}
		return tx.Put(meta.Turns, turnKey(id, turn), tr)
	})
}

// keepOutput is what the log keeps of each output of a command or LLM
// call that does not fit the sandbox's recording limit (for reading;
// such a turn cannot be replayed).
const keepOutput = 64 << 10

func clipString(s string, n int) (string, bool) {
	if len(s) > n {
		return s[:n], true
	}
	return s, false
}

// Record appends a command to the sandbox's current turn. The output is
// kept whole while the sandbox's recording limit allows; past it, cut
// (Cut), and the turn cannot be replayed.
func (t *Tracker) Record(id string, c meta.TurnCommand) {
	t.record1(id, c, false)
}

// record1 is Record; charged says the output was counted against the
// limit already.
func (t *Tracker) record1(id string, c meta.TurnCommand, charged bool) {
	ts := t.of(id)
	if ts == nil {
		return
	}
	if !charged && !c.Cut && !t.charge(id, int64(len(c.Stdout)+len(c.Stderr))) {
		c.Cut = true
	}
	if c.Cut {
		c.Stdout, _ = clipString(c.Stdout, keepOutput)
		c.Stderr, _ = clipString(c.Stderr, keepOutput)
	}
	t.learn(id, c)
	t.mu.Lock()
	ts.commands = append(ts.commands, c)
	t.mu.Unlock()
}

// Recording wraps an exec stream from init so that, when it is closed,
// the command (cmd: its request), its output, PID, run time and exit
// status are appended to the sandbox's turn log.
func (t *Tracker) Recording(id string, c net.Conn, cmd meta.TurnCommand) net.Conn {
	cmd.ExitCode = -1
	return &recConn{Conn: c, t: t, id: id, cmd: cmd, began: time.Now()}
}

type recConn struct {
	net.Conn
	t   *Tracker
	id  string
	mu  sync.Mutex
	buf []byte // an incomplete frame
	cmd meta.TurnCommand
	// The output so far. Each frame is counted against the sandbox's
	// limit as it comes (charged), so that what the daemon holds of a
	// sandbox's outputs, however many commands run at once, stays within
	// it; once a frame does not fit, the command is cut and only the
	// first keepOutput bytes of each stream are kept.
	stdout, stderr []byte
	charged        int64
	began          time.Time
	once           sync.Once
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
		case v1.FrameStarted:
			c.cmd.Pid, _ = strconv.Atoi(string(payload))
		case v1.FrameStdout:
			c.stdout = c.keepOut(c.stdout, payload)
		case v1.FrameStderr:
			c.stderr = c.keepOut(c.stderr, payload)
		case v1.FrameExit:
			var st v1.ExitStatus
			if json.Unmarshal(payload, &st) == nil {
				c.cmd.ExitCode, c.cmd.Signal, c.cmd.TimedOut = st.ExitCode, st.Signal, st.TimedOut
			}
			c.cmd.DurationMS = ms(time.Since(c.began))
		}
		c.buf = c.buf[5+size:]
	}
}

// keepOut appends p to out while the sandbox's recording limit allows.
func (c *recConn) keepOut(out, p []byte) []byte {
	if !c.cmd.Cut && c.t.charge(c.id, int64(len(p))) {
		c.charged += int64(len(p))
		return append(out, p...)
	}
	if !c.cmd.Cut {
		c.cmd.Cut = true
		// What is kept from here on is only for reading: give back
		// what was counted.
		c.t.refund(c.id, c.charged)
		c.charged = 0
		c.stdout, _ = clipBytes(c.stdout, keepOutput)
		c.stderr, _ = clipBytes(c.stderr, keepOutput)
		if len(out) > keepOutput {
			out = out[:keepOutput]
		}
	}
	if room := keepOutput - len(out); room > 0 {
		out = append(out, p[:min(room, len(p))]...)
	}
	return out
}

func clipBytes(b []byte, n int) ([]byte, bool) {
	if len(b) > n {
		return b[:n], true
	}
	return b, false
}

func (c *recConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		cmd := c.cmd
		cmd.Stdout, cmd.Stderr = string(c.stdout), string(c.stderr)
		c.mu.Unlock()
		c.t.record1(c.id, cmd, true)
	})
	return c.Conn.Close()
}

// DeleteTurns deletes turns ns of sandbox id's log. The usage it counts
// is counted again on next use.
func (t *Tracker) DeleteTurns(id string, ns []int) error {
	err := t.cfg.DB.Update(func(tx *meta.Tx) error {
		for _, n := range ns {
			if err := tx.Delete(meta.Turns, turnKey(id, n)); err != nil {
				return err
			}
		}
		return nil
	})
	t.mu.Lock()
	delete(t.usage, id)
	t.mu.Unlock()
	return err
}

// PrevOf is the turn sandbox id's current turn continues (its last
// logged turn when it has no turn state).
func (t *Tracker) PrevOf(id string) int {
	t.mu.Lock()
	ts := t.m[id]
	var p int
	if ts != nil {
		p = ts.prev
	}
	t.mu.Unlock()
	if ts == nil {
		return t.lastTurn(id)
	}
	return p
}

// Current is the number of sandbox id's turn in progress: the one after
// its last logged turn.
func (t *Tracker) Current(id string) int { return t.lastTurn(id) + 1 }
