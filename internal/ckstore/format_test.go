package ckstore

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestFormat1Unchanged: manifests as molt wrote them before this package
// existed (testdata/format1, every field set) read, and encode back
// byte for byte: existing checkpoints keep verifying and restoring, and
// a manifest rewritten after a commit is the one written before.
func TestFormat1Unchanged(t *testing.T) {
	files, _ := filepath.Glob("testdata/format1/*.json")
	if len(files) == 0 {
		t.Fatal("no golden manifests")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		mf, err := DecodeManifest(b)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out, err := mf.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("%s encodes back as\n%s", f, out)
		}
	}
}
