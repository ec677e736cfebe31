// Package tenant keeps the host's tenants and their API tokens, and says
// who a request is: the host admin (the daemon's unix socket, whose
// access the socket's permissions and SO_PEERCRED decide) or a tenant's
// token (the daemon's TCP listener, `Authorization: Bearer TOKEN`).
//
// A token is "molt_<id>_<secret>": the ID names its record, the secret
// (32 random bytes) is shown once, when the token is made, and only its
// SHA-256 is kept. A token has scopes (what it may do) and optionally a
// list of sandboxes (the only ones it reaches); it never reaches another
// tenant's objects (internal/httpapi's guard answers 404 for them, as
// for objects that do not exist).
package tenant

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// Scopes.
const (
	ScopeRead       = "read"       // list and show
	ScopeExec       = "exec"       // run commands, sessions
	ScopeCheckpoint = "checkpoint" // checkpoints, turns, hibernate, resume
	ScopeRollback   = "rollback"   // rollback, recover, fork
	ScopeAdmin      = "admin"      // everything on the tenant's objects: create, remove, LLM endpoints, effects
)

// AllScopes are the scopes, each implied by admin.
var AllScopes = []string{ScopeRead, ScopeExec, ScopeCheckpoint, ScopeRollback, ScopeAdmin}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Principal is who a request is.
type Principal struct {
	// Admin is the host admin: every object, every operation.
	Admin bool
	// Tenant, Scopes and Sandboxes are a token's.
	Tenant    string
	TokenID   string
	Scopes    []string
	Sandboxes []string
}

// Can reports whether p may do what scope names.
func (p Principal) Can(scope string) bool {
	return p.Admin || slices.Contains(p.Scopes, ScopeAdmin) || slices.Contains(p.Scopes, scope)
}

// Reaches reports whether p may touch sandbox id of tenant owner.
func (p Principal) Reaches(id, owner string) bool {
	if p.Admin {
		return true
	}
	return owner == p.Tenant && (len(p.Sandboxes) == 0 || slices.Contains(p.Sandboxes, id))
}

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// Of returns the principal ctx carries; a request without one is the
// host admin's (the unix socket).
func Of(ctx context.Context) Principal {
	if p, ok := ctx.Value(ctxKey{}).(Principal); ok {
		return p
	}
	return Principal{Admin: true}
}

// Store keeps tenants and tokens in the daemon's database.
type Store struct {
	db *meta.DB
}

// New returns the store of db.
func New(db *meta.DB) *Store { return &Store{db: db} }

// ErrUnauthenticated is returned for a missing, malformed, unknown or
// revoked token.
var ErrUnauthenticated = errors.New("tenant: no valid token")

// CreateTenant makes tenant name.
func (s *Store) CreateTenant(name string) (meta.TenantRecord, error) {
	if !nameRE.MatchString(name) {
		return meta.TenantRecord{}, fmt.Errorf("tenant name %q: want 1-63 of [a-z0-9_-], starting with a letter or digit: %w", name, errdefs.ErrInvalidArgument)
	}
	rec := meta.TenantRecord{Name: name, Created: time.Now().UTC()}
	err := s.db.Update(func(tx *meta.Tx) error {
		var old meta.TenantRecord
		if tx.Get(meta.Tenants, name, &old) == nil {
			return fmt.Errorf("tenant %s: %w", name, errdefs.ErrAlreadyExists)
		}
		return tx.Put(meta.Tenants, name, rec)
	})
	return rec, err
}

// Exists reports whether tenant name exists.
func (s *Store) Exists(name string) bool {
	var rec meta.TenantRecord
	return s.db.Get(meta.Tenants, name, &rec) == nil
}

// Tenants lists the tenants.
func (s *Store) Tenants() ([]meta.TenantRecord, error) {
	return meta.TenantRecords.List(s.db)
}

// DeleteTenant deletes tenant name and its tokens; owns says whether it
// still owns something (then it is refused).
func (s *Store) DeleteTenant(name string, owns func(string) bool) error {
	if !s.Exists(name) {
		return fmt.Errorf("tenant %s: %w", name, errdefs.ErrNotFound)
	}
	if owns(name) {
		return fmt.Errorf("tenant %s still owns sandboxes (remove them first): %w", name, errdefs.ErrFailedPrecondition)
	}
	toks, err := s.Tokens(name)
	if err != nil {
		return err
	}
	return s.db.Update(func(tx *meta.Tx) error {
		for _, t := range toks {
			if err := tx.Delete(meta.Tokens, t.ID); err != nil {
				return err
			}
		}
		return tx.Delete(meta.Tenants, name)
	})
}

// CreateToken makes a token of tenant with scopes (all but admin when
// none) reaching sandboxes (all of the tenant's when none); it returns
// the token, shown only now, and its record.
func (s *Store) CreateToken(tenant string, scopes, sandboxes []string, note string) (string, meta.TokenRecord, error) {
	if !s.Exists(tenant) {
		return "", meta.TokenRecord{}, fmt.Errorf("tenant %s: %w", tenant, errdefs.ErrNotFound)
	}
	if len(scopes) == 0 {
		scopes = []string{ScopeRead, ScopeExec, ScopeCheckpoint, ScopeRollback}
	}
	for _, sc := range scopes {
		if !slices.Contains(AllScopes, sc) {
			return "", meta.TokenRecord{}, fmt.Errorf("scope %q: want one of %s: %w", sc, strings.Join(AllScopes, ", "), errdefs.ErrInvalidArgument)
		}
	}
	idb := make([]byte, 8)
	secret := make([]byte, 32)
	if _, err := rand.Read(idb); err != nil {
		return "", meta.TokenRecord{}, err
	}
	if _, err := rand.Read(secret); err != nil {
		return "", meta.TokenRecord{}, err
	}
	id := hex.EncodeToString(idb)
	sec := base64.RawURLEncoding.EncodeToString(secret)
	rec := meta.TokenRecord{ID: id, Tenant: tenant, Scopes: slices.Clone(scopes), Sandboxes: slices.Clone(sandboxes),
		Hash: hashSecret(sec), Note: note, Created: time.Now().UTC()}
	if err := s.db.Put(meta.Tokens, id, rec); err != nil {
		return "", meta.TokenRecord{}, err
	}
	return "molt_" + id + "_" + sec, rec, nil
}

func hashSecret(sec string) string {
	sum := sha256.Sum256([]byte(sec))
	return hex.EncodeToString(sum[:])
}

// Tokens lists the tokens of tenant ("": every tenant's).
func (s *Store) Tokens(tenant string) ([]meta.TokenRecord, error) {
	all, err := meta.TokenRecords.List(s.db)
	if err != nil || tenant == "" {
		return all, err
	}
	var out []meta.TokenRecord
	for _, t := range all {
		if t.Tenant == tenant {
			out = append(out, t)
		}
	}
	return out, nil
}

// DeleteToken revokes token id.
func (s *Store) DeleteToken(id string) error {
	var rec meta.TokenRecord
	if err := s.db.Get(meta.Tokens, id, &rec); err != nil {
		return fmt.Errorf("token %s: %w", id, errdefs.ErrNotFound)
	}
	return s.db.Delete(meta.Tokens, id)
}

// TokenID returns the ID a token of the form molt_<id>_<secret> names
// (16 hex digits), whether or not such a token exists.
func TokenID(token string) (string, bool) {
	rest, ok := strings.CutPrefix(token, "molt_")
	if !ok {
		return "", false
	}
	id, sec, ok := strings.Cut(rest, "_")
	if !ok || len(id) != 16 || sec == "" {
		return "", false
	}
	for _, c := range id {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return "", false
		}
	}
	return id, true
}

// Authenticate returns the principal of token.
func (s *Store) Authenticate(token string) (Principal, error) {
	id, ok := TokenID(token)
	if !ok {
		return Principal{}, ErrUnauthenticated
	}
	sec := strings.TrimPrefix(token, "molt_"+id+"_")
	var rec meta.TokenRecord
	if err := s.db.Get(meta.Tokens, id, &rec); err != nil {
		return Principal{}, ErrUnauthenticated
	}
	if subtle.ConstantTimeCompare([]byte(hashSecret(sec)), []byte(rec.Hash)) != 1 {
		return Principal{}, ErrUnauthenticated
	}
	if !s.Exists(rec.Tenant) {
		return Principal{}, ErrUnauthenticated
	}
	return Principal{Tenant: rec.Tenant, TokenID: rec.ID, Scopes: rec.Scopes, Sandboxes: rec.Sandboxes}, nil
}
