package ledger

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/secret"
)

// Credentials a record carries: in the URL's query, a response header
// and body, a compensator's Authorization header; and a plain body.
const (
	urlSecret    = "tokQUERY123456"
	cookieSecret = "COOKIE987654"
	bodySecret   = "PWBODY-24680"
	authSecret   = "AUTHBEARER-13579"
	plainBody    = "nothing-secret-here-but-known"
)

func sealedLedger(t *testing.T, dir string, ring *keys.Ring) (*Ledger, *secret.Vault) {
	t.Helper()
	red, err := secret.NewRedactor(nil)
	if err != nil {
		t.Fatal(err)
	}
	v := secret.NewVault(ring, red, func(string) (string, error) { return "acme", nil }, nil)
	l, err := OpenSealed(dir, v)
	if err != nil {
		t.Fatal(err)
	}
	return l, v
}

func writeSecrets(t *testing.T, l *Ledger) Record {
	t.Helper()
	r, err := l.Begin("sb", Record{Kind: Effect, Request: Identity{Proto: "https", Method: "POST", URL: "https://api.example/v1/pay?access_token=" + urlSecret, Host: "api.example"}})
	if err != nil {
		t.Fatal(err)
	}
	resp := &Response{Status: 200, Header: map[string][]string{"Set-Cookie": {"s=" + cookieSecret}}, Body: []byte(`{"password":"` + bodySecret + `","note":"` + plainBody + `"}`)}
	resp.BodySize = int64(len(resp.Body))
	if _, err := l.Finish("sb", r.ID, Completed, resp, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SetCompensator("sb", r.ID, Compensator{Method: "DELETE", URL: "https://api.example/v1/pay/1", Header: map[string][]string{"Authorization": {"Bearer " + authSecret}}}); err != nil {
		t.Fatal(err)
	}
	return r
}

// fileHolds reports whether the file holds s, in its bytes or in a body
// (JSON gives []byte as base64).
func fileHolds(t *testing.T, dir string, s string) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "sb"+suffix))
	if err != nil {
		t.Fatal(err)
	}
	all := append([]byte(nil), b...)
	for _, line := range bytes.Split(b, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		e, err := decodeLine(line)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range []*Response{e.Response, func() *Response {
			if e.Rec != nil {
				return e.Rec.Response
			}
			return nil
		}()} {
			if r != nil {
				all = append(all, r.Body...)
			}
		}
		if e.Compensator != nil {
			all = append(all, e.Compensator.Body...)
		}
	}
	return bytes.Contains(all, []byte(s))
}

// TestSealedLedger: the file holds no credential in the clear; the
// records read back exact (a replay answers with the exact body, a
// compensator sends its exact header, requests match the exact URL); the
// API's view, and the audit hook's, are redacted.
func TestSealedLedger(t *testing.T) {
	dir := t.TempDir()
	ring, err := keys.OpenRing(filepath.Join(t.TempDir(), "keys"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := sealedLedger(t, dir, ring)
	var hooked []Record
	l.OnAppend(func(r Record) { hooked = append(hooked, r) })
	r := writeSecrets(t, l)
	l.Close()
	for _, s := range []string{urlSecret, cookieSecret, bodySecret, authSecret} {
		if fileHolds(t, dir, s) {
			t.Errorf("the ledger file holds %q in the clear", s)
		}
	}
	if !fileHolds(t, dir, plainBody) {
		t.Error("without encryption at rest, the redacted body is not kept readable")
	}
	for _, h := range hooked {
		b, _ := json.Marshal(h)
		if h.Response != nil {
			b = append(b, h.Response.Body...)
		}
		if bytes.Contains(b, []byte(urlSecret)) || bytes.Contains(b, []byte(bodySecret)) {
			t.Errorf("the append hook saw a credential: %s", b)
		}
	}

	l, _ = sealedLedger(t, dir, ring)
	defer l.Close()
	got, ok := l.Get("sb", r.ID)
	if !ok || got.Request.URL != r.Request.URL || !bytes.Contains(got.Response.Body, []byte(bodySecret)) ||
		got.Response.Header["Set-Cookie"][0] != "s="+cookieSecret || got.Compensator.Header["Authorization"][0] != "Bearer "+authSecret {
		t.Fatalf("read back %+v", got)
	}
	// Orphaned by a rewind, it answers an equal request with the exact
	// body: the match is on the exact URL.
	if err := l.Rewind("sb", ""); err != nil {
		t.Fatal(err)
	}
	if m := l.Match("sb", r.Request); m.Orphan == nil || !bytes.Contains(m.Orphan.Response.Body, []byte(bodySecret)) {
		t.Fatalf("no exact orphan matches: %+v", m)
	}
	view := l.View(got)
	b, _ := json.Marshal(view)
	b = append(b, view.Response.Body...)
	for _, s := range []string{urlSecret, cookieSecret, bodySecret, authSecret} {
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("the view shows %q: %s", s, b)
		}
	}
	if !bytes.Contains(view.Response.Body, []byte(plainBody)) || !bytes.Contains(got.Response.Body, []byte(bodySecret)) {
		t.Errorf("the view lost the plain text, or changed the record: %s", b)
	}
}

// TestLedgerEncryptedAtRest: with encryption at rest every payload is
// sealed (a body without any credential is not in the file either);
// after the tenant's key is shredded the sandbox's ledger is refused,
// naming why, and the others still open.
func TestLedgerEncryptedAtRest(t *testing.T) {
	dir := t.TempDir()
	kek, _ := keys.NewKEK(bytes.Repeat([]byte{7}, 32))
	ring, err := keys.OpenRing(filepath.Join(t.TempDir(), "keys"), kek, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := sealedLedger(t, dir, ring)
	r := writeSecrets(t, l)
	l.Close()
	if fileHolds(t, dir, plainBody) || fileHolds(t, dir, bodySecret) {
		t.Fatal("the response body is in the file with encryption at rest")
	}
	l, _ = sealedLedger(t, dir, ring)
	if got, ok := l.Get("sb", r.ID); !ok || !bytes.Contains(got.Response.Body, []byte(plainBody)) {
		t.Fatalf("read back %+v", got)
	}
	l.Close()
	if _, err := ring.Shred("acme"); err != nil {
		t.Fatal(err)
	}
	l, _ = sealedLedger(t, dir, ring)
	defer l.Close()
	if err := l.Broken()["sb"]; !errors.Is(err, keys.ErrShredded) {
		t.Fatalf("ledger after shredding: %v", err)
	}
	if _, err := l.List("sb", ""); !errors.Is(err, keys.ErrShredded) {
		t.Fatalf("list after shredding: %v", err)
	}
}
