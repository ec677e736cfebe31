package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"path"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/image"
)

// A tree fetched from the store is mostly the tree of the image its
// sandbox was made from: FetchTree, given that image as a Base, takes
// from it every chunk it holds rather than fetching it, and leaves in
// place every file whose header and contents are the image's (the
// caller gives it a snapshot of the image to update). A base is indexed
// once: its chunks cut as an upload cuts a tree, by SHA-256.

// Base is a read-only tree on this host that a fetched tree may share
// most of its files with: Dir is where it is, Key names its contents
// for good (a subvolume's UUID). The tree FetchTree updates must be a
// copy of it (a snapshot).
type Base struct {
	Dir string
	Key string
}

// baseEntry is one entry of a base: its chunks' SHA-256s (header
// chunks, then contents).
type baseEntry struct {
	chunks [][sha256.Size]byte
	// key is a regular file's (keyed): a tree fetched over the base that
	// keeps the file has it with this key (a snapshot keeps inodes and
	// times), which seeds the memory of its files (seedTree).
	key   fileKey
	keyed bool
}

// baseData is where the base has the bytes of a content chunk: data
// bytes of file name from off, then zeros to len.
type baseData struct {
	name      string
	off       int64
	data, len int32
}

// baseIndex is a base's chunks by SHA-256.
type baseIndex struct {
	dir     string
	entries map[string]baseEntry
	headers map[[sha256.Size]byte][]byte
	data    map[[sha256.Size]byte]baseData
	built   time.Duration
}

// has reports whether the base holds the chunk of SHA-256 sum and length n.
func (b *baseIndex) has(sum [sha256.Size]byte, n int32) bool {
	if h, ok := b.headers[sum]; ok {
		return len(h) == int(n)
	}
	d, ok := b.data[sum]
	return ok && d.len == n
}

// MaxBases bounds the bases a store keeps indexed (a few MiB each for a
// Debian image).
const MaxBases = 4

type baseCache struct {
	mu sync.Mutex
	// +checklocks:mu
	byKey map[string]*baseIndex
	// +checklocks:mu
	order []string
}

// baseIndexOf returns base's index, building it on first use.
func (s *Store) baseIndexOf(ctx context.Context, base Base) (*baseIndex, error) {
	c := &s.bases
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.byKey[base.Key]; ok && b.dir == base.Dir {
		return b, nil
	}
	b, err := indexBase(ctx, base.Dir)
	if err != nil {
		return nil, err
	}
	if c.byKey == nil {
		c.byKey = map[string]*baseIndex{}
	}
	c.byKey[base.Key] = b
	c.order = append(c.order, base.Key)
	for len(c.order) > MaxBases {
		delete(c.byKey, c.order[0])
		c.order = c.order[1:]
	}
	return b, nil
}

// IndexBase indexes base ahead of the fetches over it (a daemon's
// start-up does, so that its first resume does not).
func (s *Store) IndexBase(ctx context.Context, base Base) error {
	_, err := s.baseIndexOf(ctx, base)
	return err
}

// Indexed reports whether the base named key is indexed.
func (s *Store) Indexed(key string) bool {
	s.bases.mu.Lock()
	defer s.bases.mu.Unlock()
	_, ok := s.bases.byKey[key]
	return ok
}

// storedEntry reports whether a tree stores the entry h: device nodes
// are left out (the restoring host makes its own).
func storedEntry(h *tar.Header) bool {
	return h.Typeflag != tar.TypeChar && h.Typeflag != tar.TypeBlock
}

// indexBase cuts the tree at dir as an upload would and indexes its
// chunks.
func indexBase(ctx context.Context, dir string) (*baseIndex, error) {
	start := time.Now()
	b := &baseIndex{dir: dir, entries: map[string]baseEntry{},
		headers: map[[sha256.Size]byte][]byte{}, data: map[[sha256.Size]byte]baseData{}}
	var hb bytes.Buffer
	buf := make([]byte, maxChunk)
	err := image.WalkTree(ctx, "store: base tree", dir, func(h *tar.Header, r io.Reader) error {
		if !storedEntry(h) {
			return nil
		}
		if err := entryHeader(&hb, h); err != nil {
			return err
		}
		var e baseEntry
		if h.Typeflag == tar.TypeReg {
			e.key, e.keyed = fileKeyOf(h.Name, r)
		}
		var off int64
		name := path.Clean(h.Name)
		headers := (hb.Len() + maxChunk - 1) / maxChunk
		err := cutEntry(hb.Bytes(), r, treeEntrySize(h, r), buf, func(c []byte, data int) error {
			sum := sha256.Sum256(c)
			e.chunks = append(e.chunks, sum)
			if len(e.chunks) <= headers {
				if _, ok := b.headers[sum]; !ok {
					b.headers[sum] = bytes.Clone(c)
				}
				return nil
			}
			if _, ok := b.data[sum]; !ok {
				b.data[sum] = baseData{name: name, off: off, data: int32(data), len: int32(len(c))}
			}
			off += int64(len(c))
			return nil
		})
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		b.entries[name] = e
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.headers[sha256.Sum256(trailer)] = trailer
	b.built = time.Since(start)
	return b, nil
}
