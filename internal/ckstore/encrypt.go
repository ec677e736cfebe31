package ckstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/keys"
)

// Encrypted images.
//
// With a data key, every image of a full checkpoint is stored encrypted
// page by page (keys.PageCipher: AES-256-GCM, ciphertext as long as the
// plaintext) and its pages' seals (nonce and tag each) are stored as the
// object seal/NAME: a header naming the key and the image's size, then
// one seal per page. The manifest lists the stored bytes (ciphertext and
// seals) with their hashes, so verification needs no key and reads no
// plaintext; the manifest names the key (DataKey), and its signature
// covers that.
//
// CRIU reads plaintext images from a directory: a restore decrypts them
// into memory (a tmpfs) first (Reader.Decrypt), never to the pool.

// SealDir holds the seals of an encrypted checkpoint's images (objects
// seal/NAME).
const SealDir = "seal"

// storeSeal stores the seals of image name (of size bytes) as object
// seal/NAME, through a file in staging.
func (w *Writer) storeSeal(ctx context.Context, opts PutOptions, staging, name string, c *keys.PageCipher, seals []byte, size int64) (Object, int64, error) {
	if int64(len(seals)) != keys.Pages(size)*keys.SealSize {
		return Object{}, 0, fmt.Errorf("seals of %s: %d bytes for %d pages", name, len(seals), keys.Pages(size))
	}
	tmp := filepath.Join(staging, ".seal-"+name)
	if err := os.WriteFile(tmp, append(c.SealHeader(), seals...), 0o600); err != nil {
		return Object{}, 0, err
	}
	defer os.Remove(tmp)
	opts.Sealer = nil
	sname := SealDir + "/" + name
	res, err := w.s.b.Put(ctx, w.id, sname, tmp, opts)
	if err != nil {
		return Object{}, 0, fmt.Errorf("store the seals of %s: %w", name, err)
	}
	return Object{Path: sname, Size: res.Size, SHA256: hex.EncodeToString(res.Sum[:])}, res.Written, nil
}

// Decrypt writes the plaintext of the checkpoint's images that want
// accepts (by name; nil: all) into dst, a directory in memory, checking
// each page against its seal with k, the data key the manifest names.
// objs are the checkpoint's objects as its record lists them: sizes
// come from there, never from the stored seals. It returns the bytes
// written.
func (r Reader) Decrypt(objs []Object, k *keys.DataKey, dst string, want func(name string) bool) (int64, error) {
	sizes := map[string]int64{}
	for _, o := range objs {
		sizes[o.Path] = o.Size
	}
	var total int64
	for _, o := range objs {
		name, ok := strings.CutPrefix(o.Path, ImagesDir+"/")
		if !ok || (want != nil && !want(name)) {
			continue
		}
		sealSize, ok := sizes[SealDir+"/"+name]
		if !ok {
			return total, fmt.Errorf("checkpoint %s: image %s has no seal: %w", r.id, name, errdefs.ErrFailedPrecondition)
		}
		n, err := r.decryptOne(name, o.Size, sealSize, k, filepath.Join(dst, name))
		if err != nil {
			return total, fmt.Errorf("checkpoint %s: decrypt %s: %w", r.id, name, err)
		}
		total += n
	}
	return total, nil
}

// maxSeal bounds a seal object read whole: an image of 64 GiB.
const maxSeal = keys.SealHeaderSize + (64<<30/keys.PageSize)*keys.SealSize

func (r Reader) decryptOne(name string, size, sealSize int64, k *keys.DataKey, dst string) (int64, error) {
	if sealSize != keys.SealHeaderSize+keys.Pages(size)*keys.SealSize || sealSize > maxSeal {
		return 0, fmt.Errorf("seal of %d bytes for an image of %d: %w", sealSize, size, errdefs.ErrFailedPrecondition)
	}
	sf, err := r.s.b.Open(r.id, SealDir+"/"+name)
	if err != nil {
		return 0, err
	}
	seal := make([]byte, sealSize)
	_, err = io.ReadFull(sf, seal)
	sf.Close()
	if err != nil {
		return 0, fmt.Errorf("read its seal: %w", err)
	}
	keyID, sz, err := keys.ParseSealHeader(seal[:keys.SealHeaderSize], sealSize)
	if err != nil {
		return 0, err
	}
	if keyID != k.ID || sz != size {
		return 0, fmt.Errorf("its seal names key %s and %d bytes, the checkpoint key %s and %d bytes: %w", keyID, sz, k.ID, size, errdefs.ErrFailedPrecondition)
	}
	in, err := r.s.b.Open(r.id, ImagesDir+"/"+name)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	ok := false
	defer func() {
		out.Close()
		if !ok {
			os.Remove(dst)
		}
	}()
	c := k.Pages(ImagesDir+"/"+name, size)
	buf := make([]byte, keys.PageSize)
	var done int64
	for page := int64(0); done < size; page++ {
		n := int(min(size-done, keys.PageSize))
		if _, err := io.ReadFull(in, buf[:n]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, fmt.Errorf("image shorter than its %d bytes: %w", size, errdefs.ErrFailedPrecondition)
			}
			return 0, err
		}
		off := keys.SealHeaderSize + page*keys.SealSize
		if err := c.Open(page, buf[:n], seal[off:off+keys.SealSize]); err != nil {
			return 0, err
		}
		if _, err := out.Write(buf[:n]); err != nil {
			return 0, err
		}
		done += int64(n)
	}
	ok = true
	return size, out.Close()
}
