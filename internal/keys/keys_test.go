package keys

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func newKEK(t *testing.T) (KEK, []byte) {
	t.Helper()
	raw := make([]byte, KeySize)
	rand.Read(raw)
	k, err := NewKEK(raw)
	if err != nil {
		t.Fatal(err)
	}
	return k, raw
}

func TestRecords(t *testing.T) {
	kek, _ := newKEK(t)
	r, err := OpenRing(t.TempDir(), kek, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Encrypting() {
		t.Fatal("a ring with a KEK does not encrypt")
	}
	k, err := r.Current("acme")
	if err != nil {
		t.Fatal(err)
	}
	plain := []byte("DB_PASSWORD=hunter2")
	sealed, err := k.Seal(plain, []byte("turns/sb/1"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, plain) || !Sealed(sealed) {
		t.Fatalf("sealed record %q holds its plaintext or is not recognized", sealed)
	}
	got, err := r.Open("acme", sealed, []byte("turns/sb/1"))
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open = %q, %v", got, err)
	}
	if _, err := r.Open("acme", sealed, []byte("turns/sb/2")); err == nil {
		t.Fatal("a record opened bound to another record")
	}
	bad := bytes.Clone(sealed)
	bad[len(bad)-20] ^= 1
	if _, err := r.Open("acme", bad, []byte("turns/sb/1")); err == nil {
		t.Fatal("a tampered record opened")
	}
	// Another tenant's ring lookup never finds acme's key.
	if _, err := r.Open("other", sealed, []byte("turns/sb/1")); !errors.Is(err, ErrShredded) {
		t.Fatalf("another tenant opened acme's record: %v", err)
	}
}

func TestPages(t *testing.T) {
	kek, _ := newKEK(t)
	r, _ := OpenRing(t.TempDir(), kek, nil)
	k, _ := r.Current("")
	page := bytes.Repeat([]byte("secret page "), PageSize/12+1)[:PageSize]
	c := k.Pages("images/pages-1.img", 3*PageSize)
	var s0, s1 [SealSize]byte
	a, b := bytes.Clone(page), bytes.Clone(page)
	if err := c.Seal(0, a, &s0); err != nil {
		t.Fatal(err)
	}
	if err := c.Seal(1, b, &s1); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, page) || bytes.Contains(a, []byte("secret page")) {
		t.Fatal("page not encrypted")
	}
	// Convergent: equal pages, equal ciphertext (shared by the page
	// store), but seals bound to their places.
	if !bytes.Equal(a, b) || s0 == s1 {
		t.Fatalf("equal pages: ciphertext equal %v, seals equal %v", bytes.Equal(a, b), s0 == s1)
	}
	if err := c.Open(1, bytes.Clone(a), s0[:]); err == nil {
		t.Fatal("page 0 opened as page 1")
	}
	other := k.Pages("images/pages-2.img", 3*PageSize)
	if err := other.Open(0, bytes.Clone(a), s0[:]); err == nil {
		t.Fatal("a page opened as another object's")
	}
	if err := c.Open(0, a, s0[:]); err != nil || !bytes.Equal(a, page) {
		t.Fatalf("open page 0: %v", err)
	}
	// Another tenant's key encrypts the same page differently.
	k2, _ := r.Current("acme")
	d := bytes.Clone(page)
	var s2 [SealSize]byte
	k2.Pages("images/pages-1.img", 3*PageSize).Seal(0, d, &s2)
	if bytes.Equal(d, b) {
		t.Fatal("two tenants' keys give the same ciphertext")
	}
	// A partial last page keeps its length.
	tail := []byte("short")
	var s3 [SealSize]byte
	c.Seal(2, tail, &s3)
	if err := c.Open(2, tail, s3[:]); err != nil || string(tail) != "short" {
		t.Fatalf("partial page: %q %v", tail, err)
	}
	hdr := c.SealHeader()
	id, size, err := ParseSealHeader(hdr, int64(len(hdr))+3*SealSize)
	if err != nil || id != k.ID || size != 3*PageSize {
		t.Fatalf("seal header: %s %d %v", id, size, err)
	}
	if _, _, err := ParseSealHeader(hdr, int64(len(hdr))+2*SealSize); err == nil {
		t.Fatal("a seal file missing a page's seal passed")
	}
}

func TestRotateAndShred(t *testing.T) {
	kek, _ := newKEK(t)
	dir := t.TempDir()
	r, _ := OpenRing(dir, kek, nil)
	k1, _ := r.Current("acme")
	old, _ := k1.Seal([]byte("old"), nil)
	k2, err := r.Rotate("acme")
	if err != nil || k2.ID == k1.ID {
		t.Fatalf("rotate: %v", err)
	}
	if cur, _ := r.Current("acme"); cur.ID != k2.ID {
		t.Fatal("the rotated key is not current")
	}
	if p, err := r.Open("acme", old, nil); err != nil || string(p) != "old" {
		t.Fatalf("data sealed before a rotation: %q %v", p, err)
	}
	if ks, _ := r.List(); len(ks) != 2 || ks[0].Current || !ks[1].Current {
		t.Fatalf("list: %+v", ks)
	}
	kb, _ := r.Current("beta")
	beta, _ := kb.Seal([]byte("beta's"), nil)
	n, err := r.Shred("acme")
	if err != nil || n != 2 {
		t.Fatalf("shred: %d %v", n, err)
	}
	if _, err := r.Open("acme", old, nil); !errors.Is(err, ErrShredded) {
		t.Fatalf("shredded data opened: %v", err)
	}
	if _, err := k1.Seal([]byte("x"), nil); !errors.Is(err, ErrShredded) {
		t.Fatalf("a held shredded key still seals: %v", err)
	}
	// A new ring (a restarted daemon) cannot either; another tenant can.
	r2, _ := OpenRing(dir, kek, nil)
	if _, err := r2.Open("acme", old, nil); !errors.Is(err, ErrShredded) {
		t.Fatalf("shredded data opened after a restart: %v", err)
	}
	if p, err := r2.Open("beta", beta, nil); err != nil || string(p) != "beta's" {
		t.Fatalf("another tenant's data after a shred: %v", err)
	}
	// No key material of acme is left on disk.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), "acme") {
			t.Fatalf("%s left after the shred", e.Name())
		}
	}
}

func TestKEKRotation(t *testing.T) {
	kekA, _ := newKEK(t)
	kekB, _ := newKEK(t)
	dir := t.TempDir()
	r, _ := OpenRing(dir, kekA, nil)
	k, _ := r.Current("acme")
	sealed, _ := k.Seal([]byte("payload"), nil)
	before, _ := os.ReadFile(filepath.Join(dir, "tenant-acme.json"))

	// The wrong KEK: a clear refusal naming the KEK it needs.
	r2, err := OpenRing(dir, kekB, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r2.Open("acme", sealed, nil); err == nil || !strings.Contains(err.Error(), kekA.ID()) {
		t.Fatalf("wrong KEK: %v", err)
	}
	// The rotation: B, with A as the previous one, re-wraps.
	r3, err := OpenRing(dir, kekB, kekA)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := r3.Open("acme", sealed, nil); err != nil || string(p) != "payload" {
		t.Fatalf("after the rotation: %v", err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "tenant-acme.json"))
	if bytes.Equal(before, after) || !bytes.Contains(after, []byte(kekB.ID())) {
		t.Fatal("the key was not re-wrapped")
	}
	// A is no longer needed, nor accepted.
	r4, _ := OpenRing(dir, kekA, nil)
	if _, err := r4.Open("acme", sealed, nil); err == nil {
		t.Fatal("the rotated-out KEK still unwraps")
	}
}

func TestLocalKEK(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRing(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Encrypting() {
		t.Fatal("a ring without a KEK says it encrypts at rest")
	}
	k, _ := r.Current("")
	sealed, _ := k.Seal([]byte("secret"), nil)
	// Given a KEK later, the keys move under it and the local one goes.
	kek, _ := newKEK(t)
	r2, err := OpenRing(dir, kek, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := r2.Open("", sealed, nil); err != nil || string(p) != "secret" {
		t.Fatalf("after moving under a KEK: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, localKEKFile)); !os.IsNotExist(err) {
		t.Fatalf("the local KEK stayed: %v", err)
	}
}

func TestKEKProviders(t *testing.T) {
	raw := make([]byte, KeySize)
	rand.Read(raw)
	dir := t.TempDir()
	p := filepath.Join(dir, "kek")
	os.WriteFile(p, []byte(hex.EncodeToString(raw)+"\n"), 0o644)
	if _, err := FileKEK(p); err == nil {
		t.Fatal("a KEK file readable by others was accepted")
	}
	os.Chmod(p, 0o600)
	a, err := FileKEK(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOLT_TEST_KEK", hex.EncodeToString(raw))
	b, err := EnvKEK("MOLT_TEST_KEK")
	if err != nil || a.ID() != b.ID() {
		t.Fatalf("the same key from a file and the environment: %v", err)
	}
	os.WriteFile(p, raw[:16], 0o600)
	if _, err := FileKEK(p); err == nil {
		t.Fatal("a 16-byte KEK was accepted")
	}
	if _, err := EnvKEK("MOLT_TEST_UNSET_KEK"); err == nil {
		t.Fatal("an unset variable gave a KEK")
	}
}
