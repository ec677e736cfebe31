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

// DefaultPatterns are the credentials redacted everywhere. A pattern with
// a group named "v" has only that group replaced (the name or header it
// follows stays readable); otherwise the whole match is.
var DefaultPatterns = []string{
	// AWS access key IDs.
	`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`,
	// HTTP credentials.
	`(?i)\b(?:Bearer|Basic|Token)\s+(?P<v>[A-Za-z0-9._~+/=-]{8,})`,
	// API keys of the usual providers: OpenAI and Anthropic (sk-...),
	// GitHub, GitLab, Slack, Google, Stripe.
	`\bsk-[A-Za-z0-9_-]{16,}`,
	`\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{20,})`,
	`\bxox[abprs]-[A-Za-z0-9-]{10,}`,
	`\bAIza[0-9A-Za-z_-]{35}\b`,
	`\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}`,
	// PEM private keys, whole.
	`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`,
	// Assignments to secret-looking names: PASSWORD=..., "api_key": "...",
	// --token=..., aws_secret_access_key = ...
	`(?i)[A-Za-z0-9_.-]*(?:passw(?:or)?d|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|credentials?)[A-Za-z0-9_.-]*["']?\s*[=:]\s*["']?(?P<v>[^\s"'&;,}]{3,})`,
	// Query parameters and URL user information.
	`(?i)[?&][A-Za-z0-9_.-]*(?:token|key|secret|passw|sig|auth|code)[A-Za-z0-9_.-]*=(?P<v>[^&#\s"']+)`,
	`://[^/\s:@]+:(?P<v>[^@/\s]+)@`,
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
	patterns []*regexp.Regexp
}

// NewRedactor returns a redactor of DefaultPatterns and extra (Go
// regular expressions; a group named "v" limits what is replaced).
func NewRedactor(extra []string) (*Redactor, error) {
	r := &Redactor{}
	for _, p := range append(append([]string(nil), DefaultPatterns...), extra...) {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("redaction pattern %q: %w", p, err)
		}
		r.patterns = append(r.patterns, re)
	}
	return r, nil
}

// Redact returns s with values and every pattern's matches replaced by
// Mark.
func (r *Redactor) Redact(s string, values []string) string {
	if s == "" {
		return s
	}
	// Longest first, so that a value containing another goes whole.
	vs := make([]string, 0, len(values))
	for _, v := range values {
		if len(v) >= minValue && strings.Contains(s, v) {
			vs = append(vs, v)
		}
	}
	sort.Slice(vs, func(i, j int) bool { return len(vs[i]) > len(vs[j]) })
	for _, v := range vs {
		s = strings.ReplaceAll(s, v, Mark)
	}
	if r == nil {
		return s
	}
	for _, re := range r.patterns {
		s = replace(re, s)
	}
	return s
}

// replace replaces re's matches in s (their group "v" if re has one).
func replace(re *regexp.Regexp, s string) string {
	g := re.SubexpIndex("v")
	if g < 0 {
		return re.ReplaceAllLiteralString(s, Mark)
	}
	var b strings.Builder
	last := 0
	for _, m := range re.FindAllStringSubmatchIndex(s, -1) {
		lo, hi := m[2*g], m[2*g+1]
		if lo < 0 || s[lo:hi] == Mark {
			continue
		}
		b.WriteString(s[last:lo])
		b.WriteString(Mark)
		last = hi
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// SensitiveHeader reports whether an HTTP header's value is a credential
// by its name: it is redacted whole.
func SensitiveHeader(name string) bool {
	switch strings.ToLower(name) {
	case "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
		"x-auth-token", "x-amz-security-token", "x-goog-api-key":
		return true
	}
	return SecretName(name)
}
