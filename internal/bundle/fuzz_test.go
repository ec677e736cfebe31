package bundle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzRead: whatever the bytes, Read returns (an error, or a bundle
// whose every check passed) and writes nothing outside its two
// directories. A valid bundle seeds it, small enough that mutations
// reach every entry.
func FuzzRead(f *testing.F) {
	fx := newFixture(f, 0)
	good := fx.bundle(f)
	f.Add(good)
	f.Add(good[:len(good)/2])
	k := fx.importer(f, true)
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		images, fs := filepath.Join(dir, "in", "images"), filepath.Join(dir, "in", "fs")
		if err := os.MkdirAll(images, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(fs, 0o700); err != nil {
			t.Fatal(err)
		}
		bd, err := Read(context.Background(), bytes.NewReader(b), images, fs, Options{Keys: k})
		if err == nil && (bd.Signer != fx.keys.KeyID() || bd.Manifest.ID != "ck1") {
			t.Fatalf("accepted a bundle of another: %+v", bd)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Fatalf("wrote beside its directories: %v", ents)
		}
	})
}
