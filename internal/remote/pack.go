package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/molt-sh/molt/internal/objstore"
)

// packTarget is the size at which a pack is closed and uploaded.
const packTarget = 32 << 20

// maxChunk bounds one chunk (a page, a file's MiB, a tar header).
const maxChunk = 1 << 20

// idxEntry is one chunk's line in a pack's index: its SHA-256 and its
// length.
const idxEntry = sha256.Size + 4

// loc is where a chunk is: a pack and a place in it.
type loc struct {
	pack int32
	len  int32
	off  int64
}

func packKey(name string) string { return "packs/" + name[:2] + "/" + name }
func idxKey(name string) string  { return packKey(name) + ".idx" }

// packer gathers new chunks into packs and uploads each when full.
type packer struct {
	s   *Store
	buf bytes.Buffer
	idx []byte
	cur map[[sha256.Size]byte]loc
	// pending chunks point into the pack being filled: their pack is
	// known only once it is closed.
	pending []*Extent
	charge  func(int64) error
	stats   *Stats
}

// add stores chunk c (unless the store has it) and returns its extent.
// The extent's Pack is filled in when its pack closes, before flush
// returns.
func (p *packer) add(ctx context.Context, c []byte) (*Extent, [sha256.Size]byte, error) {
	return p.addSum(ctx, c, sha256.Sum256(c))
}

// addSum is add for a chunk whose SHA-256 h is known.
func (p *packer) addSum(ctx context.Context, c []byte, h [sha256.Size]byte) (*Extent, [sha256.Size]byte, error) {
	p.stats.Chunks++
	if e, ok := p.known(h, int32(len(c))); ok {
		p.stats.SharedBytes += int64(len(c))
		return e, h, nil
	}
	e := &Extent{Off: int64(p.buf.Len()), Len: int64(len(c))}
	p.buf.Write(c)
	p.idx = binary.BigEndian.AppendUint32(append(p.idx, h[:]...), uint32(len(c)))
	if p.cur == nil {
		p.cur = map[[sha256.Size]byte]loc{}
	}
	p.cur[h] = loc{off: e.Off, len: int32(len(c))}
	p.pending = append(p.pending, e)
	if p.buf.Len() >= packTarget {
		if err := p.flush(ctx); err != nil {
			return nil, h, err
		}
	}
	return e, h, nil
}

// known returns the extent of the chunk of SHA-256 h and length n if
// the store or the pack being filled has it.
func (p *packer) known(h [sha256.Size]byte, n int32) (*Extent, bool) {
	if l, ok := p.s.lookup(h); ok && l.len == n {
		return &Extent{Pack: p.s.packName(l.pack), Off: l.off, Len: int64(l.len)}, true
	}
	if l, ok := p.cur[h]; ok && l.len == n {
		e := &Extent{Off: l.off, Len: int64(l.len)}
		p.pending = append(p.pending, e)
		return e, true
	}
	return nil, false
}

// has reports whether the store or the pack being filled has the chunk
// of SHA-256 h and length n (known, without taking an extent).
func (p *packer) has(h [sha256.Size]byte, n int32) bool {
	if l, ok := p.s.lookup(h); ok && l.len == n {
		return true
	}
	l, ok := p.cur[h]
	return ok && l.len == n
}

// flush uploads the pack being filled (index after pack: an index names
// only a pack that exists) and indexes its chunks.
func (p *packer) flush(ctx context.Context) error {
	if p.buf.Len() == 0 {
		return nil
	}
	sum := sha256.Sum256(p.buf.Bytes())
	name := hex.EncodeToString(sum[:])
	if p.charge != nil {
		if err := p.charge(int64(p.buf.Len())); err != nil {
			return err
		}
	}
	if err := p.s.b.Put(ctx, packKey(name), bytes.NewReader(p.buf.Bytes()), int64(p.buf.Len())); err != nil {
		return fmt.Errorf("store: upload pack: %w", err)
	}
	if err := p.s.b.Put(ctx, idxKey(name), bytes.NewReader(p.idx), int64(len(p.idx))); err != nil {
		return fmt.Errorf("store: upload pack index: %w", err)
	}
	p.stats.Packs++
	p.stats.UploadedBytes += int64(p.buf.Len() + len(p.idx))
	for _, e := range p.pending {
		e.Pack = name
	}
	p.s.indexPack(name, p.idx)
	p.buf.Reset()
	p.idx, p.pending = p.idx[:0], p.pending[:0]
	clear(p.cur)
	return nil
}

// loadIndex reads the index of every pack in the store not yet known:
// chunks other uploads stored are then shared too.
func (s *Store) loadIndex(ctx context.Context) error {
	keys, err := s.b.List(ctx, "packs/")
	if err != nil {
		return fmt.Errorf("store: list packs: %w", err)
	}
	for _, k := range keys {
		name, ok := cutIdx(k)
		if !ok || s.knowsPack(name) || s.goneByGC(name) {
			continue
		}
		b, err := readAll(ctx, s.b, k, int64(maxPackSize/minChunkForIdx*idxEntry))
		if err != nil {
			return fmt.Errorf("store: pack index %s: %w", name, err)
		}
		if len(b)%idxEntry != 0 {
			continue // not an index this molt wrote: its chunks are not shared
		}
		s.indexPack(name, b)
	}
	return nil
}

// minChunkForIdx bounds a pack index's size: chunks of at least one byte
// in a pack of at most maxPackSize.
const minChunkForIdx = 1

func cutIdx(key string) (string, bool) {
	if len(key) != len("packs/00/")+64+len(".idx") || key[len(key)-4:] != ".idx" {
		return "", false
	}
	name := key[len("packs/00/") : len(key)-4]
	if !packName.MatchString(name) || key[6:8] != name[:2] {
		return "", false
	}
	return name, true
}

// readAll reads a whole object of at most max bytes.
func readAll(ctx context.Context, b objstore.Bucket, key string, max int64) ([]byte, error) {
	n, err := b.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	if n > max {
		return nil, bad("object %s: %d bytes, more than the %d allowed", key, n, max)
	}
	r, err := b.Get(ctx, key, 0, -1)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	buf, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(buf)) > max {
		return nil, bad("object %s: more than the %d bytes allowed", key, max)
	}
	return buf, nil
}
