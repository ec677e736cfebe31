package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/image"
)

// The file tree of a checkpoint is stored as one tar stream
// (image.WalkTree's: what the hardened extractor reads back), cut into
// chunks: each entry's header blocks, then its contents and padding
// every MiB, then the end-of-archive blocks. The recipe lists the
// chunks' lengths (Object.Cuts, encodeCuts), and the tree's SHA-256 is
// that of its chunks' SHA-256s one after the other: a file a sandbox
// did not touch since its last upload is then neither read nor hashed
// again, its chunks known from that upload (treeCache).

// trailer ends a tar stream: two zero blocks.
var trailer = make([]byte, 2*512)

// fileKey is what a regular file must still be for its chunks to be
// reused: the same name, inode, size, mode and change times. The
// kernel sets a file's ctime on every change to its contents or
// metadata, and nothing in a sandbox can set it back.
type fileKey struct {
	name         string
	ino, size    uint64
	mode         uint32
	mtime, ctime int64 // ns
}

// chunkRef is a chunk by content.
type chunkRef struct {
	sum [sha256.Size]byte
	len int32
}

// treeCache holds, per sandbox, the chunks of the files of its last
// uploaded tree, and which checkpoint's tree that was: only a child of
// that checkpoint (Source.Parent) uses them, whose files changed from
// that tree forward (after a rollback, the parent is the checkpoint
// rolled back to). It is bounded by sandboxes (least recently uploaded
// go first).
type treeCache struct {
	mu sync.Mutex
	// +checklocks:mu
	bySandbox map[string]*sandboxFiles
	// +checklocks:mu
	tick uint64
}

type sandboxFiles struct {
	used       uint64
	checkpoint string
	files      map[fileKey][]chunkRef
}

// maxCachedSandboxes bounds treeCache: a few MiB per sandbox of a
// Debian image's size.
const maxCachedSandboxes = 256

// racyWindow: a file changed this close before its tree's snapshot is
// not remembered, since a change just after the snapshot could leave
// its ctime as it was (the kernel's file times advance by clock ticks).
const racyWindow = 2 * time.Second

// get returns the files of sandbox sb's tree at checkpoint ck, nil if
// those are not the ones remembered.
func (c *treeCache) get(sb, ck string) map[fileKey][]chunkRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.bySandbox[sb]; f != nil && ck != "" && f.checkpoint == ck {
		return f.files
	}
	return nil
}

func (c *treeCache) put(sb, ck string, files map[fileKey][]chunkRef) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bySandbox == nil {
		c.bySandbox = map[string]*sandboxFiles{}
	}
	c.tick++
	c.bySandbox[sb] = &sandboxFiles{used: c.tick, checkpoint: ck, files: files}
	for len(c.bySandbox) > maxCachedSandboxes {
		oldest, at := "", uint64(0)
		for id, f := range c.bySandbox {
			if oldest == "" || f.used < at {
				oldest, at = id, f.used
			}
		}
		delete(c.bySandbox, oldest)
	}
}

// Forget drops what the store remembers of sandbox sb's files.
func (s *Store) Forget(sb string) {
	s.trees.mu.Lock()
	defer s.trees.mu.Unlock()
	delete(s.trees.bySandbox, sb)
}

// treeWriter cuts a tar stream into chunks as it is written.
type treeWriter struct {
	ctx   context.Context
	p     *packer
	ex    []*Extent
	cuts  []int32
	sums  hash.Hash // of the chunks' SHA-256s
	n     int64
	buf   []byte
	reuse int64 // bytes taken from the cache
}

// chunk stores b as one chunk (b at most maxChunk bytes).
func (w *treeWriter) chunk(b []byte) ([sha256.Size]byte, error) {
	e, sum, err := w.p.add(w.ctx, b)
	if err != nil {
		return sum, err
	}
	w.note(e, sum, len(b))
	return sum, nil
}

func (w *treeWriter) note(e *Extent, sum [sha256.Size]byte, n int) {
	w.ex = append(w.ex, e)
	w.cuts = append(w.cuts, int32(n))
	w.sums.Write(sum[:])
	w.n += int64(n)
}

// reused adds the chunks of refs if the store still has every one.
func (w *treeWriter) reused(refs []chunkRef) bool {
	exts := make([]*Extent, len(refs))
	for i, r := range refs {
		e, ok := w.p.known(r.sum, r.len)
		if !ok {
			return false
		}
		exts[i] = e
	}
	for i, r := range refs {
		w.note(exts[i], r.sum, int(r.len))
		w.reuse += int64(r.len)
	}
	return true
}

// entry stores one entry (cutEntry) and returns its chunks.
func (w *treeWriter) entry(hdr []byte, r io.Reader, size int64) ([]chunkRef, error) {
	if w.buf == nil {
		w.buf = make([]byte, maxChunk)
	}
	var refs []chunkRef
	err := cutEntry(hdr, r, size, w.buf, func(b []byte, _ int) error {
		sum, err := w.chunk(b)
		if err == nil {
			refs = append(refs, chunkRef{sum: sum, len: int32(len(b))})
		}
		return err
	})
	return refs, err
}

// cutEntry cuts one tree entry into its chunks: its header blocks hdr (a
// chunk of their own, so that a file's contents are shared whatever its
// metadata), then size bytes of r and the padding to a block, a chunk
// per MiB (read into buf, maxChunk bytes). add gets each chunk and how
// many of its bytes are r's (the rest is padding).
func cutEntry(hdr []byte, r io.Reader, size int64, buf []byte, add func(b []byte, data int) error) error {
	for b := hdr; len(b) > 0; b = b[min(len(b), maxChunk):] {
		if err := add(b[:min(len(b), maxChunk)], 0); err != nil {
			return err
		}
	}
	if size == 0 {
		return nil
	}
	padded := size + (512-size%512)%512
	for off := int64(0); off < padded; {
		b := buf[:min(int64(maxChunk), padded-off)]
		data := max(0, min(int64(len(b)), size-off))
		if _, err := io.ReadFull(r, b[:data]); err != nil {
			return err
		}
		clear(b[data:])
		if err := add(b, int(data)); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}

// entryHeader writes h's header blocks, as a tree stores them, to hb
// (reset first).
func entryHeader(hb *bytes.Buffer, h *tar.Header) error {
	hb.Reset()
	if err := tar.NewWriter(hb).WriteHeader(h); err != nil {
		return fmt.Errorf("%s: %w", h.Name, err)
	}
	return nil
}

// treeEntrySize is the size of the contents stored for the entry h, whose
// contents WalkTree gave as r.
func treeEntrySize(h *tar.Header, r io.Reader) int64 {
	if r == nil {
		return 0
	}
	return h.Size
}

// tree stores the file tree of src, reusing the chunks of the files its
// parent's upload stored where they did not change, and remembers its
// own for its children (src.Snapshot: those changed well before it).
// Device nodes are left out: the restoring host makes its own.
func (p *packer) tree(ctx context.Context, src Source) (Object, []*Extent, error) {
	root, sb, snapshot := src.Tree, src.Sandbox, src.Snapshot
	w := &treeWriter{ctx: ctx, p: p, sums: sha256.New()}
	old := p.s.trees.get(sb, src.Parent)
	files := map[fileKey][]chunkRef{}
	limit := snapshot.Add(-racyWindow).UnixNano()
	var hb bytes.Buffer
	err := image.WalkTree(ctx, "store: file tree", root, func(h *tar.Header, r io.Reader) error {
		if !storedEntry(h) {
			return nil
		}
		// A file whose name, inode, size, mode and times are those it
		// had in the parent's tree: the same header, the same bytes.
		key, keyed := fileKeyOf(h.Name, r)
		if keyed && old != nil {
			if refs, ok := old[key]; ok && w.reused(refs) {
				files[key] = refs
				return nil
			}
		}
		if err := entryHeader(&hb, h); err != nil {
			return err
		}
		refs, err := w.entry(hb.Bytes(), r, treeEntrySize(h, r))
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		if keyed && !snapshot.IsZero() && key.ctime < limit && key.mtime < limit {
			files[key] = refs
		}
		return nil
	})
	if err != nil {
		return Object{}, nil, err
	}
	if _, err := w.chunk(trailer); err != nil {
		return Object{}, nil, err
	}
	if !snapshot.IsZero() {
		p.s.trees.put(sb, src.Checkpoint, files)
	}
	p.stats.ReusedBytes += w.reuse
	return Object{Name: "fs.tar", Size: w.n, SHA256: hex.EncodeToString(w.sums.Sum(nil)), Cuts: encodeCuts(w.cuts)}, w.ex, nil
}

// encodeCuts encodes chunk lengths for a recipe: each (a multiple of
// the tar block, 512 bytes) as the uvarint of its blocks, base64.
func encodeCuts(cuts []int32) string {
	b := make([]byte, 0, 2*len(cuts))
	for _, c := range cuts {
		b = binary.AppendUvarint(b, uint64(c/512))
	}
	return base64.RawStdEncoding.EncodeToString(b)
}

// decodeCuts decodes and checks what encodeCuts made: every length a
// chunk's, adding up to size.
func decodeCuts(s string, size int64) ([]int32, error) {
	if int64(len(s)) > 4*maxExtents {
		return nil, bad("chunk lengths of %d bytes", len(s))
	}
	b, err := base64.RawStdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, bad("chunk lengths: %v", err)
	}
	var cuts []int32
	var sum int64
	for len(b) > 0 {
		v, n := binary.Uvarint(b)
		if n <= 0 || v == 0 || v > maxChunk/512 {
			return nil, bad("a chunk length of %d blocks", v)
		}
		b = b[n:]
		cuts = append(cuts, int32(v*512))
		if sum += int64(v * 512); sum > size {
			break
		}
	}
	if sum != size {
		return nil, bad("chunks of %d bytes for a size of %d", sum, size)
	}
	return cuts, nil
}

// fileKeyOf is the key of the regular file r (an *os.File WalkTree
// opened), false if it cannot be had.
func fileKeyOf(name string, r io.Reader) (fileKey, bool) {
	f, ok := r.(*os.File)
	if !ok {
		return fileKey{}, false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileKey{}, false
	}
	return fileKey{name: name, ino: st.Ino, size: uint64(st.Size), mode: st.Mode,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}
