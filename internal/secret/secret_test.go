package secret

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/keys"
)

// Each built-in pattern redacts its kind of credential and leaves the
// text around it (and ordinary text) readable.
func TestRedact(t *testing.T) {
	r, err := NewRedactor([]string{`internal-[0-9]{6}`})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ in, secret, keep string }{
		{"key AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "key "},
		{"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc", "eyJhbGciOiJIUzI1NiJ9.abc", "Authorization: Bearer "},
		{"OPENAI_API_KEY is sk-proj-abcdefghijklmnop1234", "sk-proj-abcdefghijklmnop1234", "OPENAI_API_KEY is "},
		{"token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789", "token "},
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nabc\n-----END RSA PRIVATE KEY-----\nafter", "MIIEow", "after"},
		{"export DB_PASSWORD=hunter2x; ls", "hunter2x", "export DB_PASSWORD="},
		{`{"password": "s3cr3t-value", "user": "bob"}`, "s3cr3t-value", `"user": "bob"`},
		{"GET /v1/x?api_key=abcdef123&page=2", "abcdef123", "page=2"},
		{"postgres://bob:pa55word@db/x", "pa55word", "postgres://bob:"},
		{"id internal-123456 end", "internal-123456", " end"},
	} {
		got := r.Redact(c.in, nil)
		if strings.Contains(got, c.secret) || !strings.Contains(got, Mark) || !strings.Contains(got, c.keep) {
			t.Errorf("Redact(%q) = %q", c.in, got)
		}
	}
	plain := "total 12\ndrwxr-xr-x 2 root root 4096 notes.txt\nhello world\n" + `{"max_tokens": 1024, "stream": true, "usage": {"input_tokens": 12}}`
	if got := r.Redact(plain, nil); got != plain {
		t.Errorf("ordinary text changed: %q", got)
	}
	// Exact values, wherever they are; short ones are not.
	if got := r.Redact("the value hunter2 and ab", []string{"hunter2", "ab"}); got != "the value "+Mark+" and ab" {
		t.Errorf("values: %q", got)
	}
	if _, err := NewRedactor([]string{"("}); err == nil {
		t.Error("a bad pattern is accepted")
	}
}

func TestAssigned(t *testing.T) {
	got := Assigned(`export DB_PASSWORD="p4ss word"; API_TOKEN=tok123 run; X=notsecret; MY_KEY='k3y-v'`)
	want := []string{"p4ss word", "tok123", "k3y-v"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Assigned = %q, want %q", got, want)
	}
}

// The vault learns assigned values, seals with the sandbox's tenant key
// and fails to open once that key is shredded.
func TestVault(t *testing.T) {
	ring, err := keys.OpenRing(filepath.Join(t.TempDir(), "keys"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	red, _ := NewRedactor(nil)
	v := NewVault(ring, red, func(sb string) (string, error) { return map[string]string{"a": "ta", "b": "tb"}[sb], nil },
		func(sb string) []string { return []string{"declared-" + sb} })
	v.Learn("a", "export DB_PASSWORD=learned1")
	if got := v.Redact("a", "learned1 declared-a declared-b"); got != Mark+" "+Mark+" declared-b" {
		t.Errorf("redacted %q", got)
	}
	s, err := v.Seal("a", []byte("plain"), []byte("aad"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Open("b", s, []byte("aad")); err == nil {
		t.Error("another tenant's sandbox opens it")
	}
	if p, err := v.Open("a", s, []byte("aad")); err != nil || string(p) != "plain" {
		t.Fatalf("open: %q %v", p, err)
	}
	if _, err := ring.Shred("ta"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Open("a", s, []byte("aad")); !errors.Is(err, keys.ErrShredded) {
		t.Errorf("open after shredding: %v", err)
	}
}

// BenchmarkRedact: redaction is on the path of every recorded LLM call
// (the reply waits for its record): 1 MiB of an LLM request's JSON,
// plain, and with an anchor ("max_tokens") every 90 bytes.
func BenchmarkRedact(b *testing.B) {
	r, _ := NewRedactor(nil)
	for name, line := range map[string]string{
		"plain":   `{"role":"user","content":"total 12 drwxr-xr-x 2 root root 4096 notes.txt and more"},`,
		"anchors": `{"role":"user","content":"total 12 drwxr-xr-x 2 root root 4096 notes.txt","max_tokens":1024},`,
	} {
		s := strings.Repeat(line, (1<<20)/len(line))
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				r.Redact(s, []string{"hunter2-secret", "another-value"})
			}
		})
	}
}
