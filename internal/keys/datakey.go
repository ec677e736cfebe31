package keys

import (
	"bytes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"sync/atomic"

	"github.com/molt-sh/molt/internal/errdefs"
)

// DataKey is one tenant's data key, unwrapped. Three keys are derived
// from it (HKDF-SHA256), one per use: records, page contents and page
// nonces.
type DataKey struct {
	Tenant string
	ID     string

	records cipher.AEAD
	pages   cipher.AEAD
	nonce   []byte // HMAC key of the page nonces
	gone    atomic.Bool
}

func newDataKey(tenant, id string, raw []byte) (*DataKey, error) {
	derive := func(label string) ([]byte, error) {
		return hkdf.Key(sha256.New, raw, nil, "molt "+label+" v1", KeySize)
	}
	rk, err := derive("records")
	if err != nil {
		return nil, err
	}
	pk, err := derive("pages")
	if err != nil {
		return nil, err
	}
	nk, err := derive("page nonces")
	if err != nil {
		return nil, err
	}
	k := &DataKey{Tenant: tenant, ID: id, nonce: nk}
	if k.records, err = newGCM(rk); err != nil {
		return nil, err
	}
	if k.pages, err = newGCM(pk); err != nil {
		return nil, err
	}
	return k, nil
}

// forget makes the key unusable (it was shredded): a holder of the
// pointer gets errors, not plaintext.
func (k *DataKey) forget() { k.gone.Store(true) }

func (k *DataKey) usable() error {
	if k.gone.Load() {
		return fmt.Errorf("data key %s of tenant %q: %w: %w", k.ID, k.Tenant, ErrShredded, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// Sealed records: "MS1" | key ID (8 bytes) | nonce (12) | ciphertext+tag.
var recordMagic = []byte("MS1")

const idLen = 8

// Sealed reports whether b is a sealed record (Seal's output).
func Sealed(b []byte) bool {
	return len(b) >= len(recordMagic)+idLen+12+16 && bytes.HasPrefix(b, recordMagic)
}

// SealedKeyID returns the ID of the key that sealed b.
func SealedKeyID(b []byte) (string, error) {
	if !Sealed(b) {
		return "", fmt.Errorf("not a sealed record: %w", errdefs.ErrFailedPrecondition)
	}
	return hex.EncodeToString(b[len(recordMagic) : len(recordMagic)+idLen]), nil
}

// Seal encrypts a record (AES-256-GCM, random nonce) bound to aad (what
// the record is: its bucket and key, so one cannot stand for another).
func (k *DataKey) Seal(plain, aad []byte) ([]byte, error) {
	if err := k.usable(); err != nil {
		return nil, err
	}
	id, _ := hex.DecodeString(k.ID)
	out := make([]byte, 0, len(recordMagic)+idLen+12+len(plain)+16)
	out = append(out, recordMagic...)
	out = append(out, id...)
	nonce := make([]byte, 12)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out = append(out, nonce...)
	return k.records.Seal(out, nonce, plain, aad), nil
}

// Open decrypts a record k sealed with aad.
func (k *DataKey) Open(sealed, aad []byte) ([]byte, error) {
	if err := k.usable(); err != nil {
		return nil, err
	}
	id, err := SealedKeyID(sealed)
	if err != nil {
		return nil, err
	}
	if id != k.ID {
		return nil, fmt.Errorf("record sealed with key %s, not %s: %w", id, k.ID, errdefs.ErrFailedPrecondition)
	}
	h := len(recordMagic) + idLen
	p, err := k.records.Open(nil, sealed[h:h+12], sealed[h+12:], aad)
	if err != nil {
		return nil, fmt.Errorf("sealed record does not authenticate (tampered, or bound to another record): %w", errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// Open decrypts a record sealed by one of tenant's keys.
func (r *Ring) Open(tenant string, sealed, aad []byte) ([]byte, error) {
	id, err := SealedKeyID(sealed)
	if err != nil {
		return nil, err
	}
	k, err := r.Key(tenant, id)
	if err != nil {
		return nil, err
	}
	return k.Open(sealed, aad)
}

// Page encryption.
//
// A page image is encrypted page by page (4 KiB) with AES-256-GCM, and
// each page's ciphertext has the length of its plaintext: the tag and
// the nonce go to a seal beside the image (SealSize bytes per page), so
// the ciphertext keeps the page layout btrfs shares extents by.
//
// The nonce of a page is HMAC-SHA256(nonce key, plaintext) cut to 96
// bits: equal pages of one key encrypt to equal ciphertext (convergent
// encryption within the key), which is what lets the page store share
// them by the SHA-256 of the ciphertext, as it shares plaintext pages
// when encryption is off. A nonce repeats only for equal plaintext (or
// a 96-bit HMAC collision), so GCM's nonce rule holds. The tag binds the
// page to its object, its place and the object's size (the additional
// data), so pages cannot be moved, dropped or appended undetected even
// where the seal is the only check.
//
// What it leaks, to one who reads the store: which pages of one tenant
// are equal (they share extents), and nothing across tenants (other
// keys, other ciphertext).

// PageSize is the unit of page encryption (pagestore's).
const PageSize = 4096

// SealSize is the size of one page's seal: its nonce and its tag.
const SealSize = 12 + 16

// SealHeaderSize is the size of a seal file's header.
const SealHeaderSize = 8 + 8 + 8 + 8

var sealMagic = []byte("MOLTSEA1")

// PageCipher encrypts or decrypts the pages of one object. It is not
// safe for concurrent use.
type PageCipher struct {
	k       *DataKey
	name    string
	size    int64
	mac     hash.Hash
	scratch []byte
	aad     []byte
}

// Pages returns the cipher of the pages of object name, of size bytes.
func (k *DataKey) Pages(name string, size int64) *PageCipher {
	return &PageCipher{k: k, name: name, size: size, mac: hmac.New(sha256.New, k.nonce),
		scratch: make([]byte, 0, PageSize+16)}
}

func (c *PageCipher) setAAD(page int64) []byte {
	c.aad = append(c.aad[:0], "molt page v1\x00"...)
	c.aad = append(c.aad, c.name...)
	c.aad = binary.BigEndian.AppendUint64(append(c.aad, 0), uint64(c.size))
	c.aad = binary.BigEndian.AppendUint64(c.aad, uint64(page))
	return c.aad
}

// Seal encrypts page (at most PageSize bytes) in place and writes its
// seal to seal.
func (c *PageCipher) Seal(page int64, b []byte, seal *[SealSize]byte) error {
	if err := c.k.usable(); err != nil {
		return err
	}
	if len(b) > PageSize {
		return fmt.Errorf("page of %d bytes: %w", len(b), errdefs.ErrInvalidArgument)
	}
	c.mac.Reset()
	c.mac.Write(b)
	sum := c.mac.Sum(c.scratch[:0])
	copy(seal[:12], sum[:12])
	out := c.pages().Seal(c.scratch[:0], seal[:12], b, c.setAAD(page))
	copy(b, out[:len(b)])
	copy(seal[12:], out[len(b):])
	return nil
}

func (c *PageCipher) pages() cipher.AEAD { return c.k.pages }

// ErrPage is the error of a page that does not authenticate.
var ErrPage = errors.New("page does not authenticate")

// Open decrypts page in place, checking it against its seal.
func (c *PageCipher) Open(page int64, b []byte, seal []byte) error {
	if err := c.k.usable(); err != nil {
		return err
	}
	if len(b) > PageSize || len(seal) != SealSize {
		return fmt.Errorf("page %d of %s: %w", page, c.name, ErrPage)
	}
	in := append(append(c.scratch[:0], b...), seal[12:]...)
	out, err := c.pages().Open(in[:0], seal[:12], in, c.setAAD(page))
	if err != nil {
		return fmt.Errorf("page %d of %s (tampered, moved or of another key): %w: %w", page, c.name, ErrPage, errdefs.ErrFailedPrecondition)
	}
	copy(b, out)
	return nil
}

// SealHeader is the header of a seal file: what the seals are of.
func (c *PageCipher) SealHeader() []byte {
	h := make([]byte, 0, SealHeaderSize)
	h = append(h, sealMagic...)
	id, _ := hex.DecodeString(c.k.ID)
	h = append(h, id...)
	h = binary.BigEndian.AppendUint64(h, uint64(c.size))
	return binary.BigEndian.AppendUint64(h, uint64(Pages(c.size)))
}

// Pages is the number of pages of an object of size bytes (a partial
// last page counts; an empty object has none).
func Pages(size int64) int64 { return (size + PageSize - 1) / PageSize }

// ParseSealHeader reads a seal file's header: the key ID and the size of
// the object it seals. It checks the header against the seal file's
// length (sealLen): a seal file names exactly one seal per page.
func ParseSealHeader(h []byte, sealLen int64) (keyID string, size int64, err error) {
	if len(h) < SealHeaderSize || !bytes.Equal(h[:8], sealMagic) {
		return "", 0, fmt.Errorf("not a seal file: %w", errdefs.ErrFailedPrecondition)
	}
	keyID = hex.EncodeToString(h[8:16])
	s := binary.BigEndian.Uint64(h[16:24])
	n := binary.BigEndian.Uint64(h[24:32])
	if s > 1<<50 || int64(n) != Pages(int64(s)) || sealLen != SealHeaderSize+int64(n)*SealSize {
		return "", 0, fmt.Errorf("seal file header (size %d, %d pages) does not match its length %d: %w", s, n, sealLen, errdefs.ErrFailedPrecondition)
	}
	return keyID, int64(s), nil
}
