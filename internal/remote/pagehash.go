package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/pagestore"
)

// A full checkpoint keeps, beside each page image, the SHA-256 of each
// of its pages (ckstore.PageHashDir), computed when the dump was stored.
// Those are the chunks' names here too, so an upload need not read a
// page the store has: it reads the hash file (checked against the
// SHA-256 the checkpoint lists for it), names each known page by its
// hash, and reads only the others, each of which must hash to what the
// file says. Most of an upload of a checkpoint whose pages the store
// has was hashing every page again (docs/storage.md, "Uploads").
//
// What the store gets is what the checkpoint's record says: the record
// lists the hash file's SHA-256, the hash file each page's, and a
// restore checks the whole image against its SHA-256 as before. A local
// page that rotted after the dump and that the store has is not read,
// so not noticed here; the local restore's check still refuses it.

// maxHashFile bounds the hash file read for one image (a 64 GiB image).
const maxHashFile = 512 << 20

// pageHashes reads the page hashes of src's page images from their hash
// files, checked against the SHA-256s the checkpoint lists. An image
// whose hash file is missing or does not fit it is read whole (object).
// A hash file whose bytes are not those listed fails.
func (s *Store) pageHashes(src Source) (map[string][]byte, error) {
	if s.readWhole {
		return nil, nil
	}
	dir, objs := src.Dir, src.Objects
	listed := map[string]ckstore.Object{}
	for _, o := range objs {
		listed[o.Path] = o
	}
	out := map[string][]byte{}
	for _, o := range objs {
		if chunkSize(o.Path) != pagestore.PageSize || o.Size%pagestore.PageSize != 0 {
			continue
		}
		h, ok := listed[ckstore.PageHashDir+"/"+path.Base(o.Path)]
		if !ok || h.Size != o.Size/pagestore.PageSize*pagestore.HashSize || h.Size > maxHashFile {
			continue
		}
		b, err := readChecked(filepath.Join(dir, h.Path), h)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", h.Path, err)
		}
		out[o.Path] = b
	}
	return out, nil
}

// readChecked reads object o from file, which must hold its bytes.
func readChecked(file string, o ckstore.Object) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, o.Size+1))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	if int64(len(b)) != o.Size || !strings.EqualFold(hex.EncodeToString(sum[:]), o.SHA256) {
		return nil, fmt.Errorf("its bytes are not the %d bytes of SHA-256 %s the checkpoint lists: %w", o.Size, o.SHA256, errCorrupt)
	}
	return b, nil
}

// pageRun bounds the pages an upload reads at once.
const pageRun = objectBlock / pagestore.PageSize

// objectByHashes is object for a page image whose page hashes are
// hashes: a page the store (or the pack being filled) has is named by
// its hash unread; runs of the others are read, hashed and checked.
func (p *packer) objectByHashes(ctx context.Context, file string, o ckstore.Object, hashes []byte) ([]*Extent, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if fi.Size() != o.Size {
		return nil, fmt.Errorf("its %d bytes are not the %d bytes the checkpoint lists: %w", fi.Size(), o.Size, errCorrupt)
	}
	pages := int(o.Size / pagestore.PageSize)
	sum := func(i int) (h [sha256.Size]byte) {
		copy(h[:], hashes[i*pagestore.HashSize:])
		return h
	}
	ex := make([]*Extent, 0, pages)
	buf := make([]byte, pageRun*pagestore.PageSize)
	for i := 0; i < pages; {
		if e, ok := p.known(sum(i), pagestore.PageSize); ok {
			p.stats.Chunks++
			p.stats.SharedBytes += pagestore.PageSize
			ex = append(ex, e)
			i++
			continue
		}
		// A run of pages the store lacks: read at once, then added in
		// order (a page may repeat one earlier in the run).
		n := 1
		for n < pageRun && i+n < pages {
			if p.has(sum(i+n), pagestore.PageSize) {
				break
			}
			n++
		}
		b := buf[:n*pagestore.PageSize]
		if _, err := f.ReadAt(b, int64(i)*pagestore.PageSize); err != nil {
			return nil, err
		}
		p.stats.ReadBytes += int64(len(b))
		for j, got := range pagestore.Sums(b, pagestore.PageSize) {
			want := sum(i + j)
			if !bytes.Equal(got[:], want[:]) {
				return nil, fmt.Errorf("page %d is not the page its hash file lists: %w", i+j, errCorrupt)
			}
			e, _, err := p.addSum(ctx, b[j*pagestore.PageSize:(j+1)*pagestore.PageSize], want)
			if err != nil {
				return nil, err
			}
			ex = append(ex, e)
		}
		i += n
	}
	return ex, nil
}

// A Warmer sends the store pages ahead of the checkpoint that will hold
// them: pages read from a running sandbox's memory (internal/procmem)
// before a migration freezes it. They go into packs no recipe names
// yet, so that the final checkpoint's upload, in the frozen window,
// finds them known and sends only what changed since. Packs nothing
// comes to name are a GC's to delete, as those of a failed upload are.
type Warmer struct {
	p  *packer
	st Stats
}

// Warmer starts sending pages ahead.
func (s *Store) Warmer(ctx context.Context) (*Warmer, error) {
	if err := s.syncGC(ctx); err != nil {
		return nil, err
	}
	w := &Warmer{}
	w.p = &packer{s: s, stats: &w.st}
	return w, nil
}

// Add sends the pages of b (whole pages) the store lacks.
func (w *Warmer) Add(ctx context.Context, b []byte) error {
	if len(b)%pagestore.PageSize != 0 {
		return fmt.Errorf("store: %d bytes are not whole pages", len(b))
	}
	for i, sum := range pagestore.Sums(b, pagestore.PageSize) {
		if w.p.has(sum, pagestore.PageSize) {
			w.st.Chunks++
			w.st.SharedBytes += pagestore.PageSize
			continue
		}
		if _, _, err := w.p.addSum(ctx, b[i*pagestore.PageSize:(i+1)*pagestore.PageSize], sum); err != nil {
			return err
		}
	}
	return nil
}

// Close sends the last pack and reports what went.
func (w *Warmer) Close(ctx context.Context) (Stats, error) {
	err := w.p.flush(ctx)
	return w.st, err
}
