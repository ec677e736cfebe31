package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Entry kinds.
const (
	KindAPI     = "api"     // an API request
	KindEffect  = "effect"  // an effect-ledger record appended or finished
	KindSegment = "segment" // the first entry of a segment started after damage
)

// Actor is who made an API request: the peer of the daemon's unix socket
// (SO_PEERCRED at connect time).
type Actor struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	PID int32  `json:"pid"`
	// Tenant and Token name a request made with a tenant's token (the
	// TCP listener); the peer's ids are then zero.
	Tenant string `json:"tenant,omitempty"`
	Token  string `json:"token,omitempty"`
}

// Entry is one line of the log. Strings are bounded (maxField bytes,
// printable UTF-8) before they are written, so a line is bounded too.
type Entry struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Prev string    `json:"prev"`
	Kind string    `json:"kind"`

	// API requests.
	Actor      *Actor `json:"actor,omitempty"`
	Route      string `json:"route,omitempty"` // the matched pattern: "POST /v1/sandboxes/{id}/rollback"
	Path       string `json:"path,omitempty"`  // the request's path, only when no route matched
	Sandbox    string `json:"sandbox,omitempty"`
	Checkpoint string `json:"checkpoint,omitempty"`
	Effect     string `json:"effect,omitempty"` // an effect's ID (API target, or the ledger record)
	Image      string `json:"image,omitempty"`
	Session    string `json:"session,omitempty"`
	Status     int    `json:"status,omitempty"` // HTTP status; 101 for a streaming exec
	Error      string `json:"error,omitempty"`  // the error kind (api/v1 ErrKind)
	DurationUS int64  `json:"duration_us,omitempty"`

	// Effect-ledger records (Sandbox and Effect above too).
	EffectKind string `json:"effect_kind,omitempty"` // read, effect, opaque
	State      string `json:"state,omitempty"`
	Method     string `json:"method,omitempty"`
	Host       string `json:"host,omitempty"`
	URLPath    string `json:"url_path,omitempty"` // never the query

	Note string `json:"note,omitempty"`

	Hash string `json:"hash,omitempty"`
}

const (
	// MaxLine bounds a line of the log, newline included.
	MaxLine = 8 << 10
	// maxField bounds each string of an Entry (Note: maxNote).
	maxField = 256
	maxNote  = 1024

	hashSuffixLen = len(`,"hash":"`) + 64 + len(`"}`)
)

// ZeroHash is the prev of a segment's first entry.
var ZeroHash = strings.Repeat("0", 64)

// clean bounds s to n bytes of printable UTF-8: other bytes become '?'
// (a path or host from a sandbox is not trusted to be text).
func clean(s string, n int) string {
	ok := len(s) <= n
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] >= 0x20 && s[i] < 0x7f
	}
	if ok {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > n {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (e *Entry) bound() {
	for _, p := range []*string{&e.Kind, &e.Route, &e.Path, &e.Sandbox, &e.Checkpoint, &e.Effect, &e.Image,
		&e.Session, &e.Error, &e.EffectKind, &e.State, &e.Method, &e.Host, &e.URLPath} {
		*p = clean(*p, maxField)
	}
	e.Note = clean(e.Note, maxNote)
}

// encode returns e (Seq and Prev set, Hash ignored) as a line of the log
// and its hash.
func encode(e Entry) ([]byte, string, error) {
	e.Hash = ""
	prev, err := hex.DecodeString(e.Prev)
	if err != nil || len(prev) != sha256.Size {
		return nil, "", fmt.Errorf("audit: prev %q is not a SHA-256", e.Prev)
	}
	body, err := json.Marshal(e)
	if err != nil {
		return nil, "", err
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(body)
	sum := hex.EncodeToString(h.Sum(nil))
	line := make([]byte, 0, len(body)+hashSuffixLen)
	line = append(line, body[:len(body)-1]...)
	line = append(line, `,"hash":"`...)
	line = append(line, sum...)
	line = append(line, "\"}\n"...)
	if len(line) > MaxLine {
		return nil, "", fmt.Errorf("audit: entry of %d bytes over the limit of %d", len(line), MaxLine)
	}
	return line, sum, nil
}

// decode parses one line (without its newline) and checks its own hash;
// the chain (seq, prev) is the caller's to check.
func decode(line []byte) (Entry, error) {
	var e Entry
	if len(line) > MaxLine {
		return e, fmt.Errorf("line of %d bytes over the limit of %d", len(line), MaxLine)
	}
	n := len(line) - hashSuffixLen
	if n < 1 || !bytes.HasPrefix(line[n:], []byte(`,"hash":"`)) || !bytes.HasSuffix(line, []byte(`"}`)) {
		return e, errors.New(`not an audit line (no trailing "hash" member)`)
	}
	sum := string(line[n+len(`,"hash":"`) : len(line)-2])
	if !isHex(sum) {
		return e, errors.New("hash is not 64 lower-case hex digits")
	}
	body := append(line[:n:n], '}')
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&e); err != nil {
		return e, fmt.Errorf("not JSON: %v", err)
	}
	if dec.More() {
		return e, errors.New("data after the JSON object")
	}
	if e.Hash != "" {
		return e, errors.New(`a second "hash" member`)
	}
	prev, err := hex.DecodeString(e.Prev)
	if err != nil || len(prev) != sha256.Size || !isHex(e.Prev) {
		return e, errors.New("prev is not 64 lower-case hex digits")
	}
	h := sha256.New()
	h.Write(prev)
	h.Write(body)
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return e, fmt.Errorf("hash mismatch: the line says %s, its content hashes to %s", short(sum), short(got))
	}
	e.Hash = sum
	return e, nil
}

func isHex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && (s[i] < 'a' || s[i] > 'f') {
			return false
		}
	}
	return true
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
