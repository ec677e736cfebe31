package ledger

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/molt-sh/molt/internal/secret"
)

// Secret hygiene of the ledger files (docs/security.md, "Secret
// hygiene").
//
// What a record may carry of a credential is its payload: the URL (a
// query's token), the response (headers such as Set-Cookie, the body),
// the compensator (an Authorization header it must send) and the error
// text. The ledger needs them exact in memory: a replay answers the
// sandbox with the recorded body, a compensator sends its headers, and
// requests match on the exact URL. So a line keeps the payload redacted
// in the clear and exact only sealed (the entry's Sealed, with the
// sandbox's tenant key, bound to the sandbox, the op and the record ID):
// sealed when redaction changed it, and always when encryption at rest
// is on, when the clear keeps only the redacted URL and error and the
// response's status and sizes. Loading opens the sealed payload; one
// that does not open (its tenant's key shredded) leaves the sandbox's
// ledger refusing every call, with the reason (Broken).
//
// The line's checksum covers the line as stored (the sealed bytes), so
// damage is found without any key. The audit log's hash chain covers
// the entries OnAppend gives it, which are redacted views of the records
// (View): the chain stays verifiable after a tenant's key is shredded,
// and holds no credential to shred.

// codec protects the lines of one sandbox's file; a nil vault stores
// them as they are.
type codec struct {
	sb string
	v  *secret.Vault
}

// payload is the part of an entry sealed.
type payload struct {
	URL         string       `json:"url,omitempty"`
	Response    *Response    `json:"response,omitempty"`
	Compensator *Compensator `json:"compensator,omitempty"`
	Error       string       `json:"error,omitempty"`
}

func (c codec) aad(e entry) []byte {
	id := e.ID
	if e.Op == opRec && e.Rec != nil {
		id = e.Rec.ID
	}
	return []byte("molt ledger v1\x00" + c.sb + "\x00" + e.Op + "\x00" + id)
}

// payloadOf returns e's payload (ok false: e has none to protect).
func payloadOf(e entry) (payload, bool) {
	switch e.Op {
	case opRec:
		if e.Rec == nil {
			return payload{}, false
		}
		return payload{URL: e.Rec.Request.URL, Response: e.Rec.Response, Compensator: e.Rec.Compensator, Error: e.Rec.Error}, true
	case opFin:
		return payload{Response: e.Response, Error: e.Error}, true
	case opUndo:
		return payload{Compensator: e.Compensator}, true
	}
	return payload{}, false
}

// setPayload puts p into e (a copy of the record for opRec).
func setPayload(e *entry, p payload) {
	switch e.Op {
	case opRec:
		r := *e.Rec
		r.Request.URL, r.Response, r.Compensator, r.Error = p.URL, p.Response, p.Compensator, p.Error
		e.Rec = &r
	case opFin:
		e.Response, e.Error = p.Response, p.Error
	case opUndo:
		e.Compensator = p.Compensator
	}
}

// encode returns e as a line of the file, its payload protected.
func (c codec) encode(e entry) ([]byte, error) {
	if c.v == nil {
		return encodeLine(e)
	}
	if e.Op == opComp && e.Compensation != nil && e.Compensation.Error != "" {
		// An attempt's error may quote the compensator's URL; it is only
		// read, never replayed: kept redacted.
		cp := *e.Compensation
		cp.Error = c.v.Redact(c.sb, cp.Error)
		e.Compensation = &cp
	}
	exact, ok := payloadOf(e)
	if !ok {
		return encodeLine(e)
	}
	shown := redactPayload(c.v, c.sb, exact)
	xj, err := json.Marshal(exact)
	if err != nil {
		return nil, err
	}
	sj, err := json.Marshal(shown)
	if err != nil {
		return nil, err
	}
	whole := c.v.Whole()
	if !whole && bytes.Equal(xj, sj) {
		return encodeLine(e)
	}
	if e.Sealed, err = c.v.Seal(c.sb, xj, c.aad(e)); err != nil {
		return nil, fmt.Errorf("ledger: seal: %w", err)
	}
	if whole {
		shown = payload{URL: shown.URL, Error: shown.Error, Response: summary(shown.Response)}
	}
	setPayload(&e, shown)
	return encodeLine(e)
}

// summary is what the clear keeps of a response with encryption at rest.
func summary(r *Response) *Response {
	if r == nil {
		return nil
	}
	return &Response{Status: r.Status, BodySize: r.BodySize, BodyHash: r.BodyHash, Truncated: r.Truncated, BytesOut: r.BytesOut, BytesIn: r.BytesIn}
}

// open restores e's exact payload from its sealed one.
func (c codec) open(e *entry) error {
	if len(e.Sealed) == 0 {
		return nil
	}
	if _, ok := payloadOf(*e); !ok {
		return fmt.Errorf("a sealed payload on a %q line", e.Op)
	}
	if c.v == nil {
		return fmt.Errorf("sealed payload, and no keys to open it")
	}
	plain, err := c.v.Open(c.sb, e.Sealed, c.aad(*e))
	if err != nil {
		return err
	}
	var p payload
	if err := json.Unmarshal(plain, &p); err != nil {
		return fmt.Errorf("sealed payload: %w", err)
	}
	setPayload(e, p)
	e.Sealed = nil
	return nil
}

// encodeState writes st as the lines of a new file: every record in its
// latest state, then the head.
func (c codec) encodeState(st *state) ([]byte, error) {
	var buf bytes.Buffer
	for _, r := range st.recs {
		line, err := c.encode(entry{Op: opRec, Rec: r})
		if err != nil {
			return nil, err
		}
		buf.Write(line)
	}
	head := st.head
	line, err := encodeLine(entry{Op: opHead, Head: &head})
	if err != nil {
		return nil, err
	}
	buf.Write(line)
	return buf.Bytes(), nil
}

// redactPayload returns p with sb's secrets and credentials redacted.
func redactPayload(v *secret.Vault, sb string, p payload) payload {
	return payload{URL: v.Redact(sb, p.URL), Response: redactResponse(v, sb, p.Response),
		Compensator: redactCompensator(v, sb, p.Compensator), Error: v.Redact(sb, p.Error)}
}

func redactHeader(v *secret.Vault, sb string, h map[string][]string) map[string][]string {
	if h == nil {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, vals := range h {
		l := make([]string, len(vals))
		for i, x := range vals {
			if secret.SensitiveHeader(k) {
				l[i] = secret.Mark
			} else {
				l[i] = v.Redact(sb, x)
			}
		}
		out[k] = l
	}
	return out
}

func redactBytes(v *secret.Vault, sb string, b []byte) []byte {
	if len(b) == 0 {
		return b
	}
	if r := v.Redact(sb, string(b)); r != string(b) {
		return []byte(r)
	}
	return b
}

func redactResponse(v *secret.Vault, sb string, r *Response) *Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = redactHeader(v, sb, r.Header)
	c.Body = redactBytes(v, sb, r.Body)
	return &c
}

func redactCompensator(v *secret.Vault, sb string, r *Compensator) *Compensator {
	if r == nil {
		return nil
	}
	c := *r
	c.URL = v.Redact(sb, r.URL)
	c.Header = redactHeader(v, sb, r.Header)
	c.Body = redactBytes(v, sb, r.Body)
	if r.Command != nil {
		c.Command = make([]string, len(r.Command))
		for i, a := range r.Command {
			c.Command[i] = v.Redact(sb, a)
		}
	}
	return &c
}

// View returns r as it may be shown (the API, exports, the audit log):
// its payload redacted. r itself is not changed.
func (l *Ledger) View(r Record) Record {
	if l.vault == nil {
		return r
	}
	p := redactPayload(l.vault, r.Sandbox, payload{URL: r.Request.URL, Response: r.Response, Compensator: r.Compensator, Error: r.Error})
	r.Request.URL, r.Response, r.Compensator, r.Error = p.URL, p.Response, p.Compensator, p.Error
	if r.Compensation != nil && r.Compensation.Error != "" {
		cp := *r.Compensation
		cp.Error = l.vault.Redact(r.Sandbox, cp.Error)
		r.Compensation = &cp
	}
	return r
}
