package daemon

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/httpapi"
)

// keyringTruster serves the trust route from a keyring, as the engine
// does.
type keyringTruster struct{ k *ckstore.Keyring }

func (t keyringTruster) TrustKey(b []byte) (string, bool, error) { return t.k.Trust(b) }

// TestTrustRoute: POST /v1/host/trusted-keys trusts another host's key
// once (again is no change), refuses what is not a key, and the key
// checks that host's signatures from then on.
func TestTrustRoute(t *testing.T) {
	mine, err := ckstore.LoadKeyring(filepath.Join(t.TempDir(), "keys"), nil)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ckstore.LoadKeyring(filepath.Join(t.TempDir(), "keys"), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := serve(t, httpapi.Handler(stubEngine{}, nil, slog.Default(), httpapi.TrustRoutes(keyringTruster{mine})...))
	ctx := context.Background()
	k, err := c.TrustKey(ctx, string(other.PublicKey()))
	if err != nil || !k.Added || k.KeyID != other.KeyID() {
		t.Fatalf("trust: %+v %v", k, err)
	}
	if k, err := c.TrustKey(ctx, string(other.PublicKey())); err != nil || k.Added {
		t.Fatalf("trust again: %+v %v", k, err)
	}
	if _, err := c.TrustKey(ctx, "-----BEGIN MOLT PUBLIC KEY-----\nAAAA\n-----END MOLT PUBLIC KEY-----\n"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a junk key: %v, want invalid argument", err)
	}
	if !slices.Contains(mine.Trusted(), other.KeyID()) {
		t.Fatalf("trusted: %v", mine.Trusted())
	}
	msg := []byte("molt-test\x00x")
	if err := mine.CheckBytes(other.SignBytes(msg), msg); err != nil {
		t.Fatal(err)
	}
}
