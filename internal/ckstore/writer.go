package ckstore

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/keys"
	"github.com/molt-sh/molt/internal/pagestore"
)

// Writer writes one checkpoint's artifact: objects first, the manifest
// last (Commit). Until the manifest is written the artifact is not
// complete: List leaves it out and nothing restores from it.
type Writer struct {
	s  *Store
	id string
}

// Create starts the artifact of checkpoint id.
func (s *Store) Create(id string) (*Writer, error) {
	if err := s.b.Create(id); err != nil {
		return nil, err
	}
	return s.Writer(id), nil
}

// Writer returns the writer of the artifact of checkpoint id, which
// Create started (the capture creates it, a background job stores it).
func (s *Store) Writer(id string) *Writer { return &Writer{s: s, id: id} }

// StoreImages moves CRIU's images from staging into the checkpoint
// through the backend (with the local one, known pages shared by
// reflink: x indexes them), with a hash file per multi-page image for
// later indexes. It returns the stored objects (hashed on the way, not
// read again), sorted by path, and the bytes written. yield is called
// with the bytes written as the puts go. With a data key k, the images
// are stored encrypted, each with its seals (encrypt.go).
func (w *Writer) StoreImages(ctx context.Context, staging string, x *pagestore.Index, yield func(int64) error, k *keys.DataKey) ([]Object, int64, error) {
	ents, err := os.ReadDir(staging)
	if err != nil {
		return nil, 0, err
	}
	if x == nil {
		x = pagestore.NewIndex()
	}
	opts := PutOptions{Index: x, Yield: yield}
	var objs []Object
	var written int64
	for _, e := range ents {
		// Every image goes through the page store: memory pages above
		// all, but the larger metadata images (mm, pagemap, core) of an
		// unchanged process repeat whole pages too.
		name := ImagesDir + "/" + e.Name()
		src := filepath.Join(staging, e.Name())
		var c *keys.PageCipher
		if k != nil {
			fi, err := os.Stat(src)
			if err != nil {
				return nil, 0, err
			}
			c = k.Pages(name, fi.Size())
			opts.Sealer = c
		}
		res, err := w.s.b.Put(ctx, w.id, name, src, opts)
		opts.Sealer = nil
		if err != nil {
			return nil, 0, fmt.Errorf("store %s: %w", e.Name(), err)
		}
		written += res.Written
		objs = append(objs, Object{Path: name, Size: res.Size, SHA256: hex.EncodeToString(res.Sum[:])})
		if c != nil {
			o, n, err := w.storeSeal(ctx, opts, staging, e.Name(), c, res.Seals, res.Size)
			if err != nil {
				return nil, 0, err
			}
			objs = append(objs, o)
			written += n
		}
		if res.Pages > 1 {
			// The hash file goes through the page store as well: most of
			// it repeats the parent's.
			tmp := filepath.Join(staging, ".pagehash-"+e.Name())
			if err := os.WriteFile(tmp, res.Hashes, 0o600); err != nil {
				return nil, 0, err
			}
			hname := PageHashDir + "/" + e.Name()
			hres, err := w.s.b.Put(ctx, w.id, hname, tmp, opts)
			os.Remove(tmp)
			if err != nil {
				return nil, 0, fmt.Errorf("store page hashes of %s: %w", e.Name(), err)
			}
			objs = append(objs, Object{Path: hname, Size: hres.Size, SHA256: hex.EncodeToString(hres.Sum[:])})
			written += hres.Written
		}
	}
	sort.Slice(objs, func(i, j int) bool { return objs[i].Path < objs[j].Path })
	return objs, written, nil
}

// Commit writes the manifest, which completes the artifact, and returns
// its bytes. It is written last of the stored bytes: an artifact with a
// manifest has every object the manifest lists.
func (w *Writer) Commit(mf Manifest) ([]byte, error) {
	if mf.ID != w.id {
		return nil, fmt.Errorf("manifest of checkpoint %q written to %q: %w", mf.ID, w.id, errdefs.ErrInvalidArgument)
	}
	if k := w.s.keys; k != nil {
		k.Sign(&mf)
	}
	b, err := mf.Encode()
	if err != nil {
		return nil, err
	}
	return b, w.s.b.PutManifest(w.id, b)
}
