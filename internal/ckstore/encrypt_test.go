package ckstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/testutil/btrfstest"
)

func ring(t *testing.T) *keys.Ring {
	t.Helper()
	raw := make([]byte, keys.KeySize)
	rand.Read(raw)
	kek, err := keys.NewKEK(raw)
	if err != nil {
		t.Fatal(err)
	}
	r, err := keys.OpenRing(t.TempDir(), kek, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestEncryptedImages: sealed images hold no plaintext, decrypt to what
// was dumped, still share the pages of their lineage within a tenant
// (never another tenant's), and every kind of tampering, and the wrong
// key, are refused naming the image.
func TestEncryptedImages(t *testing.T) {
	r := ring(t)
	ka, _ := r.Current("acme")
	kb, _ := r.Current("beta")
	s := ckstore.New(ckstore.NewLocal(btrfstest.Dir(t)))
	marker := []byte("DB_PASSWORD=correct-horse-battery")
	pages := make([]byte, 64*4096)
	rand.Read(pages)
	for i := 0; i < 64; i += 8 {
		copy(pages[i*4096:], marker)
	}
	small := []byte("pstree entry " + string(marker))
	refs := map[string]ckstore.Ref{}
	lookup := func(id string) (ckstore.Ref, bool) { r, ok := refs[id]; return r, ok }
	write := func(id, parent string, k *keys.DataKey) ([]ckstore.Object, int64) {
		t.Helper()
		w, err := s.Create(id)
		if err != nil {
			t.Fatal(err)
		}
		staging := t.TempDir()
		os.WriteFile(filepath.Join(staging, "pages-1.img"), pages, 0o600)
		os.WriteFile(filepath.Join(staging, "pstree.img"), small, 0o600)
		objs, written, err := w.StoreImages(context.Background(), staging, s.PageIndex(parent, lookup), nil, k)
		if err != nil {
			t.Fatal(err)
		}
		refs[id] = ckstore.Ref{ID: id, Parent: parent, Full: true, Objects: objs}
		return objs, written
	}
	objs, written := write("ck0000000001", "", ka)
	if written < int64(len(pages)) {
		t.Fatalf("first checkpoint wrote %d bytes of %d", written, len(pages))
	}
	dir := s.Dir("ck0000000001")
	for _, n := range []string{"images/pages-1.img", "images/pstree.img", "seal/pages-1.img", "pagehash/pages-1.img"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, marker) || bytes.Contains(b, pages[4096:8192]) {
			t.Fatalf("%s holds plaintext", n)
		}
	}
	out := t.TempDir()
	if _, err := s.Reader("ck0000000001").Decrypt(objs, ka, out, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(out, "pages-1.img")); !bytes.Equal(got, pages) {
		t.Fatal("decrypted pages differ from the dump")
	}
	if got, _ := os.ReadFile(filepath.Join(out, "pstree.img")); !bytes.Equal(got, small) {
		t.Fatal("decrypted small image differs from the dump")
	}

	// Sharing within the tenant: one changed page, about one page written.
	pages[5*4096] ^= 1
	_, written = write("ck0000000002", "ck0000000001", ka)
	if written > 4*4096 {
		t.Fatalf("child checkpoint wrote %d bytes; its parent holds all but one page", written)
	}
	// Never across tenants: another key shares nothing.
	_, written = write("ck0000000003", "ck0000000002", kb)
	if written < int64(len(pages)) {
		t.Fatalf("another tenant's checkpoint wrote %d bytes of %d: it shared ciphertext", written, len(pages))
	}

	decrypt := func(k *keys.DataKey) error {
		out := t.TempDir()
		_, err := s.Reader("ck0000000001").Decrypt(objs, k, out, nil)
		return err
	}
	if err := decrypt(kb); err == nil || !strings.Contains(err.Error(), "key") {
		t.Fatalf("decrypted with another tenant's key: %v", err)
	}
	tamper := func(name string, off int64) func() {
		p := filepath.Join(dir, name)
		orig, _ := os.ReadFile(p)
		b := bytes.Clone(orig)
		b[off] ^= 0x40
		os.WriteFile(p, b, 0o600)
		return func() { os.WriteFile(p, orig, 0o600) }
	}
	for _, c := range []struct {
		name string
		off  int64
	}{
		{"images/pages-1.img", 3*4096 + 17},  // a page's ciphertext
		{"seal/pages-1.img", 32 + 28*2 + 20}, // a page's tag
		{"seal/pages-1.img", 32 + 28*2 + 3},  // a page's nonce
		{"seal/pages-1.img", 18},             // the header's size
		{"images/pstree.img", 2},
	} {
		undo := tamper(c.name, c.off)
		err := decrypt(ka)
		undo()
		if err == nil || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("tampered %s at %d: %v", c.name, c.off, err)
		}
		base := filepath.Base(c.name)
		if !strings.Contains(err.Error(), base) {
			t.Fatalf("tampered %s: error %q does not name it", c.name, err)
		}
	}
	// Pages swapped within the image: each decrypts, but not in the
	// other's place.
	p := filepath.Join(dir, "images/pages-1.img")
	orig, _ := os.ReadFile(p)
	sw := bytes.Clone(orig)
	copy(sw[0:4096], orig[4096:8192])
	copy(sw[4096:8192], orig[0:4096])
	os.WriteFile(p, sw, 0o600)
	if err := decrypt(ka); err == nil {
		t.Fatal("swapped pages decrypted")
	}
	os.WriteFile(p, orig, 0o600)
	if err := decrypt(ka); err != nil {
		t.Fatalf("restored image: %v", err)
	}
	// A shredded key: unreadable, and said so.
	r.Shred("acme")
	if err := decrypt(ka); !errors.Is(err, keys.ErrShredded) {
		t.Fatalf("decrypt after the shred: %v", err)
	}
}
