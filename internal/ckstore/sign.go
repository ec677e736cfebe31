package ckstore

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/molt-sh/molt/internal/atomicfile"
	"github.com/molt-sh/molt/internal/errdefs"
)

// Signed, chained manifests.
//
// Every manifest a host writes is signed with the host's ed25519 key and
// names its parent's content digest, so a sandbox's lineage is a hash
// chain that no one without a trusted key can alter undetected:
//
//   - Digest is SHA-256 over the manifest's content: what the checkpoint
//     is (its IDs, kind, image, objects with their hashes, the namespaces
//     it leaves out, its ledger head and turn), encoded as canonical JSON
//     (the Manifest struct's field order) with the parent link, the
//     signature and the descriptive fields left out (label, committed,
//     keep, capture, stall and duration figures, bytes written: they are
//     about how the checkpoint was taken, and some are written after
//     the commit).
//   - The signature covers the content digest and the parent link
//     (Parent, ParentDigest): SignedBytes.
//   - ParentDigest is the parent's content digest, not its signed bytes:
//     when a checkpoint is deleted its children move up, and only they
//     are signed again, with the new parent's digest; their own digests
//     do not change, so nothing below them is.
//
// Verifying a link checks the signature with a trusted key and that
// ParentDigest is the digest of the parent's manifest as it is now.
// Deleting a checkpoint in the middle of a lineage is a host's act and
// leaves a valid chain; swapping, reordering or editing a manifest
// without the key does not.

// Signature is a manifest's signature.
type Signature struct {
	// Key names the signing key: "ed25519:" and the first 16 hex digits
	// of the SHA-256 of the public key.
	Key string `json:"key"`
	Sig string `json:"sig"` // base64 of the ed25519 signature of SignedBytes
}

// content is the part of a manifest its digest covers.
func (mf Manifest) content() Manifest {
	c := mf
	c.Parent, c.ParentDigest, c.Signature = "", "", nil
	c.Label, c.Committed, c.Keep, c.Capture, c.CaptureNote = "", false, false, "", ""
	c.StallMS, c.StallParts, c.DurationMS, c.BytesWritten = 0, nil, 0, 0
	return c
}

// Digest is the hex SHA-256 of the manifest's content (see the package
// comment above).
func (mf Manifest) Digest() string {
	b, err := json.Marshal(mf.content())
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// SignedBytes is what a manifest's signature signs: its content digest
// and its parent link.
func (mf Manifest) SignedBytes() []byte {
	return []byte("molt-manifest-v1\x00" + mf.Digest() + "\x00" + mf.Parent + "\x00" + mf.ParentDigest)
}

// Keyring is a host's signing key and the keys it trusts. Trust may
// grow while it is in use (Trust); it never shrinks: a key trusted once
// signed checkpoints that stay.
type Keyring struct {
	priv ed25519.PrivateKey
	id   string
	// dir is where host.key is, trusted/ beneath it.
	dir string
	mu  sync.RWMutex
	// +checklocks:mu
	trusted map[string]ed25519.PublicKey
}

// KeyID names a public key.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "ed25519:" + hex.EncodeToString(sum[:8])
}

const (
	privPEM = "MOLT HOST KEY"
	pubPEM  = "MOLT PUBLIC KEY"
)

// LoadKeyring loads the host key from dir (host.key), making it on first
// use (mode 0600, with host.pub next to it for other hosts to trust),
// and trusts it, the public keys in dir/trusted/*.pub and the files in
// extra.
func LoadKeyring(dir string, extra []string) (*Keyring, error) {
	if err := os.MkdirAll(filepath.Join(dir, "trusted"), 0o700); err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, "host.key")
	b, err := os.ReadFile(keyFile)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, gerr := ed25519.GenerateKey(rand.Reader)
		if gerr != nil {
			return nil, gerr
		}
		b = pem.EncodeToMemory(&pem.Block{Type: privPEM, Bytes: priv.Seed()})
		if err := atomicfile.Write(keyFile, b, 0o600); err != nil {
			return nil, fmt.Errorf("host key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != privPEM || len(blk.Bytes) != ed25519.SeedSize {
		return nil, fmt.Errorf("host key %s: not a %s PEM block of a %d-byte seed", keyFile, privPEM, ed25519.SeedSize)
	}
	priv := ed25519.NewKeyFromSeed(blk.Bytes)
	pub := priv.Public().(ed25519.PublicKey)
	k := &Keyring{priv: priv, id: KeyID(pub), dir: dir, trusted: map[string]ed25519.PublicKey{KeyID(pub): pub}}
	if err := atomicfile.Write(filepath.Join(dir, "host.pub"), EncodePublicKey(pub), 0o644); err != nil {
		return nil, fmt.Errorf("host public key: %w", err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "trusted", "*.pub"))
	for _, f := range append(files, extra...) {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("trusted key: %w", err)
		}
		pk, err := DecodePublicKey(b)
		if err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", f, err)
		}
		k.trusted[KeyID(pk)] = pk // +checklocksignore: not shared yet
	}
	return k, nil
}

// PublicKey is the host key's public half, as host.pub holds it.
func (k *Keyring) PublicKey() []byte {
	return EncodePublicKey(k.priv.Public().(ed25519.PublicKey))
}

// Trust trusts the public key pemKey (EncodePublicKey's form) from now
// on, and on every start: it is written to trusted/ as NAME.pub. It
// returns the key's name, and whether it was not trusted before.
func (k *Keyring) Trust(pemKey []byte) (string, bool, error) {
	pub, err := DecodePublicKey(pemKey)
	if err != nil {
		return "", false, fmt.Errorf("trust: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	id := KeyID(pub)
	if k.dir == "" {
		return "", false, fmt.Errorf("trust %s: the keyring has no directory: %w", id, errdefs.ErrFailedPrecondition)
	}
	file := filepath.Join(k.dir, "trusted", strings.TrimPrefix(id, "ed25519:")+".pub")
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.trusted[id]; ok {
		return id, false, nil
	}
	if err := atomicfile.Write(file, EncodePublicKey(pub), 0o644); err != nil {
		return "", false, fmt.Errorf("trust %s: %w", id, err)
	}
	k.trusted[id] = pub
	return id, true, nil
}

// EncodePublicKey is a public key as host.pub holds it.
func EncodePublicKey(pub ed25519.PublicKey) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pubPEM, Bytes: pub})
}

// DecodePublicKey reads a public key written by EncodePublicKey.
func DecodePublicKey(b []byte) (ed25519.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != pubPEM || len(blk.Bytes) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("not a %s PEM block of a %d-byte key", pubPEM, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(blk.Bytes), nil
}

// KeyID is the host key's name.
func (k *Keyring) KeyID() string { return k.id }

// Trusted lists the names of the keys k trusts, sorted.
func (k *Keyring) Trusted() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]string, 0, len(k.trusted))
	for id := range k.trusted {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Sign signs mf with the host key.
func (k *Keyring) Sign(mf *Manifest) {
	mf.Signature = &Signature{Key: k.id, Sig: base64.StdEncoding.EncodeToString(ed25519.Sign(k.priv, mf.SignedBytes()))}
}

// ErrUnsigned is returned for a manifest without a signature.
var ErrUnsigned = errors.New("manifest is not signed")

// Check verifies mf's signature with a key k trusts.
func (k *Keyring) Check(mf Manifest) error {
	s := mf.Signature
	if s == nil {
		return fmt.Errorf("checkpoint %s: %w", mf.ID, ErrUnsigned)
	}
	pub, ok := k.trustedKey(s.Key)
	if !ok {
		return fmt.Errorf("checkpoint %s: signed by %s, a key this host does not trust: %w", mf.ID, s.Key, errdefs.ErrFailedPrecondition)
	}
	sig, err := base64.StdEncoding.DecodeString(s.Sig)
	if err != nil || !ed25519.Verify(pub, mf.SignedBytes(), sig) {
		return fmt.Errorf("checkpoint %s: the manifest's signature does not verify (edited after it was signed): %w", mf.ID, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Link is one checkpoint of a verified lineage.
type Link struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
	Key    string `json:"key,omitempty"`
	// Problem says what is wrong with this link ("" when it holds).
	Problem string `json:"problem,omitempty"`
}

// VerifyChain walks the lineage of checkpoint id up to its root, as the
// engine's records give each parent (parentOf), and checks every link:
// the manifest reads, is this checkpoint's, names the recorded parent,
// is signed by a trusted key, and names its parent's current content
// digest. It returns every link, the broken ones with their problem,
// and an error naming the first broken link.
func (s *Store) VerifyChain(k *Keyring, id string, parentOf func(id string) (string, bool)) ([]Link, error) {
	var links []Link
	seen := map[string]bool{}
	for cur := id; cur != "" && !seen[cur]; {
		seen[cur] = true
		l := Link{ID: cur}
		mf, err := s.ReadManifest(cur)
		parent, known := parentOf(cur)
		l.Parent = parent
		switch {
		case err != nil:
			l.Problem = "manifest: " + err.Error()
		case mf.ID != cur:
			l.Problem = fmt.Sprintf("the manifest is checkpoint %s's", mf.ID)
		case !known:
			l.Problem = "no record of this checkpoint"
		case mf.Parent != parent:
			l.Problem = fmt.Sprintf("the manifest names parent %q, the record %q", mf.Parent, parent)
		}
		if l.Problem == "" {
			if mf.Signature != nil {
				l.Key = mf.Signature.Key
			}
			if err := k.Check(mf); err != nil {
				l.Problem = strings.TrimPrefix(err.Error(), "checkpoint "+cur+": ")
			} else if parent != "" {
				pm, err := s.ReadManifest(parent)
				switch {
				case err != nil:
					l.Problem = "parent's manifest: " + err.Error()
				case mf.ParentDigest != pm.Digest():
					l.Problem = fmt.Sprintf("names parent digest %.12s..., the parent's manifest is %.12s... (the parent was replaced or edited)", mf.ParentDigest, pm.Digest())
				}
			} else if mf.ParentDigest != "" {
				l.Problem = "a root naming a parent digest"
			}
		}
		links = append(links, l)
		cur = parent
	}
	for _, l := range links {
		if l.Problem != "" {
			return links, fmt.Errorf("checkpoint %s's lineage is broken at %s: %s: %w", id, l.ID, l.Problem, errdefs.ErrFailedPrecondition)
		}
	}
	return links, nil
}

// ErrUntrusted is returned for a signature by a key this host does not
// trust (its error names the key).
var ErrUntrusted = errors.New("untrusted key")

// SignBytes signs b, which names what it is (a domain prefix of its
// own, so that no signature of one kind verifies as another), with the
// host key.
func (k *Keyring) SignBytes(b []byte) Signature {
	return Signature{Key: k.id, Sig: base64.StdEncoding.EncodeToString(ed25519.Sign(k.priv, b))}
}

// CheckBytes verifies s over b with a key k trusts. A key k does not
// trust is refused with ErrUntrusted, "untrusted key NAME".
func (k *Keyring) CheckBytes(s Signature, b []byte) error {
	pub, ok := k.trustedKey(s.Key)
	if !ok {
		return fmt.Errorf("%w %s (this host trusts %s; trust another host by copying its keys/host.pub into ROOT/keys/trusted/): %w", ErrUntrusted, s.Key, strings.Join(k.Trusted(), ", "), errdefs.ErrFailedPrecondition)
	}
	sig, err := base64.StdEncoding.DecodeString(s.Sig)
	if err != nil || !ed25519.Verify(pub, b, sig) {
		return fmt.Errorf("the signature by %s does not verify (edited after it was signed): %w", s.Key, errdefs.ErrFailedPrecondition)
	}
	return nil
}

func (k *Keyring) trustedKey(id string) (ed25519.PublicKey, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	pub, ok := k.trusted[id]
	return pub, ok
}
