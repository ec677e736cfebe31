package ckstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/keys"
)

// benchImageMiB is the page image of the storage benchmarks: the
// memory of a small agent process.
const benchImageMiB = 32

// BenchmarkStoreImages stores a page image of benchImageMiB (random
// pages: nothing shared) into a new checkpoint, in plaintext and sealed,
// side by side (run with -count to alternate them): the part of a full
// checkpoint's persist that encryption adds to.
func BenchmarkStoreImages(b *testing.B) {
	staging := b.TempDir()
	pages := make([]byte, benchImageMiB<<20)
	rand.Read(pages)
	if err := os.WriteFile(filepath.Join(staging, "pages-1.img"), pages, 0o600); err != nil {
		b.Fatal(err)
	}
	k := benchKey(b)
	for _, c := range []struct {
		name string
		k    *keys.DataKey
	}{{"plaintext", nil}, {"sealed", k}} {
		b.Run(c.name, func(b *testing.B) {
			s := ckstore.New(ckstore.NewLocal(b.TempDir()))
			b.SetBytes(int64(len(pages)))
			i := 0
			for b.Loop() {
				i++
				w, err := s.Create(fmt.Sprintf("ck%010d", i))
				if err != nil {
					b.Fatal(err)
				}
				if _, _, err := w.StoreImages(context.Background(), staging, nil, nil, c.k); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				s.Delete(fmt.Sprintf("ck%010d", i))
				b.StartTimer()
			}
		})
	}
}

// BenchmarkReadImages is what a warm or cold restore reads before CRIU
// starts: the plaintext images read in place (what CRIU then reads
// itself) against a sealed checkpoint's decryption into a directory in
// memory.
func BenchmarkReadImages(b *testing.B) {
	staging := b.TempDir()
	pages := make([]byte, benchImageMiB<<20)
	rand.Read(pages)
	os.WriteFile(filepath.Join(staging, "pages-1.img"), pages, 0o600)
	k := benchKey(b)
	s := ckstore.New(ckstore.NewLocal(b.TempDir()))
	w, _ := s.Create("ckplain00001")
	plainObjs, _, err := w.StoreImages(context.Background(), staging, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	w, _ = s.Create("cksealed0001")
	sealedObjs, _, err := w.StoreImages(context.Background(), staging, nil, nil, k)
	if err != nil {
		b.Fatal(err)
	}
	shm := "/dev/shm"
	if _, err := os.Stat(shm); err != nil {
		shm = ""
	}
	b.Run("plaintext", func(b *testing.B) {
		b.SetBytes(int64(len(pages)))
		for b.Loop() {
			for _, o := range plainObjs {
				if _, err := os.ReadFile(filepath.Join(s.Dir("ckplain00001"), o.Path)); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("sealed", func(b *testing.B) {
		b.SetBytes(int64(len(pages)))
		for b.Loop() {
			dst, err := os.MkdirTemp(shm, "molt-bench-")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := s.Reader("cksealed0001").Decrypt(sealedObjs, k, dst, nil); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			os.RemoveAll(dst)
			b.StartTimer()
		}
	})
}

// BenchmarkManifest is the manifest's part of a commit and of an open,
// unsigned and signed (ed25519) side by side.
func BenchmarkManifest(b *testing.B) {
	objs := make([]ckstore.Object, 40)
	for i := range objs {
		objs[i] = ckstore.Object{Path: fmt.Sprintf("images/core-%d.img", i), Size: int64(i), SHA256: fmt.Sprintf("%064x", i)}
	}
	mf := ckstore.Manifest{Format: ckstore.Format, ID: "ck0123456789", Sandbox: "sb0123456789", Kind: "full", Objects: objs}
	kr, err := ckstore.LoadKeyring(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			if _, err := mf.Encode(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sign+encode", func(b *testing.B) {
		for b.Loop() {
			m := mf
			kr.Sign(&m)
			if _, err := m.Encode(); err != nil {
				b.Fatal(err)
			}
		}
	})
	signed := mf
	kr.Sign(&signed)
	b.Run("verify signature", func(b *testing.B) {
		for b.Loop() {
			if err := kr.Check(signed); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchKey(b *testing.B) *keys.DataKey {
	raw := make([]byte, keys.KeySize)
	rand.Read(raw)
	kek, _ := keys.NewKEK(raw)
	r, err := keys.OpenRing(b.TempDir(), kek, nil)
	if err != nil {
		b.Fatal(err)
	}
	k, err := r.Current("")
	if err != nil {
		b.Fatal(err)
	}
	return k
}
