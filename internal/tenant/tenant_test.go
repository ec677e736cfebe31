package tenant

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

func newStore(t *testing.T) (*Store, *meta.DB) {
	t.Helper()
	db, err := meta.Open(filepath.Join(t.TempDir(), "molt.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return New(db), db
}

// A token authenticates as its tenant with its scopes until it is
// revoked or its tenant deleted; a wrong or malformed secret never does;
// the database keeps the secret's hash, not the secret.
func TestTokens(t *testing.T) {
	s, db := newStore(t)
	if _, err := s.CreateTenant("Bad Name"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := s.CreateTenant("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateTenant("acme"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("second acme: %v", err)
	}
	if _, _, err := s.CreateToken("nobody", nil, nil, ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("token of no tenant: %v", err)
	}
	if _, _, err := s.CreateToken("acme", []string{"root"}, nil, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("unknown scope: %v", err)
	}
	tok, rec, err := s.CreateToken("acme", []string{ScopeRead}, []string{"sb1"}, "ci")
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Authenticate(tok)
	if err != nil || p.Tenant != "acme" || p.TokenID != rec.ID || !p.Can(ScopeRead) || p.Can(ScopeExec) || p.Admin {
		t.Fatalf("authenticated %+v, %v", p, err)
	}
	if !p.Reaches("sb1", "acme") || p.Reaches("sb2", "acme") || p.Reaches("sb1", "other") {
		t.Fatal("reach of a token limited to sb1")
	}
	var stored meta.TokenRecord
	if err := db.Get(meta.Tokens, rec.ID, &stored); err != nil || strings.Contains(stored.Hash, tok[len("molt_"+rec.ID+"_"):]) || stored.Hash == "" {
		t.Fatalf("stored %+v", stored)
	}
	for _, bad := range []string{"", "molt_", tok + "x", strings.Replace(tok, rec.ID, "0000000000000000", 1), "Bearer " + tok, tok[:len(tok)-1]} {
		if _, err := s.Authenticate(bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("token %q authenticated: %v", bad, err)
		}
	}
	if err := s.DeleteTenant("acme", func(string) bool { return true }); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("deleting a tenant that owns a sandbox: %v", err)
	}
	if err := s.DeleteToken(rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(tok); !errors.Is(err, ErrUnauthenticated) {
		t.Fatal("a revoked token authenticated")
	}
	tok2, _, _ := s.CreateToken("acme", nil, nil, "")
	if err := s.DeleteTenant("acme", func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(tok2); !errors.Is(err, ErrUnauthenticated) {
		t.Fatal("a deleted tenant's token authenticated")
	}
	if l, _ := s.Tokens(""); len(l) != 0 {
		t.Fatalf("tokens left: %+v", l)
	}
}
