package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// Canon is the equivalence rule set for replay: what of a request is
// left out before two requests are compared. The zero value applies the
// defaults only.
type Canon struct {
	// IgnoreHeaders are header names (case-insensitive; a trailing "*"
	// matches a prefix) left out of HeaderHash in addition to
	// DefaultIgnoreHeaders.
	IgnoreHeaders []string
	// IgnoreJSONFields are object keys (exact) dropped at any depth
	// before a JSON body is hashed, e.g. "timestamp", "nonce". They are
	// dropped from form bodies too: the same fields appear there.
	IgnoreJSONFields []string
}

// IdempotencyHeaders carry a client's idempotency key; the first one
// present wins.
var IdempotencyHeaders = []string{"Idempotency-Key", "X-Idempotency-Key", "Idempotency-Token", "X-Request-Idempotency-Key"}

// DefaultIgnoreHeaders are left out of every HeaderHash: hop-by-hop
// headers, ones a client changes per attempt (dates, tracing, request
// IDs) and the idempotency headers, which Equivalent compares on their
// own.
var DefaultIgnoreHeaders = append([]string{
	"Date", "User-Agent", "Accept-Encoding", "Connection", "Content-Length",
	"Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Traceparent", "Tracestate", "X-Request-Id", "X-Amzn-Trace-Id",
	"X-B3-*", "Sentry-Trace", "Baggage", "Host",
}, IdempotencyHeaders...)

// HTTP builds the identity of an HTTP request. scheme is "http" or
// "https"; host is the Host header's value; body is the whole request
// body.
//
// The URL is canonical: lower-case scheme and host, the default port
// (80, 443) dropped, the path as sent (escaped form), query parameters
// sorted by key then value, no fragment. The body hash is of canonical
// JSON (keys sorted, ignored fields removed at any depth, numbers as
// their literal text) when the Content-Type is JSON and the body parses,
// of the sorted re-encoded form for a urlencoded form that parses, of
// the raw bytes otherwise; "" for an empty body.
func (c Canon) HTTP(scheme, method, host string, u *url.URL, header http.Header, body []byte) Identity {
	scheme = strings.ToLower(scheme)
	name, port := splitHost(host)
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	hostport := name
	if strings.Contains(name, ":") {
		hostport = "[" + name + "]"
	}
	if port != "" {
		hostport += ":" + port
	}
	path, query := "/", ""
	if u != nil {
		if u.Opaque != "" {
			path = u.Opaque
		} else if p := u.EscapedPath(); p != "" {
			path = p
		}
		query = sortedQuery(u.RawQuery, nil)
	}
	canonURL := scheme + "://" + hostport + path
	if query != "" {
		canonURL += "?" + query
	}
	return Identity{
		Proto:          scheme,
		Method:         method,
		URL:            canonURL,
		Host:           name,
		BodyHash:       c.bodyHash(header.Get("Content-Type"), body),
		HeaderHash:     c.headerHash(header),
		IdempotencyKey: idempotencyKey(header),
	}
}

// splitHost splits a Host header value into a lower-case name (IPv6
// without brackets) and a port ("" when absent).
func splitHost(host string) (name, port string) {
	host = strings.ToLower(strings.TrimSpace(host))
	if h, p, err := net.SplitHostPort(host); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ""
}

// sortedQuery re-encodes a query string (or form body) with its pairs
// sorted by key then value, leaving out the keys in drop. A pair whose
// escapes do not decode is kept as sent.
func sortedQuery(raw string, drop []string) string {
	if raw == "" {
		return ""
	}
	type pair struct{ k, v string }
	var pairs []pair
	for piece := range strings.SplitSeq(raw, "&") {
		if piece == "" {
			continue
		}
		k, v, _ := strings.Cut(piece, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if dv, err := url.QueryUnescape(v); err == nil {
			v = dv
		}
		if slices.Contains(drop, k) {
			continue
		}
		pairs = append(pairs, pair{k, v})
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		if c := strings.Compare(a.k, b.k); c != 0 {
			return c
		}
		return strings.Compare(a.v, b.v)
	})
	var sb strings.Builder
	for i, p := range pairs {
		if i > 0 {
			sb.WriteByte('&')
		}
		sb.WriteString(url.QueryEscape(p.k))
		sb.WriteByte('=')
		sb.WriteString(url.QueryEscape(p.v))
	}
	return sb.String()
}

func (c Canon) bodyHash(contentType string, body []byte) string {
	if len(body) == 0 {
		return ""
	}
	canon := body
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		if j, ok := canonicalJSON(body, c.IgnoreJSONFields); ok {
			canon = j
		}
	case mt == "application/x-www-form-urlencoded":
		// ParseQuery decides whether it is a form at all; sortedQuery
		// then keeps every pair, repeated keys included.
		if _, err := url.ParseQuery(string(body)); err == nil {
			canon = []byte(sortedQuery(string(body), c.IgnoreJSONFields))
		}
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

// canonicalJSON re-encodes one JSON value with object keys sorted, the
// keys in drop removed at every depth and numbers kept as written. A
// body that is not exactly one valid UTF-8 JSON value is not JSON.
func canonicalJSON(body []byte, drop []string) ([]byte, bool) {
	if !utf8.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	v = dropFields(v, drop)
	// Marshal sorts map keys and writes json.Number as its literal.
	out, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	return out, true
}

func dropFields(v any, drop []string) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if slices.Contains(drop, k) {
				delete(t, k)
				continue
			}
			t[k] = dropFields(e, drop)
		}
	case []any:
		for i, e := range t {
			t[i] = dropFields(e, drop)
		}
	}
	return v
}

// ignored reports whether header name is left out by patterns
// (case-insensitive, "*" suffix for a prefix).
func ignored(name string, patterns []string) bool {
	for _, p := range patterns {
		if pre, ok := strings.CutSuffix(p, "*"); ok {
			if len(name) >= len(pre) && strings.EqualFold(name[:len(pre)], pre) {
				return true
			}
		} else if strings.EqualFold(name, p) {
			return true
		}
	}
	return false
}

// headerHash hashes every header not ignored: names lower-cased and
// sorted, each name's values in the order sent. "" when none is left.
func (c Canon) headerHash(header http.Header) string {
	keys := make([]string, 0, len(header))
	for k := range header {
		if !ignored(k, DefaultIgnoreHeaders) && !ignored(k, c.IgnoreHeaders) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	// Sorting by the lower-cased name (then the name as given, for a map
	// holding two spellings of one name) makes the order deterministic.
	slices.SortFunc(keys, func(a, b string) int {
		if c := strings.Compare(strings.ToLower(a), strings.ToLower(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	field := func(s string) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		io.WriteString(h, s)
	}
	for _, k := range keys {
		for _, v := range header[k] {
			field(strings.ToLower(k))
			field(strings.TrimSpace(v))
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

func idempotencyKey(header http.Header) string {
	for _, name := range IdempotencyHeaders {
		for k, vs := range header {
			if strings.EqualFold(k, name) && len(vs) > 0 {
				if v := strings.TrimSpace(vs[0]); v != "" {
					return v
				}
			}
		}
	}
	return ""
}

// Equivalent reports whether a and b are the same effect: the same
// protocol (http and https are distinct), Method, URL, Host, BodyHash and
// HeaderHash (and Addr, for records without a URL: a connection's
// identity is where it went); or both carry the same non-empty
// IdempotencyKey with the same protocol, Method, Host and URL up to its
// query (query and body may differ).
func Equivalent(a, b Identity) bool {
	return canonKey(a) == canonKey(b) ||
		(a.IdempotencyKey != "" && idemKey(a) == idemKey(b))
}

// canonKey is the index key of the first rule of Equivalent.
func canonKey(id Identity) string {
	addr := ""
	if id.URL == "" {
		addr = id.Addr
	}
	return strings.Join([]string{strings.ToLower(id.Proto), id.Method, id.URL, id.Host, addr, id.BodyHash, id.HeaderHash}, "\x00")
}

// idemKey is the index key of the second rule; "" without a key.
func idemKey(id Identity) string {
	if id.IdempotencyKey == "" {
		return ""
	}
	u, _, _ := strings.Cut(id.URL, "?")
	return strings.Join([]string{strings.ToLower(id.Proto), id.Method, u, id.Host, id.IdempotencyKey}, "\x00")
}
