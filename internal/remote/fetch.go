package remote

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"golang.org/x/sys/unix"
)

// Fetching reads an object's extents in pieces of at most fetchPiece
// bytes, fetchAhead of them in flight: ranged GETs in parallel, their
// bytes used in order.
const (
	fetchPiece = 8 << 20
	fetchAhead = 4
)

// pieceTimeout bounds one ranged read (at most fetchPiece bytes): a
// store that stops answering fails the fetch, with the deadline as its
// error, rather than holding it for good.
var pieceTimeout = 2 * time.Minute

// Recipe reads and checks checkpoint id's recipe (see decodeRecipe).
func (s *Store) Recipe(ctx context.Context, id string) (Recipe, error) {
	if !ckstore.IsName(id) {
		return Recipe{}, fmt.Errorf("checkpoint ID %q is not a name: %w", id, errdefs.ErrInvalidArgument)
	}
	b, err := readAll(ctx, s.b, recipeKey(id), maxRecipe)
	if err != nil {
		return Recipe{}, fmt.Errorf("store: checkpoint %s: %w", id, err)
	}
	return decodeRecipe(b, id, s.k)
}

// Delete removes checkpoint id's recipe. Its packs stay: other
// checkpoints may share them.
func (s *Store) Delete(ctx context.Context, id string) error {
	if !ckstore.IsName(id) {
		return fmt.Errorf("checkpoint ID %q is not a name: %w", id, errdefs.ErrInvalidArgument)
	}
	return s.b.Delete(ctx, recipeKey(id))
}

type piece struct {
	pack     string
	off, len int64
}

type fetched struct {
	b   []byte
	err error
	// first and last: the chunks of a tree's piece (fetchtree.go).
	first, last int
}

// read writes object o of r to w, fetching ahead.
func (s *Store) read(ctx context.Context, r Recipe, o Object, w io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	q := make(chan chan fetched, fetchAhead)
	go func() {
		defer close(q)
		for _, e := range o.Extents {
			for off := int64(0); off < e.Len; off += fetchPiece {
				p := piece{pack: r.Packs[e.P], off: e.Off + off, len: min(fetchPiece, e.Len-off)}
				c := make(chan fetched, 1)
				select {
				case q <- c:
				case <-ctx.Done():
					return
				}
				go func() { c <- s.fetch(ctx, p) }()
			}
		}
	}()
	for c := range q {
		f := <-c
		if f.err != nil {
			return f.err
		}
		if _, err := w.Write(f.b); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (s *Store) fetch(ctx context.Context, p piece) fetched {
	ctx, cancel := context.WithTimeout(ctx, pieceTimeout)
	defer cancel()
	rc, err := s.b.Get(ctx, packKey(p.pack), p.off, p.len)
	if err != nil {
		return fetched{err: fmt.Errorf("store: pack %s: %w", p.pack, err)}
	}
	defer rc.Close()
	b := make([]byte, p.len)
	if _, err := io.ReadFull(rc, b); err != nil {
		return fetched{err: fmt.Errorf("store: pack %s: bytes %d+%d: %w", p.pack, p.off, p.len, err)}
	}
	return fetched{b: b}
}

// FetchObjects writes every object of r into dir (which exists, empty),
// each created anew, checked against its size and SHA-256 as it is
// written. It reports the bytes written.
func (s *Store) FetchObjects(ctx context.Context, r Recipe, dir string) (int64, error) {
	var total int64
	for _, o := range r.Objects {
		if err := s.FetchObject(ctx, r, o, dir); err != nil {
			return total, err
		}
		total += o.Size
	}
	return total, nil
}

// FetchObject writes object o of r into dir as FetchObjects does.
func (s *Store) FetchObject(ctx context.Context, r Recipe, o Object, dir string) error {
	if err := s.fetchObject(ctx, r, o, dir); err != nil {
		return fmt.Errorf("store: checkpoint %s: %s: %w", r.Checkpoint, o.Name, err)
	}
	return nil
}

// ReadAt reads len(p) bytes of object o of r from offset off (not
// checked: the caller checks what it reads against hashes it trusts).
func (s *Store) ReadAt(ctx context.Context, r Recipe, o Object, p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > o.Size {
		return fmt.Errorf("store: checkpoint %s: %s: bytes %d+%d of %d: %w", r.Checkpoint, o.Name, off, len(p), o.Size, errdefs.ErrInvalidArgument)
	}
	var at int64 // the object's offset of extent e
	for _, e := range o.Extents {
		if len(p) == 0 {
			break
		}
		if off >= at+e.Len {
			at += e.Len
			continue
		}
		if e.P < 0 || e.P >= len(r.Packs) {
			return bad("object %s: extent of pack %d", o.Name, e.P)
		}
		n := min(int64(len(p)), at+e.Len-off)
		f := s.fetch(ctx, piece{pack: r.Packs[e.P], off: e.Off + off - at, len: n})
		if f.err != nil {
			return fmt.Errorf("store: checkpoint %s: %s: %w", r.Checkpoint, o.Name, f.err)
		}
		copy(p, f.b)
		p, off, at = p[n:], off+n, at+e.Len
	}
	if len(p) > 0 {
		return bad("object %s: its extents end before its size", o.Name)
	}
	return nil
}

func (s *Store) fetchObject(ctx context.Context, r Recipe, o Object, dir string) error {
	if !ckstore.IsPath(o.Name) {
		return bad("object name %q", o.Name)
	}
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(o.Name)), 0o700); err != nil {
		return err
	}
	fd, err := unix.Open(filepath.Join(dir, o.Name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), o.Name)
	defer f.Close()
	h := sha256.New()
	if err := s.read(ctx, r, o, io.MultiWriter(f, h)); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != o.SHA256 {
		return bad("fetched bytes of SHA-256 %s, the recipe says %s", got, o.SHA256)
	}
	return nil
}

type zeroOnly struct{}

func (zeroOnly) Write(b []byte) (int, error) {
	for _, c := range b {
		if c != 0 {
			return 0, errors.New("data after the end of the archive")
		}
	}
	return len(b), nil
}
