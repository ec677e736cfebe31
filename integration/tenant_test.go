package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
)

// tlsSetup writes a self-signed certificate for 127.0.0.1 and the test
// hosts' addresses (netns_test.go; it is its own CA) and picks a free
// port for the daemon's TLS listener.
func tlsSetup(tmp string) (string, error) {
	env.tlsDir = filepath.Join(tmp, "tls")
	if err := os.MkdirAll(env.tlsDir, 0o700); err != nil {
		return "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "molt test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: append([]net.IP{net.IPv4(127, 0, 0, 1)}, hostIPs...), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(env.tlsDir, "cert.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(env.tlsDir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return "", err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// as runs molt against the TLS listener with token.
func as(t *testing.T, token string, args ...string) result {
	t.Helper()
	return molt(t, append([]string{"--endpoint", "https://" + env.listen, "--token", token, "--tls-ca", filepath.Join(env.tlsDir, "cert.pem")}, args...)...)
}

// TestTenantsOverTLS: over the daemon's TLS listener, a tenant's token
// creates and uses its sandbox; another tenant's token does not see it
// (404, and not in its list); a read-only token cannot run commands; a
// request without a valid token, or with a revoked one, is refused; the
// host admin on the socket sees everything.
func TestTenantsOverTLS(t *testing.T) {
	if env.listen == "" {
		t.Skip("the daemon has no TLS listener in this run")
	}
	suffix := strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:8]
	ta, tb := "ta-"+suffix, "tb-"+suffix
	must(t, "tenant", "create", ta)
	must(t, "tenant", "create", tb)
	tokA := strings.TrimSpace(must(t, "token", "create", "--tenant", ta, "--scope", "admin"))
	tokB := strings.TrimSpace(must(t, "token", "create", "--tenant", tb, "--scope", "admin"))
	tokRO := strings.TrimSpace(must(t, "token", "create", "--tenant", ta, "--scope", "read"))

	r := as(t, tokA, "create", image)
	if r.code != 0 {
		t.Fatalf("create as %s: %s", ta, r.stderr)
	}
	sb := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { molt(t, "rm", sb) })
	if r := as(t, tokA, "exec", sb, "--", "echo", "hi"); r.code != 0 || strings.TrimSpace(r.stdout) != "hi" {
		t.Fatalf("exec as the owner: exit %d %q %s", r.code, r.stdout, r.stderr)
	}
	if r := as(t, tokA, "exec", sb, "--session", "main", "--", "export X=1"); r.code != 0 {
		t.Fatalf("session as the owner: %s", r.stderr)
	}
	if r := as(t, tokA, "checkpoint", sb); r.code != 0 {
		t.Fatalf("checkpoint as the owner: %s", r.stderr)
	}

	for _, args := range [][]string{{"inspect", sb}, {"exec", sb, "--", "true"}, {"rm", sb}, {"checkpoints", sb}, {"rollback", sb, "x"}} {
		if r := as(t, tokB, args...); r.code == 0 || !strings.Contains(r.stderr, "not found") {
			t.Errorf("%v as the other tenant: exit %d %q, want not found", args, r.code, r.stderr)
		}
	}
	var l []v1.Sandbox
	if err := json.Unmarshal([]byte(as(t, tokB, "--json", "ls").stdout), &l); err != nil || len(l) != 0 {
		t.Errorf("the other tenant lists %v (%v)", l, err)
	}
	if r := as(t, tokRO, "exec", sb, "--", "true"); r.code == 0 || !strings.Contains(r.stderr, "scope") {
		t.Errorf("exec with a read-only token: exit %d %q", r.code, r.stderr)
	}
	if r := as(t, tokRO, "inspect", sb); r.code != 0 {
		t.Errorf("inspect with a read-only token: %s", r.stderr)
	}
	if r := as(t, "molt_00000000000000aa_bogus", "ls"); r.code == 0 || !strings.Contains(r.stderr, "token") {
		t.Errorf("a bogus token: exit %d %q", r.code, r.stderr)
	}
	// The refusal is in the audit log, naming the token's ID, never its
	// secret.
	if out := must(t, "audit", "export"); !strings.Contains(out, "token 00000000000000aa") || strings.Contains(out, "bogus") {
		t.Errorf("the audit log does not record the refused token (or holds its secret)")
	}
	if r := as(t, tokA, "tenant", "ls"); r.code == 0 || !strings.Contains(r.stderr, "admin") {
		t.Errorf("a tenant's token listed tenants: exit %d %q", r.code, r.stderr)
	}
	var toks []v1.Token
	mustJSON(t, &toks, "token", "ls", "--tenant", tb)
	if len(toks) != 1 {
		t.Fatalf("tokens of %s: %+v", tb, toks)
	}
	must(t, "token", "rm", toks[0].ID)
	if r := as(t, tokB, "ls"); r.code == 0 {
		t.Errorf("a revoked token still works")
	}
	var admin v1.Sandbox
	mustJSON(t, &admin, "inspect", sb)
	if admin.Tenant != ta {
		t.Errorf("the admin sees %s owned by %q, want %s", sb, admin.Tenant, ta)
	}
	if r := molt(t, "tenant", "rm", ta); r.code == 0 {
		t.Errorf("a tenant that owns a sandbox was deleted")
	}
}
