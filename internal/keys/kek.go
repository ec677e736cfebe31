// Package keys holds the keys of encryption at rest: the key-encryption
// key (KEK) a provider gives the daemon, and a data key (DEK) per tenant
// wrapped by it.
//
// The hierarchy is the usual envelope: data is encrypted with a tenant's
// DEK; the DEK is stored only wrapped (AES-256-GCM) by the KEK; the KEK
// never touches the disk molt writes (it comes from a file the operator
// provides, an environment variable, or a KMS behind the KEK interface).
//
//   - Rotating the KEK re-wraps the DEKs (a few hundred bytes per
//     tenant) and rewrites no data: OpenRing does it for a daemon started
//     with the new KEK and the previous one.
//   - Rotating a tenant's DEK (Ring.Rotate) makes a new DEK the one new
//     data is sealed with; the old ones stay, to read what they sealed.
//   - Crypto-shredding (Ring.Shred) deletes a tenant's wrapped DEKs:
//     every byte sealed with them is unreadable from then on, wherever
//     copies of it went.
//
// Each DEK has a random ID that sealed data names (never the key), so a
// shredded or foreign key is reported as such and not as corruption.
// docs/security.md has the storage threat model.
package keys

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/molt-sh/molt/internal/errdefs"
)

// KeySize is the size of a KEK and of a DEK: 256 bits.
const KeySize = 32

// KEK wraps and unwraps data keys. A KMS-backed provider implements it
// with remote calls: the KEK itself then never leaves the KMS.
type KEK interface {
	// ID names this KEK (not secret): wrapped keys record it, so a
	// daemon started with another KEK says so instead of failing to
	// decrypt.
	ID() string
	// Wrap encrypts dek, bound to aad.
	Wrap(dek, aad []byte) ([]byte, error)
	// Unwrap decrypts what Wrap returned for the same aad.
	Unwrap(wrapped, aad []byte) ([]byte, error)
}

// localKEK is a KEK held in memory (from a file or the environment).
type localKEK struct {
	id   string
	aead cipher.AEAD
}

// NewKEK returns the KEK of the 32 bytes key.
func NewKEK(key []byte) (KEK, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("a key-encryption key is %d bytes, not %d: %w", KeySize, len(key), errdefs.ErrInvalidArgument)
	}
	a, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	// The ID is a hash of the key under a label of its own: it tells
	// keys apart and reveals nothing of them.
	h := sha256.Sum256(append([]byte("molt kek id\x00"), key...))
	return &localKEK{id: "local:" + hex.EncodeToString(h[:8]), aead: a}, nil
}

// FileKEK reads a KEK from path: 32 raw bytes, or 64 hex digits (a
// trailing newline is allowed). The file must not be readable by group
// or others.
func FileKEK(path string) (KEK, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("key-encryption key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("key-encryption key %s is readable by others (mode %v): chmod 600 it: %w", path, fi.Mode().Perm(), errdefs.ErrInvalidArgument)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key-encryption key: %w", err)
	}
	k, err := parseKey(b)
	if err != nil {
		return nil, fmt.Errorf("key-encryption key %s: %w", path, err)
	}
	return NewKEK(k)
}

// EnvKEK reads a KEK from the environment variable name (64 hex digits,
// or base64 of 32 bytes is not accepted: one encoding, no guessing).
func EnvKEK(name string) (KEK, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return nil, fmt.Errorf("key-encryption key: environment variable %s is not set: %w", name, errdefs.ErrInvalidArgument)
	}
	k, err := parseKey([]byte(v))
	if err != nil {
		return nil, fmt.Errorf("key-encryption key in $%s: %w", name, err)
	}
	return NewKEK(k)
}

// parseKey accepts 32 raw bytes or 64 hex digits, with an optional
// trailing newline.
func parseKey(b []byte) ([]byte, error) {
	if len(b) == KeySize {
		return b, nil
	}
	s := strings.TrimRight(string(b), "\r\n")
	if len(s) == 2*KeySize {
		if k, err := hex.DecodeString(s); err == nil {
			return k, nil
		}
	}
	return nil, fmt.Errorf("want %d bytes or %d hex digits, have %d bytes: %w", KeySize, 2*KeySize, len(b), errdefs.ErrInvalidArgument)
}

func (k *localKEK) ID() string { return k.id }

func (k *localKEK) Wrap(dek, aad []byte) ([]byte, error) {
	nonce := make([]byte, k.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return k.aead.Seal(nonce, nonce, dek, aad), nil
}

func (k *localKEK) Unwrap(w, aad []byte) ([]byte, error) {
	n := k.aead.NonceSize()
	if len(w) < n+k.aead.Overhead() {
		return nil, errors.New("wrapped key too short")
	}
	return k.aead.Open(nil, w[:n], w[n:], aad)
}

func newGCM(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}
