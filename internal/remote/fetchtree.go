package remote

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/image"
)

// TreeStats describes one fetch of a file tree.
type TreeStats struct {
	// Fetched are the bytes read from the store; FromBase those read
	// from the base; Kept the bytes of the base's files left in place.
	Fetched, FromBase, Kept int64
	// Entries is the tree's entries; KeptEntries those left in place.
	Entries, KeptEntries int
	// Remembered is the files whose chunks the next upload of the
	// sandbox's tree from this host takes unread (seedTree).
	Remembered int
}

// FetchTree extracts r's file tree into dst (an existing, empty
// directory) through the hardened extractor, and checks the stream
// against the recipe's SHA-256 (what was extracted stays in dst for the
// caller to remove on failure).
func (s *Store) FetchTree(ctx context.Context, r Recipe, dst string) error {
	_, err := s.fetchTree(ctx, r, dst, nil)
	return err
}

// FetchTreeOver makes dst, a copy (a snapshot) of base, r's file tree:
// chunks base holds are read there rather than fetched, and its files
// that are the tree's, header and contents, stay as they are. The tree
// is checked against the recipe's SHA-256 as FetchTree's is.
func (s *Store) FetchTreeOver(ctx context.Context, r Recipe, dst string, base Base) (TreeStats, error) {
	return s.fetchTree(ctx, r, dst, &base)
}

func (s *Store) fetchTree(ctx context.Context, r Recipe, dst string, base *Base) (TreeStats, error) {
	var st TreeStats
	if r.Tree == nil {
		return st, fmt.Errorf("store: checkpoint %s has no file tree: %w", r.Checkpoint, errdefs.ErrFailedPrecondition)
	}
	chunks, err := treeChunks(r)
	if err != nil {
		return st, err
	}
	start := s.now()
	var bi *baseIndex
	var x *image.Extractor
	if base != nil {
		if bi, err = s.baseIndexOf(ctx, *base); err != nil {
			return st, err
		}
		if err := s.chunkSums(ctx, r, chunks); err != nil {
			return st, err
		}
		x, err = image.NewUpdater(dst)
	} else {
		x, err = image.NewExtractor(dst)
	}
	if err != nil {
		return st, err
	}
	defer x.Close()
	ts, err := newTreeStream(ctx, s, chunks, bi)
	if err != nil {
		return st, err
	}
	defer ts.close()
	if err := ts.extract(x, &st); err != nil {
		return st, fmt.Errorf("store: checkpoint %s: file tree: %w", r.Checkpoint, err)
	}
	if got := ts.sum(); got != r.Tree.SHA256 {
		return st, bad("checkpoint %s: file tree of SHA-256 %s, the recipe says %s", r.Checkpoint, got, r.Tree.SHA256)
	}
	st.Fetched, st.FromBase = ts.fetched, ts.fromBase
	if err := x.Finish(); err != nil {
		return st, err
	}
	st.Remembered = s.seedTree(r, ts.kept, start)
	return st, nil
}

// keptFile is a base's file a fetched tree keeps, with the tree's
// chunks of it (header, then contents).
type keptFile struct {
	key  fileKey
	refs []chunkRef
}

// seedTree has the store remember the files a fetch of r's tree kept
// from its base, as an upload of that tree from this host would have:
// the sandbox's next upload here, of a child of r's checkpoint, then
// takes their chunks unread, where it read and hashed the whole tree
// (most of the upload of a migration's way back). Only the base's files
// are remembered, and only those that changed well before the fetch
// began (racyWindow): those written by the fetch are read next time.
// What the store remembers of the sandbox at r's checkpoint already (an
// upload from here) stays. It returns how many files it remembered.
func (s *Store) seedTree(r Recipe, kept []keptFile, start time.Time) int {
	if len(kept) == 0 || s.trees.get(r.Sandbox, r.Checkpoint) != nil {
		return 0
	}
	limit := start.Add(-racyWindow).UnixNano()
	files := make(map[fileKey][]chunkRef, len(kept))
	for _, k := range kept {
		if k.key.ctime < limit && k.key.mtime < limit {
			files[k.key] = k.refs
		}
	}
	if len(files) == 0 {
		return 0
	}
	s.trees.put(r.Sandbox, r.Checkpoint, files)
	return len(files)
}

// tchunk is one chunk of a stored tree: where it is in the stream and
// in the store, and its SHA-256 as its pack's index says (unchecked:
// the tree's own SHA-256 is over what is read).
type tchunk struct {
	start int64
	len   int32
	local bool // the base has it
	known bool // sum is set
	pack  string
	off   int64
	sum   [sha256.Size]byte
}

func (c *tchunk) end() int64 { return c.start + int64(c.len) }

// treeChunks lays r's tree's chunks over its extents: each chunk lies
// in one extent, as an upload stores it.
func treeChunks(r Recipe) ([]tchunk, error) {
	cuts, err := decodeCuts(r.Tree.Cuts, r.Tree.Size)
	if err != nil {
		return nil, err
	}
	chunks := make([]tchunk, len(cuts))
	var start, within int64
	ext := r.Tree.Extents
	for i, c := range cuts {
		for len(ext) > 0 && within == ext[0].Len {
			ext, within = ext[1:], 0
		}
		if len(ext) == 0 || within+int64(c) > ext[0].Len {
			return nil, bad("checkpoint %s: file tree: chunk %d is not inside one extent", r.Checkpoint, i)
		}
		e := ext[0]
		if e.P < 0 || e.P >= len(r.Packs) {
			return nil, bad("checkpoint %s: file tree: extent of pack %d", r.Checkpoint, e.P)
		}
		chunks[i] = tchunk{start: start, len: c, pack: r.Packs[e.P], off: e.Off + within}
		start += int64(c)
		within += int64(c)
	}
	return chunks, nil
}

// maxTreeIdx bounds a pack index read for a tree's chunk sums (a
// million chunks and more; a larger one leaves its chunks to be
// fetched).
const maxTreeIdx = 1 << 20 * idxEntry

// chunkSums fills in the chunks' SHA-256s from their packs' indexes
// (those it cannot read leave their chunks to be fetched).
func (s *Store) chunkSums(ctx context.Context, r Recipe, chunks []tchunk) error {
	// Chunks a tree holds twice are stored once: several chunks may
	// share a place.
	need := map[string]map[int64][]int{}
	for i, c := range chunks {
		if need[c.pack] == nil {
			need[c.pack] = map[int64][]int{}
		}
		need[c.pack][c.off] = append(need[c.pack][c.off], i)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, fetchAhead)
	for pack, offs := range need {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			idx, err := readAll(ctx, s.b, idxKey(pack), maxTreeIdx)
			if err != nil || len(idx)%idxEntry != 0 {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			var off int64
			for ; len(idx) >= idxEntry; idx = idx[idxEntry:] {
				n := int64(idx[sha256.Size])<<24 | int64(idx[sha256.Size+1])<<16 | int64(idx[sha256.Size+2])<<8 | int64(idx[sha256.Size+3])
				for _, i := range offs[off] {
					if n == int64(chunks[i].len) {
						copy(chunks[i].sum[:], idx)
						chunks[i].known = true
					}
				}
				off += n
			}
		}()
	}
	wg.Wait()
	return ctx.Err()
}

// treeStream reads a tree's stream chunk by chunk, each from the base
// if it has it, else from the store (fetched ahead, in order), and
// computes the tree's SHA-256: a chunk read whole is hashed, one the
// reader seeks over (the contents of a file left in place) counts as
// the base's.
type treeStream struct {
	ctx    context.Context
	s      *Store
	chunks []tchunk
	base   *baseIndex
	root   *os.File // the base's directory
	file   *os.File // the base's file last read
	fname  string
	size   int64

	pos    int64
	k      int    // the chunk at pos
	buf    []byte // chunk k's bytes, once loaded
	lbuf   []byte // where a chunk of the base is read
	loaded bool

	pieces <-chan chan fetched // the store's, in order
	piece  []byte              // the piece being used
	pfirst int                 // its first chunk
	plast  int                 // and its last
	cancel context.CancelFunc

	sums     hash.Hash
	fetched  int64
	fromBase int64
	kept     []keptFile // the base's regular files kept, in order
}

func newTreeStream(ctx context.Context, s *Store, chunks []tchunk, base *baseIndex) (*treeStream, error) {
	ts := &treeStream{s: s, chunks: chunks, base: base, sums: sha256.New(), pfirst: -1}
	if n := len(chunks); n > 0 {
		ts.size = chunks[n-1].end()
	}
	if base != nil {
		f, err := os.Open(base.dir)
		if err != nil {
			return nil, fmt.Errorf("store: base tree: %w", err)
		}
		ts.root = f
		for i := range chunks {
			c := &chunks[i]
			c.local = c.known && base.has(c.sum, c.len)
		}
	}
	ts.ctx, ts.cancel = context.WithCancel(ctx)
	ts.pieces = ts.fetchAhead()
	return ts, nil
}

func (ts *treeStream) close() {
	ts.cancel()
	for c := range ts.pieces {
		<-c
	}
	if ts.file != nil {
		ts.file.Close()
	}
	if ts.root != nil {
		ts.root.Close()
	}
}

// remotePieces groups the chunks the base lacks into ranges of one pack
// of at most fetchPiece bytes: [first, last] chunks each.
func (ts *treeStream) remotePieces() [][2]int {
	var out [][2]int
	for i := 0; i < len(ts.chunks); i++ {
		c := ts.chunks[i]
		if c.local {
			continue
		}
		j, n := i, int64(c.len)
		for j+1 < len(ts.chunks) {
			d := ts.chunks[j+1]
			if d.local || d.pack != c.pack || d.off != ts.chunks[j].off+int64(ts.chunks[j].len) || n+int64(d.len) > fetchPiece {
				break
			}
			j, n = j+1, n+int64(d.len)
		}
		out = append(out, [2]int{i, j})
		i = j
	}
	return out
}

// fetchAhead fetches the pieces in order, fetchAhead at once.
func (ts *treeStream) fetchAhead() <-chan chan fetched {
	q := make(chan chan fetched, fetchAhead)
	pieces := ts.remotePieces()
	go func() {
		defer close(q)
		for _, p := range pieces {
			first, last := ts.chunks[p[0]], ts.chunks[p[1]]
			pc := piece{pack: first.pack, off: first.off, len: last.off + int64(last.len) - first.off}
			c := make(chan fetched, 1)
			select {
			case q <- c:
			case <-ts.ctx.Done():
				return
			}
			go func() {
				f := ts.s.fetch(ts.ctx, pc)
				f.first, f.last = p[0], p[1]
				c <- f
			}()
		}
	}()
	return q
}

// remote returns the bytes of chunk k, which the base lacks, from the
// pieces fetched ahead.
func (ts *treeStream) remote(k int) ([]byte, error) {
	for ts.piece == nil || k > ts.plast {
		c, ok := <-ts.pieces
		if !ok {
			if err := ts.ctx.Err(); err != nil {
				return nil, err
			}
			return nil, bad("file tree: chunk %d was not fetched", k)
		}
		f := <-c
		if f.err != nil {
			return nil, f.err
		}
		ts.piece, ts.pfirst, ts.plast = f.b, f.first, f.last
		ts.fetched += int64(len(f.b))
	}
	off := ts.chunks[k].off - ts.chunks[ts.pfirst].off
	if k < ts.pfirst || off < 0 || off+int64(ts.chunks[k].len) > int64(len(ts.piece)) {
		return nil, bad("file tree: chunk %d is not in its piece", k)
	}
	return ts.piece[off : off+int64(ts.chunks[k].len)], nil
}

// readBase reads len(p) bytes of the base's content chunk of SHA-256
// sum from offset off in it.
func (ts *treeStream) readBase(sum [sha256.Size]byte, p []byte, off int64) error {
	if h, ok := ts.base.headers[sum]; ok {
		copy(p, h[off:])
		return nil
	}
	d := ts.base.data[sum]
	if ts.fname != d.name {
		if ts.file != nil {
			ts.file.Close()
			ts.file, ts.fname = nil, ""
		}
		fd, err := unix.Openat2(int(ts.root.Fd()), d.name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err != nil {
			return fmt.Errorf("base tree: %s: %w", d.name, err)
		}
		ts.file, ts.fname = os.NewFile(uintptr(fd), d.name), d.name
	}
	data := max(0, min(int64(len(p)), int64(d.data)-off))
	if data > 0 {
		if _, err := ts.file.ReadAt(p[:data], d.off+off); err != nil {
			return fmt.Errorf("base tree: %s: %w", d.name, err)
		}
	}
	clear(p[data:])
	ts.fromBase += int64(len(p))
	return nil
}

// load reads chunk ts.k whole and hashes it.
func (ts *treeStream) load() error {
	c := &ts.chunks[ts.k]
	if c.local {
		// A buffer of its own: ts.buf may be a piece's, whose later
		// chunks are still to be read.
		if ts.lbuf == nil {
			ts.lbuf = make([]byte, maxChunk)
		}
		ts.buf = ts.lbuf[:c.len]
		if err := ts.readBase(c.sum, ts.buf, 0); err != nil {
			return err
		}
	} else {
		b, err := ts.remote(ts.k)
		if err != nil {
			return err
		}
		ts.buf = b
	}
	c.sum, c.known = sha256.Sum256(ts.buf), true
	ts.loaded = true
	return nil
}

// pass moves past chunk ts.k, counting its SHA-256: the one its bytes
// had if it was loaded, else the base's (a chunk of a kept file; one the
// store has is loaded now).
func (ts *treeStream) pass() error {
	if !ts.loaded && !ts.chunks[ts.k].local {
		if err := ts.load(); err != nil {
			return err
		}
	}
	ts.sums.Write(ts.chunks[ts.k].sum[:])
	ts.k++
	ts.loaded = false
	return nil
}

func (ts *treeStream) Read(p []byte) (int, error) {
	if ts.pos >= ts.size {
		return 0, io.EOF
	}
	c := &ts.chunks[ts.k]
	at := ts.pos - c.start
	n := min(int64(len(p)), int64(c.len)-at)
	switch {
	case !ts.loaded && at == 0, !ts.loaded && !c.local:
		if err := ts.load(); err != nil {
			return 0, err
		}
		fallthrough
	case ts.loaded:
		copy(p[:n], ts.buf[at:])
	default: // inside a base chunk sought into: read just those bytes
		if err := ts.readBase(c.sum, p[:n], at); err != nil {
			return 0, err
		}
	}
	ts.pos += n
	if ts.pos == c.end() {
		if err := ts.pass(); err != nil {
			return int(n), err
		}
	}
	return int(n), nil
}

// Seek moves forward only (as a tar reader skips a file's contents).
func (ts *treeStream) Seek(off int64, whence int) (int64, error) {
	if whence != io.SeekCurrent || off < 0 || ts.pos+off > ts.size {
		return ts.pos, errors.New("file tree: seek backwards or past the end")
	}
	ts.pos += off
	for ts.k < len(ts.chunks) && ts.chunks[ts.k].end() <= ts.pos {
		if err := ts.pass(); err != nil {
			return ts.pos, err
		}
	}
	return ts.pos, nil
}

// sum is the tree's SHA-256, "" unless the stream was read to its end.
func (ts *treeStream) sum() string {
	if ts.pos != ts.size || ts.k != len(ts.chunks) {
		return ""
	}
	return hex.EncodeToString(ts.sums.Sum(nil))
}

// extract writes the tree's entries through x, keeping those of an
// update the base has as they are.
func (ts *treeStream) extract(x *image.Extractor, st *TreeStats) error {
	tr := tar.NewReader(ts)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		st.Entries++
		if ts.keeps(h) {
			if err := x.Keep(h); err != nil {
				return err
			}
			st.KeptEntries++
			st.Kept += h.Size
			continue
		}
		if err := x.Put(h, tr); err != nil {
			return err
		}
	}
	// The end-of-archive marker read, the rest of the stream must be
	// zero padding only: read it to the end so its hash is whole.
	_, err := io.Copy(zeroOnly{}, ts)
	return err
}

// keeps reports whether the entry h, whose header was just read, is the
// base's, header and contents: its header's chunks are those before the
// stream's position, its contents' those after, and all are the base's
// entry's of the same name.
func (ts *treeStream) keeps(h *tar.Header) bool {
	if ts.base == nil || ts.loaded || ts.k >= len(ts.chunks) || ts.chunks[ts.k].start != ts.pos {
		return false
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeSymlink, tar.TypeFifo:
	default:
		return false
	}
	e, ok := ts.base.entries[path.Clean(h.Name)]
	if !ok {
		return false
	}
	contents := 0
	if h.Typeflag == tar.TypeReg && h.Size > 0 {
		padded := h.Size + (512-h.Size%512)%512
		contents = int((padded + maxChunk - 1) / maxChunk)
	}
	headers := len(e.chunks) - contents
	first := ts.k - headers
	if headers < 1 || first < 0 || ts.k+contents > len(ts.chunks) {
		return false
	}
	for i, sum := range e.chunks {
		c := ts.chunks[first+i]
		if !c.local || c.sum != sum {
			return false
		}
	}
	if e.keyed && h.Typeflag == tar.TypeReg {
		k := keptFile{key: e.key, refs: make([]chunkRef, len(e.chunks))}
		for i, sum := range e.chunks {
			k.refs[i] = chunkRef{sum: sum, len: ts.chunks[first+i].len}
		}
		ts.kept = append(ts.kept, k)
	}
	return true
}
