// Package secret keeps credentials out of what molt stores in the
// clear: it redacts what looks like one from the text of the turn log
// and the effect ledger, and seals (internal/keys) what must be kept
// exact (the bytes a recovery replays, a compensator's headers) under
// the sandbox's tenant key.
//
// What is a credential: the values matching the patterns (DefaultPatterns
// and the daemon's --redact), the exact values of the sandbox's declared
// secrets and of its environment variables whose names look secret
// (SecretName), and the values the sandbox's own commands assign to such
// names (`export DB_PASSWORD=...`), learned as the commands are recorded.
// A value learned later does not reach records written before it.
//
// docs/security.md ("Secret hygiene") has the whole design.
package secret

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Mark replaces what is redacted.
const Mark = "[REDACTED]"

// minValue is the shortest exact value redacted: shorter ones ("1",
// "no") would blank half of every output.
const minValue = 4

// Pattern is a credential's regular expression. A pattern with a group
// named "v" has only that group replaced (the name or header it follows
// stays readable); otherwise the whole match is.
//
// Go's regexp scans a few MB/s with expressions like these, and an LLM
// request of a MiB waits for its record: so the built-in patterns are
// matched only where they can start. Anchors are lower-case strings
// where a match starts (or, with Starts, the nearest of those bytes at
// most Back bytes before, across name characters); the expression then
// runs anchored there, over at most Span bytes. A pattern without
// anchors (--redact) scans the whole text.
type Pattern struct {
	Expr    string
	Anchors []string
	// Boundary: the byte before the match is not a word character.
	Boundary bool
	Starts   string
	Back     int
	Span     int
	// Words: a match whose replaced part is a number or a JSON literal
	// is no credential ("max_tokens": 1024).
	Words bool
}

// DefaultPatterns are the credentials redacted everywhere.
var DefaultPatterns = []Pattern{
	// AWS access key IDs.
	{Expr: `(?:AKIA|ASIA)[0-9A-Z]{16}\b`, Anchors: []string{"akia", "asia"}, Boundary: true},
	// HTTP credentials.
	{Expr: `(?i)(?:Bearer|Basic|Token)\s+(?P<v>[A-Za-z0-9._~+/=-]{8,})`, Anchors: []string{"bearer", "basic", "token"}, Boundary: true},
	// API keys of the usual providers: OpenAI and Anthropic (sk-...),
	// GitHub, GitLab, Slack, Google, Stripe.
	{Expr: `sk-[A-Za-z0-9_-]{16,}`, Anchors: []string{"sk-"}, Boundary: true},
	{Expr: `(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,})`,
		Anchors: []string{"ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-"}, Boundary: true},
	{Expr: `xox[abprs]-[A-Za-z0-9-]{10,}`, Anchors: []string{"xox"}, Boundary: true},
	{Expr: `AIza[0-9A-Za-z_-]{35}\b`, Anchors: []string{"aiza"}, Boundary: true},
	{Expr: `[rs]k_(?:live|test)_[A-Za-z0-9]{16,}`, Anchors: []string{"rk_live_", "sk_live_", "rk_test_", "sk_test_"}, Boundary: true},
	// PEM private keys, whole.
	{Expr: `-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`, Anchors: []string{"-----begin"}, Span: 64 << 10},
	// Assignments to secret-looking names: PASSWORD=..., "api_key": "...",
	// --token=..., aws_secret_access_key = ...
	{Expr: `(?i)(?:passw(?:or)?d|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?)[A-Za-z0-9_.-]*["']?\s*[=:]\s*["']?(?P<v>[^\s"'&;,}]{3,})`,
		Anchors: []string{"passw", "secret", "token", "api_key", "api-key", "apikey", "access_key", "access-key", "accesskey", "private_key", "private-key", "privatekey", "credential"}, Words: true},
	// Query parameters and URL user information.
	{Expr: `(?i)[?&][A-Za-z0-9_.-]*(?:token|key|secret|passw|sig|auth|code)[A-Za-z0-9_.-]*=(?P<v>[^&#\s"']+)`,
		Anchors: []string{"token", "key", "secret", "passw", "sig", "auth", "code"}, Starts: "?&", Back: 64},
	{Expr: `://[^/\s:@]+:(?P<v>[^@/\s]+)@`, Anchors: []string{"://"}, Span: 1 << 10},
}

// secretName matches environment variable names whose values are
// treated as secrets.
var secretName = regexp.MustCompile(`(?i)(PASSW|SECRET|TOKEN|KEY|CREDENTIAL|AUTH)`)

// SecretName reports whether an environment variable named name holds a
// secret by its name (*PASSWORD*, *TOKEN*, *SECRET*, *KEY*, ...).
func SecretName(name string) bool { return secretName.MatchString(name) }

// assignment finds NAME=VALUE in shell text, the value quoted or not.
var assignment = regexp.MustCompile(`\b([A-Za-z_][A-Za-z0-9_]*)=("[^"\n]*"|'[^'\n]*'|[^\s;&|'"]+)`)

// Assigned returns the values text assigns to secret-looking names.
func Assigned(text string) []string {
	var out []string
	for _, m := range assignment.FindAllStringSubmatch(text, -1) {
		if !SecretName(m[1]) {
			continue
		}
		v := strings.Trim(m[2], `"'`)
		if len(v) >= minValue {
			out = append(out, v)
		}
	}
	return out
}

// Redactor replaces credentials in text. Its zero value redacts only
// the values it is given.
type Redactor struct {
	patterns []pattern
}

type pattern struct {
	Pattern
	re *regexp.Regexp // anchored at the start (^) when the pattern has anchors
	v  int            // the index of group "v", or -1
}

// defaultSpan bounds a match past its anchor when the pattern does not.
const defaultSpan = 4 << 10

// NewRedactor returns a redactor of DefaultPatterns and extra (Go
// regular expressions; a group named "v" limits what is replaced).
func NewRedactor(extra []string) (*Redactor, error) {
	ps := append([]Pattern(nil), DefaultPatterns...)
	for _, e := range extra {
		ps = append(ps, Pattern{Expr: e})
	}
	r := &Redactor{}
	for _, p := range ps {
		expr := p.Expr
		if len(p.Anchors) > 0 {
			expr = `^(?:` + expr + `)`
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("redaction pattern %q: %w", p.Expr, err)
		}
		if p.Span == 0 {
			p.Span = defaultSpan
		}
		r.patterns = append(r.patterns, pattern{Pattern: p, re: re, v: re.SubexpIndex("v")})
	}
	return r, nil
}

// span is a range of bytes to replace.
type span struct{ lo, hi int }

// Redact returns s with values and every pattern's matches replaced by
// Mark. Ranges are found on s as given, then replaced together.
func (r *Redactor) Redact(s string, values []string) string {
	if s == "" {
		return s
	}
	var out []span
	for _, v := range values {
		if len(v) < minValue {
			continue
		}
		for i := 0; ; {
			j := strings.Index(s[i:], v)
			if j < 0 {
				break
			}
			out = append(out, span{i + j, i + j + len(v)})
			i += j + len(v)
		}
	}
	if r != nil {
		var lower string
		for _, p := range r.patterns {
			if len(p.Anchors) == 0 {
				out = p.find(s, 0, out)
				continue
			}
			if lower == "" {
				lower = asciiLower(s)
			}
			out = p.anchored(s, lower, out)
		}
	}
	if len(out) == 0 {
		return s
	}
	return replaceSpans(s, out)
}

// anchored appends the ranges to replace of p's matches that start at
// its anchors in s (lower is s lowered).
func (p pattern) anchored(s, lower string, out []span) []span {
	for _, a := range p.Anchors {
		for i := 0; ; {
			j := strings.Index(lower[i:], a)
			if j < 0 {
				break
			}
			at := i + j
			i = at + len(a)
			start, ok := p.start(s, at)
			if !ok || (p.Boundary && start > 0 && isWord(s[start-1])) {
				continue
			}
			end := min(at+len(a)+p.Span, len(s))
			m := p.re.FindStringSubmatchIndex(s[start:end])
			if m == nil {
				continue
			}
			if x, ok := p.replaced(s[start:end], m); ok {
				out = append(out, span{start + x.lo, start + x.hi})
				i = max(i, start+m[1])
			}
		}
	}
	return out
}

// start is where a match of p found by the anchor at at starts.
func (p pattern) start(s string, at int) (int, bool) {
	if p.Starts == "" {
		return at, true
	}
	for k := at - 1; k >= 0 && k >= at-p.Back; k-- {
		c := s[k]
		if strings.IndexByte(p.Starts, c) >= 0 {
			return k, true
		}
		if !isWord(c) && c != '.' && c != '-' {
			return 0, false
		}
	}
	return 0, false
}

func isWord(c byte) bool {
	return c == '_' || ('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

// find appends the ranges to replace of p's matches in s, which starts
// at off.
func (p pattern) find(s string, off int, out []span) []span {
	for _, m := range p.re.FindAllStringSubmatchIndex(s, -1) {
		if x, ok := p.replaced(s, m); ok {
			out = append(out, span{off + x.lo, off + x.hi})
		}
	}
	return out
}

// replaced is the part of match m of s to replace.
func (p pattern) replaced(s string, m []int) (span, bool) {
	lo, hi := m[0], m[1]
	if p.v >= 0 {
		lo, hi = m[2*p.v], m[2*p.v+1]
	}
	if lo < 0 || hi <= lo || (p.Words && literal(s[lo:hi])) {
		return span{}, false
	}
	return span{lo, hi}, true
}

// literal reports whether v is a number or a JSON literal.
func literal(v string) bool {
	switch v {
	case "true", "false", "null":
		return true
	}
	return strings.Trim(v, "0123456789.-") == ""
}

func mergeSpans(l []span) []span {
	if len(l) < 2 {
		return l
	}
	sort.Slice(l, func(i, j int) bool { return l[i].lo < l[j].lo })
	out := l[:1]
	for _, x := range l[1:] {
		last := &out[len(out)-1]
		if x.lo <= last.hi {
			last.hi = max(last.hi, x.hi)
			continue
		}
		out = append(out, x)
	}
	return out
}

func replaceSpans(s string, l []span) string {
	var b strings.Builder
	b.Grow(len(s))
	last := 0
	for _, x := range mergeSpans(l) {
		b.WriteString(s[last:x.lo])
		b.WriteString(Mark)
		last = x.hi
	}
	b.WriteString(s[last:])
	return b.String()
}

// asciiLower lowers ASCII letters only, so that offsets in the result
// are offsets in s.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// SensitiveHeader reports whether an HTTP header's value is a credential
// by its name: it is redacted whole.
func SensitiveHeader(name string) bool {
	switch strings.ToLower(name) {
	case "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
		"x-auth-token", "x-amz-security-token", "x-goog-api-key":
		return true
	case "idempotency-key", "x-idempotency-key":
		// An identifier of the request, which the ledger shows to match
		// an effect with its retries: not a credential.
		return false
	}
	return SecretName(name)
}
