package remote

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/pagestore"
)

// Source is a local checkpoint to upload.
type Source struct {
	Checkpoint string
	Sandbox    string
	// Record is the engine's record of the checkpoint (opaque here).
	Record json.RawMessage
	// Manifest is the artifact's manifest, as stored.
	Manifest []byte
	// Dir holds the objects, each at Dir/PATH.
	Dir     string
	Objects []ckstore.Object
	// Tree is the root of the checkpoint's file tree, "" for none.
	Tree string
	// Snapshot is an instant no later than the snapshot Tree is: files
	// changed well before it are remembered for the upload of a child
	// checkpoint, which then reads only what changed. Zero: nothing is.
	Snapshot time.Time
	// Parent is the checkpoint whose tree this one's changed from (the
	// sandbox's head when it was taken).
	Parent string
	// Charge, if set, is called with the bytes about to be uploaded
	// (a scheduler paces the upload there); its error ends the upload.
	Charge func(int64) error
}

func recipeKey(id string) string { return "checkpoints/" + id + ".json" }

// Upload stores a checkpoint: its new chunks in packs, then its signed
// recipe (the commit point: a checkpoint without one is not in the
// store). An object whose bytes are not those its SHA-256 says fails
// the upload: the store never gets a copy the checkpoint's record
// would refuse.
func (s *Store) Upload(ctx context.Context, src Source) (Recipe, Stats, error) {
	var st Stats
	if !ckstore.IsName(src.Checkpoint) || !ckstore.IsName(src.Sandbox) {
		return Recipe{}, st, fmt.Errorf("store: upload of checkpoint %q of sandbox %q: not names", src.Checkpoint, src.Sandbox)
	}
	if err := s.syncGC(ctx); err != nil {
		return Recipe{}, st, err
	}
	p := &packer{s: s, charge: src.Charge, stats: &st}
	r := Recipe{Layout: Layout, Checkpoint: src.Checkpoint, Sandbox: src.Sandbox, Record: src.Record, Manifest: src.Manifest}
	objs := make([]Object, 0, len(src.Objects))
	var exts [][]*Extent
	hashes, err := s.pageHashes(src)
	if err != nil {
		return Recipe{}, st, fmt.Errorf("store: upload of checkpoint %s: page hashes %w", src.Checkpoint, err)
	}
	for _, o := range src.Objects {
		var ex []*Extent
		var err error
		if h, ok := hashes[o.Path]; ok {
			ex, err = p.objectByHashes(ctx, filepath.Join(src.Dir, o.Path), o, h)
		} else {
			ex, err = p.object(ctx, filepath.Join(src.Dir, o.Path), o)
		}
		if err != nil {
			return Recipe{}, st, fmt.Errorf("store: upload %s of checkpoint %s: %w", o.Path, src.Checkpoint, err)
		}
		objs = append(objs, Object{Name: o.Path, Size: o.Size, SHA256: o.SHA256})
		exts = append(exts, ex)
	}
	var tree *Object
	var treeExt []*Extent
	if src.Tree != "" {
		t, ex, err := p.tree(ctx, src)
		if err != nil {
			return Recipe{}, st, fmt.Errorf("store: upload the files of checkpoint %s: %w", src.Checkpoint, err)
		}
		tree, treeExt = &t, ex
	}
	if err := p.flush(ctx); err != nil {
		return Recipe{}, st, err
	}
	packs := map[string]int{}
	for i := range objs {
		objs[i].Extents = coalesce(exts[i], packs, &r.Packs)
	}
	r.Objects = objs
	if tree != nil {
		tree.Extents = coalesce(treeExt, packs, &r.Packs)
		r.Tree = tree
	}
	r.Uploaded = time.Now().UTC().Truncate(time.Millisecond)
	// The last look at gc.json before the commit (gc.go).
	if err := s.checkGC(ctx, r.Packs); err != nil {
		return Recipe{}, st, err
	}
	if err := s.putSigned(ctx, recipeKey(src.Checkpoint), &r); err != nil {
		return Recipe{}, st, err
	}
	return r, st, nil
}

// putSigned signs and stores r.
func (s *Store) putSigned(ctx context.Context, key string, r *Recipe) error {
	r.Signature = nil
	sig, err := s.sign(r.signedBytes())
	if err != nil {
		return err
	}
	r.Signature = sig
	return s.putJSON(ctx, key, r)
}

// sign signs b (with the error of making it).
func (s *Store) sign(b []byte, err error) (*ckstore.Signature, error) {
	if err != nil {
		return nil, err
	}
	sig := s.k.SignBytes(b)
	return &sig, nil
}

// putJSON stores v as JSON at key.
func (s *Store) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := s.b.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		return fmt.Errorf("store: write %s: %w", key, err)
	}
	return nil
}

// coalesce turns an object's chunk extents into recipe extents: packs
// by index, neighbours in one pack merged.
func coalesce(ex []*Extent, packs map[string]int, names *[]string) []Extent {
	var out []Extent
	for _, e := range ex {
		i, ok := packs[e.Pack]
		if !ok {
			i = len(*names)
			packs[e.Pack] = i
			*names = append(*names, e.Pack)
		}
		if n := len(out); n > 0 && out[n-1].P == i && out[n-1].Off+out[n-1].Len == e.Off && out[n-1].Len+e.Len <= maxPackSize {
			out[n-1].Len += e.Len
			continue
		}
		out = append(out, Extent{P: i, Off: e.Off, Len: e.Len})
	}
	return out
}

// chunkSize is the unit an object is cut into: a page for CRIU's page
// images, so that pages shared between checkpoints are found; a MiB for
// anything else.
func chunkSize(name string) int {
	if b := path.Base(name); strings.HasPrefix(b, "pages-") && strings.HasSuffix(b, ".img") {
		return pagestore.PageSize
	}
	return maxChunk
}

// objectBlock is what an upload reads of an object at once.
const objectBlock = 4 << 20

// object cuts the file p (object o) into chunks, checking its size and
// SHA-256 against o's. Each block read is hashed whole (the object's
// SHA-256) on one goroutine while its chunks are hashed on the others
// and added in order: hashing is most of an upload of a checkpoint whose
// pages the store has.
func (p *packer) object(ctx context.Context, file string, o ckstore.Object) ([]*Extent, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	chunk := chunkSize(o.Path)
	buf := make([]byte, objectBlock/chunk*chunk)
	var ex []*Extent
	var n int64
	for n <= o.Size {
		k, err := io.ReadFull(f, buf)
		if k > 0 {
			b := buf[:k]
			n += int64(k)
			p.stats.ReadBytes += int64(k)
			whole := make(chan struct{})
			go func() { h.Write(b); close(whole) }()
			sums := pagestore.Sums(b, chunk)
			for i, sum := range sums {
				c := b[i*chunk : min(len(b), (i+1)*chunk)]
				e, _, aerr := p.addSum(ctx, c, sum)
				if aerr != nil {
					<-whole
					return nil, aerr
				}
				ex = append(ex, e)
			}
			<-whole
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if n != o.Size || hex.EncodeToString(h.Sum(nil)) != o.SHA256 {
		return nil, fmt.Errorf("its %d bytes are not the %d bytes of SHA-256 %s the checkpoint lists: %w", n, o.Size, o.SHA256, errCorrupt)
	}
	return ex, nil
}

var errCorrupt = bad("local object damaged")
