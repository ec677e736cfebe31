package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/objstore"
)

// Store is the checkpoints of one object store, as this host sees them.
type Store struct {
	b objstore.Bucket
	k *ckstore.Keyring

	mu sync.Mutex
	// +checklocks:mu
	packs []string
	// +checklocks:mu
	packIdx map[string]int32
	// +checklocks:mu
	chunks map[[sha256.Size]byte]loc
	// +checklocks:mu
	loaded bool
	// The GC state (gc.go) as the last upload read it: its generation,
	// when, and the packs it condemned or deleted.
	// +checklocks:mu
	gcGen int64
	// +checklocks:mu
	gcSynced time.Time
	// +checklocks:mu
	gcGone map[string]bool

	trees treeCache
	bases baseCache
	// readWhole has uploads read and hash every page, as before the
	// hash files were used (the baseline of BenchmarkUploadKnownPages).
	readWhole bool
	// clock, if set, is the time (tests move it on).
	clock func() time.Time
}

func (s *Store) now() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

// Stats describes one upload.
type Stats struct {
	// Chunks is the number of chunks cut; SharedBytes the bytes of
	// those the store held already.
	Chunks      int64 `json:"chunks"`
	SharedBytes int64 `json:"shared_bytes"`
	// Packs and UploadedBytes are what was written (indexes included).
	Packs         int64 `json:"packs"`
	UploadedBytes int64 `json:"uploaded_bytes"`
	// ReusedBytes are the bytes of the file tree's unchanged files,
	// neither read nor hashed (their chunks remembered).
	ReusedBytes int64 `json:"reused_bytes"`
	// ReadBytes are the bytes of the checkpoint's objects read (a page
	// the store has, named by its hash file, is not).
	ReadBytes int64 `json:"read_bytes"`
}

type layoutDoc struct {
	Layout int `json:"layout"`
}

const layoutKey = "molt-store.json"

// Open opens the store in bucket b: its layout is checked (written, for
// an empty store). k signs what this host uploads and says whose
// uploads it trusts.
func Open(ctx context.Context, b objstore.Bucket, k *ckstore.Keyring) (*Store, error) {
	s := &Store{b: b, k: k, packIdx: map[string]int32{}, chunks: map[[sha256.Size]byte]loc{}}
	buf, err := readAll(ctx, b, layoutKey, 4096)
	if errors.Is(err, fs.ErrNotExist) {
		doc, _ := json.Marshal(layoutDoc{Layout: Layout})
		if err := b.Put(ctx, layoutKey, bytes.NewReader(doc), int64(len(doc))); err != nil {
			return nil, fmt.Errorf("store %s: write its layout: %w", b, err)
		}
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", b, err)
	}
	var d layoutDoc
	if err := json.Unmarshal(buf, &d); err != nil {
		return nil, fmt.Errorf("store %s: %s: %v: %w", b, layoutKey, err, errdefs.ErrFailedPrecondition)
	}
	if d.Layout != Layout {
		return nil, fmt.Errorf("store %s: layout %d, this molt reads layout %d: %w", b, d.Layout, Layout, errdefs.ErrNotSupported)
	}
	return s, nil
}

// Bucket is the store's bucket.
func (s *Store) Bucket() objstore.Bucket { return s.b }

func (s *Store) lookup(h [sha256.Size]byte) (loc, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.chunks[h]
	return l, ok
}

func (s *Store) packName(i int32) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.packs[i]
}

func (s *Store) knowsPack(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.packIdx[name]
	return ok
}

// goneByGC reports whether the last look at gc.json found pack name
// condemned or deleted.
func (s *Store) goneByGC(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gcGone[name]
}

// indexPack adds the chunks of pack name, whose index is idx.
func (s *Store) indexPack(name string, idx []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.packIdx[name]; ok {
		return
	}
	i := int32(len(s.packs))
	s.packs = append(s.packs, name)
	s.packIdx[name] = i
	var off int64
	for len(idx) >= idxEntry {
		var h [sha256.Size]byte
		copy(h[:], idx)
		n := int64(idx[sha256.Size])<<24 | int64(idx[sha256.Size+1])<<16 | int64(idx[sha256.Size+2])<<8 | int64(idx[sha256.Size+3])
		if _, ok := s.chunks[h]; !ok && n > 0 && n <= maxChunk {
			s.chunks[h] = loc{pack: i, off: off, len: int32(n)}
		}
		off += n
		idx = idx[idxEntry:]
	}
}

// ensureIndex loads the store's pack indexes once per process.
func (s *Store) ensureIndex(ctx context.Context) error {
	s.mu.Lock()
	done := s.loaded
	s.mu.Unlock()
	if done {
		return nil
	}
	if err := s.loadIndex(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	s.loaded = true
	s.mu.Unlock()
	return nil
}
