package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeKEK writes a random key-encryption key (64 hex digits, mode
// 0600) to dir/name.
func writeKEK(dir, name string) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(hex.EncodeToString(raw)+"\n"), 0o600)
}

type dataKey struct {
	Tenant  string `json:"tenant"`
	ID      string `json:"id"`
	KEK     string `json:"kek"`
	Current bool   `json:"current"`
}

// restartWith restarts the shared daemon with kek (and prev, the key
// being rotated out: "" for none).
func restartWith(t *testing.T, kek, prev string) {
	t.Helper()
	stopDaemon()
	env.kek, env.kekPrev = kek, prev
	if err := startDaemon(); err != nil {
		t.Fatal(err)
	}
}

// TestEncryptionAtRest, through the CLI of a daemon started with
// --kek-file: a full checkpoint's images in the pool hold no plaintext
// of the sandbox's memory and name their data key; a KEK rotation
// (--kek-previous-file) re-wraps the keys and the checkpoints restore; a
// daemon with the wrong KEK refuses to restore, naming the KEK it needs;
// a data key rotation keeps old checkpoints readable; shredding makes
// them unreadable for good.
func TestEncryptionAtRest(t *testing.T) {
	orig := env.kek
	t.Cleanup(func() {
		// Back to the first KEK, re-wrapping what the test's KEK wraps
		// (the keys made after the shredding), for the tests after.
		if env.kek != orig {
			restartWith(t, orig, env.kek)
		}
		if env.kekPrev != "" {
			restartWith(t, orig, "")
		}
	})
	sb := newSandbox(t)
	secret := "sealed-" + hex.EncodeToString([]byte("at rest"))
	must(t, "exec", sb, "--session", "main", "--", "export X=one S="+secret)
	ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	var info struct {
		DataKey string `json:"data_key"`
	}
	mustJSON(t, &info, "checkpoint", "inspect", ck)
	if info.DataKey == "" {
		t.Fatal("a full checkpoint of a daemon with a KEK names no data key")
	}
	dir := filepath.Join(env.root, "pool", "checkpoints", ck)
	found := 0
	filepath.WalkDir(filepath.Join(dir, "images"), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			found++
			if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(secret)) {
				t.Errorf("%s holds the session's secret in plaintext", p)
			}
		}
		return nil
	})
	if found == 0 {
		t.Fatalf("no images under %s", dir)
	}
	var ks []dataKey
	mustJSON(t, &ks, "key", "ls")
	if len(ks) == 0 || ks[len(ks)-1].ID == "" {
		t.Fatalf("key ls: %+v", ks)
	}
	kek1 := ks[0].KEK

	// KEK rotation: the new KEK with the old one as previous.
	newKEK, err := writeKEK(filepath.Dir(orig), "kek2") // outlives the test: the clean-up needs it
	if err != nil {
		t.Fatal(err)
	}
	restartWith(t, newKEK, orig)
	mustJSON(t, &ks, "key", "ls")
	for _, k := range ks {
		if k.KEK == kek1 {
			t.Fatalf("key %s still wrapped by the rotated-out KEK", k.ID)
		}
	}
	must(t, "rollback", sb, ck, "--tier", "warm")
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X"); got != "one\n" {
		t.Fatalf("after the KEK rotation: X=%q", got)
	}

	// The wrong KEK: started, but nothing sealed restores.
	wrong, err := writeKEK(filepath.Dir(orig), "kek-wrong")
	if err != nil {
		t.Fatal(err)
	}
	restartWith(t, wrong, "")
	r := molt(t, "rollback", sb, ck, "--tier", "warm")
	if r.code == 0 || !strings.Contains(r.stderr, "key-encryption key") {
		t.Fatalf("rollback with the wrong KEK: exit %d: %s", r.code, r.stderr)
	}
	restartWith(t, newKEK, "")

	// A data key rotation: the next checkpoint gets the new key, the
	// old one still restores.
	var nk dataKey
	mustJSON(t, &nk, "key", "rotate")
	must(t, "exec", sb, "--session", "main", "--", "export X=two")
	ck2 := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	mustJSON(t, &info, "checkpoint", "inspect", ck2)
	if info.DataKey != nk.ID {
		t.Fatalf("checkpoint after the rotation sealed with %q, want %q", info.DataKey, nk.ID)
	}
	must(t, "rollback", sb, ck, "--tier", "cold")
	if got := must(t, "exec", sb, "--session", "main", "--", "echo $X"); got != "one\n" {
		t.Fatalf("after the data key rotation: X=%q", got)
	}

	// Shredding: neither checkpoint restores, on any tier.
	if r := molt(t, "key", "shred"); r.code == 0 {
		t.Fatal("key shred without --yes ran")
	}
	must(t, "key", "shred", "--yes")
	for _, c := range []string{ck, ck2} {
		for _, tier := range []string{"hot", "warm", "cold"} {
			r := molt(t, "rollback", sb, c, "--tier", tier)
			if r.code == 0 || !strings.Contains(r.stderr, "shredded") {
				t.Fatalf("%s rollback to %s after the shred: exit %d: %s", tier, c, r.code, r.stderr)
			}
		}
	}
	// New checkpoints get a new key and restore.
	ck3 := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full", "--wait"))
	must(t, "rollback", sb, ck3, "--tier", "warm")
}
