package core

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/testutil"
)

// TestSecretsEncryptedAtRest: with a KEK, a secret passed by reference
// reaches the sandbox and is not in the metadata store; the turn log and
// the ledger hold neither it nor an ordinary output or response body in
// the clear (all sealed), and read back; once the tenant's key is
// shredded, the turn log and a fresh init (which needs the secrets) fail
// naming it.
func TestSecretsEncryptedAtRest(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	kek, err := keys.NewKEK(bytes.Repeat([]byte{5}, keys.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	m, err := Open(ctx, Config{Root: root, PoolSize: 8 << 30, CacheDir: os.Getenv("MOLT_CACHE_DIR"), KEK: kek})
	if err != nil {
		t.Fatal(err)
	}
	closeManager(t, m)
	if _, err := m.BuildImage(ctx, v1.ImageBuildRequest{Name: testImage}, nil); err != nil {
		t.Fatal(err)
	}
	requireCRIU(t, m)
	const (
		token     = "tok-AT-REST-24816x"
		knownOut  = "an-ordinary-output-13579"
		knownBody = "an-ordinary-response-body-97531"
	)
	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: testImage, Secrets: map[string]string{"API_TOKEN": token}})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(sb.Secrets, ",") != "API_TOKEN" {
		t.Fatalf("secrets %q", sb.Secrets)
	}
	if code := execOnce(t, m, sb.ID, "sh", "-c", `test "$API_TOKEN" = `+token+` && echo `+knownOut); code != 0 {
		t.Fatalf("the sandbox has no API_TOKEN: exit %d", code)
	}
	endTurn(t, m, sb.ID)
	if _, err := m.DeclareEffect(ctx, sb.ID, v1.EffectDeclareRequest{Method: "POST", URL: "https://api.example/x", Status: 200, ResponseBody: []byte(knownBody)}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{filepath.Join(root, "molt.db"), m.path("ledger", sb.ID+".ledger")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{token, knownOut, knownBody} {
			if bytes.Contains(b, []byte(s)) || holdsBase64(b, s) {
				t.Errorf("%s holds %q in the clear", f, s)
			}
		}
	}
	log, err := m.Turns(sb.ID)
	if err != nil || len(log) == 0 || len(log[0].Commands) == 0 || !strings.Contains(log[0].Commands[0].Stdout, knownOut) {
		t.Fatalf("turn log %+v: %v", log, err)
	}
	if effs, _, err := m.Effects(ctx, sb.ID, ""); err != nil || len(effs) != 1 || string(effs[0].Response.Body) != knownBody {
		t.Fatalf("effects %+v: %v", effs, err)
	}

	if _, err := m.keys.Shred(""); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Turns(sb.ID); !errors.Is(err, keys.ErrShredded) {
		t.Errorf("turn log after shredding: %v", err)
	}
	if _, err := m.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(ctx, sb.ID); !errors.Is(err, keys.ErrShredded) {
		t.Errorf("start after shredding: %v", err)
	}
}

// holdsBase64 reports whether b holds s base64-encoded (JSON's []byte),
// at any alignment.
func holdsBase64(b []byte, s string) bool {
	for pad := 0; pad < 3; pad++ {
		enc := base64.StdEncoding.EncodeToString(append(bytes.Repeat([]byte{'x'}, pad), s...))
		if mid := enc[4 : len(enc)-4]; len(mid) >= 8 && bytes.Contains(b, []byte(mid)) {
			return true
		}
	}
	return false
}
