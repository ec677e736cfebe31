package image

import (
	"archive/tar"
	"context"
	"io"
)

// Extractor writes a tree entry by entry under the rules of ImportTar
// (see the package documentation), for a caller that reads the entries
// from a stream of its own (a checkpoint bundle's file tree). A failed
// Put leaves what was written in dst; the caller removes dst.
type Extractor struct{ x *extractor }

// NewExtractor returns an Extractor into dst, an existing empty
// directory. Close it when done.
func NewExtractor(dst string) (*Extractor, error) {
	x, err := newExtractor(dst)
	if err != nil {
		return nil, err
	}
	return &Extractor{x: x}, nil
}

// Put writes one entry; r holds a regular file's contents (h.Size bytes).
// Names are relative to dst; "./" is dst itself.
func (e *Extractor) Put(h *tar.Header, r io.Reader) error { return e.x.put(h, r) }

// Finish applies the directories' modes and times (an updater's first
// removes what was neither put nor kept); call it once every entry is
// written.
func (e *Extractor) Finish() error {
	if e.x.layer != nil && e.x.layer.update {
		if err := e.x.finishUpdate(); err != nil {
			return err
		}
	}
	return e.x.finish()
}

// Close releases dst.
func (e *Extractor) Close() { e.x.close() }

// WalkTree calls fn for every entry of the tree at src as a tar header
// (the root as "./", parents before children, in lexical order, hard
// links as links to their first name, xattrs as PAX records), with the
// contents of regular files as r. It reads through directory
// descriptors without following symlinks. Device nodes are reported (an
// Extractor refuses them); sockets fail the walk.
func WalkTree(ctx context.Context, op, src string, fn func(h *tar.Header, r io.Reader) error) error {
	return walkTree(ctx, op, src, fn)
}
