package ckstore

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
)

// chainStore is a store with a keyring and a lineage a <- b <- c of
// full checkpoints whose records (parents) the test controls.
type chainStore struct {
	s       *Store
	k       *Keyring
	parents map[string]string
}

func obj(n byte) Object {
	return Object{Path: "images/pages-1.img", Size: int64(n), SHA256: strings.Repeat(string('a'+n%6), 64)}
}

func newChain(t *testing.T) *chainStore {
	t.Helper()
	k, err := LoadKeyring(filepath.Join(t.TempDir(), "keys"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := &chainStore{s: New(NewLocal(t.TempDir())), k: k, parents: map[string]string{}}
	cs.s.SetKeyring(k)
	for i, id := range []string{"a", "b", "c"} {
		parent := ""
		if i > 0 {
			parent = []string{"a", "b", "c"}[i-1]
		}
		cs.write(t, id, parent, byte(i+1))
	}
	return cs
}

// write stores checkpoint id's manifest, linked to parent as the engine
// links it.
func (cs *chainStore) write(t *testing.T, id, parent string, n byte) Manifest {
	t.Helper()
	if _, err := os.Stat(cs.s.Dir(id)); err != nil {
		if _, err := cs.s.Create(id); err != nil {
			t.Fatal(err)
		}
	}
	mf := Manifest{Format: Format, ID: id, Sandbox: "sb", Parent: parent, Kind: v1.KindFull, Image: "debian",
		Created: time.Date(2026, 1, 1, 0, 0, int(n), 0, time.UTC), Objects: []Object{obj(n)}, Label: "l" + id}
	if parent != "" {
		pm, err := cs.s.ReadManifest(parent)
		if err != nil {
			t.Fatal(err)
		}
		mf.ParentDigest = pm.Digest()
	}
	if _, err := cs.s.Writer(id).Commit(mf); err != nil {
		t.Fatal(err)
	}
	cs.parents[id] = parent
	return mf
}

func (cs *chainStore) verify(id string) ([]Link, error) {
	return cs.s.VerifyChain(cs.k, id, func(id string) (string, bool) {
		p, ok := cs.parents[id]
		return p, ok
	})
}

// edit rewrites checkpoint id's manifest file with fn applied to its
// text, as someone without the key would.
func (cs *chainStore) edit(t *testing.T, id string, fn func(string) string) {
	t.Helper()
	p := filepath.Join(cs.s.Dir(id), ManifestFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	nb := fn(string(b))
	if nb == string(b) {
		t.Fatalf("the edit of %s changed nothing", id)
	}
	if err := os.WriteFile(p, []byte(nb), 0o600); err != nil {
		t.Fatal(err)
	}
}

func brokenAt(t *testing.T, links []Link, err error, id, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("lineage verified; want it broken at %s (%s)", id, want)
	}
	for _, l := range links {
		if l.ID == id {
			if !strings.Contains(l.Problem, want) {
				t.Fatalf("link %s: problem %q, want %q", id, l.Problem, want)
			}
			return
		}
	}
	t.Fatalf("no link %s in %+v", id, links)
}

// A lineage whose manifests are as the host signed them verifies, link
// by link; descriptive fields are outside the signature.
func TestChainVerifies(t *testing.T) {
	cs := newChain(t)
	links, err := cs.verify("c")
	if err != nil || len(links) != 3 || links[0].ID != "c" || links[2].ID != "a" || links[1].Key != cs.k.KeyID() {
		t.Fatalf("links %+v, err %v", links, err)
	}
	cs.edit(t, "b", func(s string) string { return strings.Replace(s, `"label": "lb"`, `"label": "renamed"`, 1) })
	if _, err := cs.verify("c"); err != nil {
		t.Fatalf("a label changed the chain: %v", err)
	}
}

// Each kind of tampering is refused, naming the broken link.
func TestChainTamper(t *testing.T) {
	for _, c := range []struct {
		name, at, want string
		tamper         func(t *testing.T, cs *chainStore)
	}{
		{"an object's hash edited", "b", "does not verify", func(t *testing.T, cs *chainStore) {
			cs.edit(t, "b", func(s string) string { return strings.Replace(s, strings.Repeat("c", 64), strings.Repeat("f", 64), 1) })
		}},
		{"the kernel edited", "a", "does not verify", func(t *testing.T, cs *chainStore) {
			cs.edit(t, "a", func(s string) string { return strings.Replace(s, `"kernel": ""`, `"kernel": "6.1"`, 1) })
		}},
		{"the signature removed", "c", "not signed", func(t *testing.T, cs *chainStore) {
			cs.edit(t, "c", func(s string) string {
				return s[:strings.Index(s, `,
  "signature"`)] + "\n}"
			})
		}},
		{"the parent replaced by a re-signed one", "c", "parent digest", func(t *testing.T, cs *chainStore) {
			cs.write(t, "b", "a", 9) // another b, signed by the host itself
		}},
		{"a parent removed from the records", "c", "names parent", func(t *testing.T, cs *chainStore) {
			cs.parents["c"] = "a"
		}},
		{"two checkpoints swapped", "c", "checkpoint b's", func(t *testing.T, cs *chainStore) {
			bm, _ := os.ReadFile(filepath.Join(cs.s.Dir("b"), ManifestFile))
			os.WriteFile(filepath.Join(cs.s.Dir("c"), ManifestFile), bm, 0o600)
		}},
		{"a parent's digest edited", "c", "does not verify", func(t *testing.T, cs *chainStore) {
			mf, _ := cs.s.ReadManifest("c")
			cs.edit(t, "c", func(s string) string { return strings.Replace(s, mf.ParentDigest, strings.Repeat("0", 64), 1) })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cs := newChain(t)
			c.tamper(t, cs)
			links, err := cs.verify("c")
			brokenAt(t, links, err, c.at, c.want)
		})
	}
}

// A checkpoint deleted in the middle: its child, signed again with the
// new parent's digest, keeps the chain valid, and nothing below the
// child is signed again (its digest does not change).
func TestChainAfterDelete(t *testing.T) {
	cs := newChain(t)
	before, _ := cs.s.ReadManifest("c")
	cs.write(t, "c", "a", 3)
	delete(cs.parents, "b")
	after, _ := cs.s.ReadManifest("c")
	if before.Digest() != after.Digest() {
		t.Fatal("re-linking changed the child's digest")
	}
	if _, err := cs.verify("c"); err != nil {
		t.Fatal(err)
	}
}

// A manifest signed by another host's key is refused until this host
// trusts that key; the host key persists across loads.
func TestUntrustedKey(t *testing.T) {
	cs := newChain(t)
	dir := filepath.Join(t.TempDir(), "other")
	other, err := LoadKeyring(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	mf, _ := cs.s.ReadManifest("c")
	other.Sign(&mf)
	b, _ := mf.Encode()
	os.WriteFile(filepath.Join(cs.s.Dir("c"), ManifestFile), b, 0o600)
	links, err := cs.verify("c")
	brokenAt(t, links, err, "c", "does not trust")

	trusting, err := LoadKeyring(filepath.Join(filepath.Dir(cs.s.Dir("a")), "..", "keys2"), []string{filepath.Join(dir, "host.pub")})
	if err != nil {
		t.Fatal(err)
	}
	if err := trusting.Check(mf); err != nil {
		t.Fatalf("with the other host's key trusted: %v", err)
	}
	again, err := LoadKeyring(dir, nil)
	if err != nil || again.KeyID() != other.KeyID() {
		t.Fatalf("reloaded key %s, was %s (%v)", again.KeyID(), other.KeyID(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "host.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("host.key: %v %v", fi.Mode(), err)
	}
}

// A restore reads the manifest: a signed one that does not verify, or
// whose objects are not the engine record's, is refused; an unsigned
// one (written before signing) is vouched for by the record.
func TestRestoreChecksTheSignature(t *testing.T) {
	cs := newChain(t)
	r := cs.s.Reader("b")
	if err := r.checkManifest([]Object{obj(2)}, true); err != nil {
		t.Fatal(err)
	}
	if err := r.checkManifest([]Object{obj(5)}, true); err == nil || !strings.Contains(err.Error(), "different objects") {
		t.Fatalf("record and manifest disagree: %v", err)
	}
	cs.edit(t, "b", func(s string) string { return strings.Replace(s, `"image": "debian"`, `"image": "evil"`, 1) })
	if err := r.checkManifest([]Object{obj(2)}, true); err == nil || !strings.Contains(err.Error(), "does not verify") {
		t.Fatalf("edited manifest: %v", err)
	}
	mf, _ := cs.s.ReadManifest("a")
	mf.Signature = nil
	b, _ := mf.Encode()
	os.WriteFile(filepath.Join(cs.s.Dir("a"), ManifestFile), b, 0o600)
	if err := cs.s.Reader("a").checkManifest([]Object{obj(1)}, true); err != nil {
		t.Fatalf("unsigned manifest: %v", err)
	}
	if !bytes.Contains(EncodePublicKey(cs.k.trusted[cs.k.KeyID()]), []byte("MOLT PUBLIC KEY")) {
		t.Fatal("public key encoding")
	}
}

// TestTrust: a key trusted at run time checks signatures at once and
// after a reload; trusting it again adds nothing; junk is refused.
func TestTrust(t *testing.T) {
	a, err := LoadKeyring(filepath.Join(t.TempDir(), "keys"), nil)
	if err != nil {
		t.Fatal(err)
	}
	dirB := filepath.Join(t.TempDir(), "keys")
	b, err := LoadKeyring(dirB, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("molt-test\x00hello")
	sig := a.SignBytes(msg)
	if err := b.CheckBytes(sig, msg); err == nil {
		t.Fatal("a key not trusted checked a signature")
	}
	id, added, err := b.Trust(a.PublicKey())
	if err != nil || !added || id != a.KeyID() {
		t.Fatalf("trust: %q %v %v, want %s added", id, added, err, a.KeyID())
	}
	if err := b.CheckBytes(sig, msg); err != nil {
		t.Fatalf("after trust: %v", err)
	}
	if _, added, err := b.Trust(a.PublicKey()); err != nil || added {
		t.Fatalf("trusted again: added %v, %v", added, err)
	}
	if _, _, err := b.Trust([]byte("not a key")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("junk: %v", err)
	}
	again, err := LoadKeyring(dirB, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.CheckBytes(sig, msg); err != nil {
		t.Fatalf("after a reload: %v", err)
	}
	if got := again.Trusted(); len(got) != 2 {
		t.Fatalf("trusted after a reload: %v", got)
	}
}
