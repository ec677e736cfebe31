package bundle

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/image"
	"golang.org/x/sys/unix"
)

// Limits bound what a bundle may make Read write.
type Limits struct {
	// Bytes bounds the objects' and the tree's contents together.
	Bytes int64
	// Objects bounds the manifest's objects, Entries the tree's.
	Objects int
	Entries int64
}

// DefaultLimits are the limits of an Options without any.
func DefaultLimits() Limits { return Limits{Bytes: 64 << 30, Objects: 100_000, Entries: 10_000_000} }

// Options are how Read reads.
type Options struct {
	// Keys checks the signatures (required).
	Keys *ckstore.Keyring
	// Limits (zero fields: DefaultLimits').
	Limits Limits
	// Accept is called with the header once it is read and checked,
	// before anything else: the host says whether it can restore what
	// the bundle says it holds (CRIU version, CPU, architecture).
	Accept func(Header) error
}

// Bundle is what Read read.
type Bundle struct {
	Header   Header
	Manifest ckstore.Manifest
	// Signer is the key that signed the manifest and the seal.
	Signer string
	Stats  Stats
}

// refuse is a bundle refused for what it holds.
func refuse(format string, a ...any) error {
	return fmt.Errorf("bundle refused: %s: %w", fmt.Sprintf(format, a...), errdefs.ErrInvalidArgument)
}

// Read reads a bundle from r, writing its images into images and its
// file tree into fs, both existing empty directories, and returns it
// once every check (see the package comment) passed. On error, images
// and fs hold what was written; the caller removes them.
func Read(ctx context.Context, r io.Reader, images, fs string, o Options) (Bundle, error) {
	var b Bundle
	if o.Keys == nil {
		return b, errors.New("bundle: no keyring")
	}
	lim := o.Limits
	def := DefaultLimits()
	if lim.Bytes <= 0 {
		lim.Bytes = def.Bytes
	}
	if lim.Objects <= 0 {
		lim.Objects = def.Objects
	}
	if lim.Entries <= 0 {
		lim.Entries = def.Entries
	}
	end := image.NewEndReader(bufio.NewReaderSize(r, 1<<20))
	tr := tar.NewReader(end)
	rd := reader{ctx: ctx, tr: tr, lim: lim}
	hb, err := rd.small(headerName, maxHeader)
	if err != nil {
		return b, err
	}
	if err := strictJSON(hb, &b.Header); err != nil {
		return b, refuse("header: %v", err)
	}
	if b.Header.Format != Version {
		return b, fmt.Errorf("bundle refused: format version %d, this molt reads version %d: %w", b.Header.Format, Version, errdefs.ErrNotSupported)
	}
	if o.Accept != nil {
		if err := o.Accept(b.Header); err != nil {
			return b, fmt.Errorf("bundle refused: %w", err)
		}
	}
	mb, err := rd.small(manifestName, maxManifest)
	if err != nil {
		return b, err
	}
	if b.Manifest, err = rd.manifest(mb, b.Header, o.Keys); err != nil {
		return b, err
	}
	b.Signer = b.Manifest.Signature.Key
	for _, obj := range b.Manifest.Objects {
		if err := rd.object(images, obj); err != nil {
			return b, err
		}
		b.Stats.Objects++
		b.Stats.ObjectBytes += obj.Size
	}
	th, h, err := rd.tree(fs)
	if err != nil {
		return b, err
	}
	b.Stats.FSEntries, b.Stats.FSBytes = th.entries, th.bytes
	if h == nil || h.Name != sealName {
		return b, refuse("no seal after the file tree")
	}
	sb, err := rd.body(h, maxSeal)
	if err != nil {
		return b, err
	}
	if err := checkSeal(sb, sha(hb), sha(mb), th, b.Signer, o.Keys); err != nil {
		return b, err
	}
	if _, err := tr.Next(); err != io.EOF {
		return b, refuse("data after the seal")
	}
	if !end.Ended() {
		return b, refuse("truncated (no end-of-archive marker)")
	}
	return b, nil
}

// reader reads a bundle's entries in order.
type reader struct {
	ctx   context.Context
	tr    *tar.Reader
	lim   Limits
	bytes int64 // contents written so far
}

// next returns the next entry's header.
func (rd *reader) next() (*tar.Header, error) {
	if err := rd.ctx.Err(); err != nil {
		return nil, err
	}
	h, err := rd.tr.Next()
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, refuse("truncated (ends before its seal)")
	}
	if err != nil {
		return nil, refuse("read: %v", err)
	}
	return h, nil
}

// small reads entry name, which must come next, of at most max bytes.
func (rd *reader) small(name string, max int64) ([]byte, error) {
	h, err := rd.next()
	if err != nil {
		if name == headerName {
			return nil, refuse("not a molt checkpoint bundle (%v)", err)
		}
		return nil, err
	}
	if h.Name != name {
		if name == headerName {
			return nil, refuse("not a molt checkpoint bundle (first entry %q, want %s)", h.Name, headerName)
		}
		return nil, refuse("entry %q where %s belongs", h.Name, name)
	}
	return rd.body(h, max)
}

// body reads the contents of a small regular entry.
func (rd *reader) body(h *tar.Header, max int64) ([]byte, error) {
	if h.Typeflag != tar.TypeReg {
		return nil, refuse("%s: not a regular file", h.Name)
	}
	if h.Size < 0 || h.Size > max {
		return nil, refuse("%s: %d bytes, at most %d allowed", h.Name, h.Size, max)
	}
	b := make([]byte, h.Size)
	if _, err := io.ReadFull(rd.tr, b); err != nil {
		return nil, refuse("%s: truncated: %v", h.Name, err)
	}
	return b, nil
}

// manifest decodes and checks the bundle's manifest.
func (rd *reader) manifest(b []byte, hdr Header, k *ckstore.Keyring) (ckstore.Manifest, error) {
	mf, err := ckstore.DecodeManifest(b)
	if err != nil {
		return mf, refuse("%v", err)
	}
	switch {
	case mf.ID != hdr.Checkpoint || mf.Kind != hdr.Kind:
		return mf, refuse("the manifest is checkpoint %s (%s), the header names %s (%s)", mf.ID, mf.Kind, hdr.Checkpoint, hdr.Kind)
	case mf.CRIU != hdr.CRIU:
		return mf, refuse("the manifest's images are CRIU %q's, the header says %q", mf.CRIU, hdr.CRIU)
	case mf.Parent != "" || mf.ParentDigest != "":
		return mf, refuse("the manifest names a parent: a bundle's checkpoint stands alone")
	case mf.Kind == v1.KindFull && len(mf.Objects) == 0:
		return mf, refuse("a full checkpoint without images")
	case len(mf.Objects) > rd.lim.Objects:
		return mf, refuse("%d objects, at most %d allowed", len(mf.Objects), rd.lim.Objects)
	case !ckstore.IsName(mf.Image):
		return mf, refuse("image %q is not a name", mf.Image)
	case mf.Signature == nil:
		return mf, refuse("the manifest is not signed")
	}
	if err := k.CheckBytes(*mf.Signature, mf.SignedBytes()); err != nil {
		return mf, fmt.Errorf("bundle refused: manifest: %w", err)
	}
	seen := map[string]bool{}
	var total int64
	for _, o := range mf.Objects {
		if _, err := objectName(o); err != nil {
			return mf, refuse("%v", err)
		}
		if seen[o.Path] {
			return mf, refuse("object %s listed twice", o.Path)
		}
		seen[o.Path] = true
		if total += o.Size; o.Size > rd.lim.Bytes || total > rd.lim.Bytes {
			return mf, refuse("objects of more than %d bytes", rd.lim.Bytes)
		}
	}
	return mf, nil
}

// object reads object o, which must come next, into dir.
func (rd *reader) object(dir string, o ckstore.Object) error {
	h, err := rd.next()
	if err != nil {
		return err
	}
	if h.Name != objectsDir+o.Path || h.Typeflag != tar.TypeReg {
		return refuse("entry %q where object %s belongs", h.Name, o.Path)
	}
	if h.Size != o.Size {
		return refuse("object %s: %d bytes, the manifest says %d", o.Path, h.Size, o.Size)
	}
	if rd.bytes += o.Size; rd.bytes > rd.lim.Bytes {
		return refuse("more than %d bytes", rd.lim.Bytes)
	}
	base, _ := objectName(o)
	f, err := os.OpenFile(filepath.Join(dir, base), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("bundle: object %s: %w", o.Path, err)
	}
	sum := sha256.New()
	_, err = io.CopyN(io.MultiWriter(f, sum), rd.tr, o.Size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return refuse("object %s: truncated", o.Path)
	}
	if err != nil {
		return fmt.Errorf("bundle: object %s: %w", o.Path, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); got != o.SHA256 {
		return refuse("object %s failed verification: content hash %.12s..., the signed manifest's %.12s...", o.Path, got, o.SHA256)
	}
	return nil
}

// tree reads the file tree into dir through the hardened extractor, and
// returns its digest and the header of the entry after it.
func (rd *reader) tree(dir string) (*treeHash, *tar.Header, error) {
	th := newTreeHash()
	x, err := image.NewExtractor(dir)
	if err != nil {
		return nil, nil, err
	}
	defer x.Close()
	first := true
	for {
		h, err := rd.next()
		if err != nil {
			return nil, nil, err
		}
		name, ok := strings.CutPrefix(h.Name, fsDir)
		if !ok {
			if first {
				return nil, nil, refuse("no file tree (entry %q)", h.Name)
			}
			if err := x.Finish(); err != nil {
				return nil, nil, refuse("file tree: %v", err)
			}
			return th, h, nil
		}
		if name == "" {
			name = "./"
		}
		if first != (name == "./") {
			return nil, nil, refuse("file tree: %q: the tree's root must come first, once", h.Name)
		}
		first = false
		if h.Typeflag == tar.TypeLink {
			l, ok := strings.CutPrefix(h.Linkname, fsDir)
			if !ok {
				return nil, nil, refuse("file tree: %q: hard link to %q, outside the tree", h.Name, h.Linkname)
			}
			h.Linkname = l
		}
		if th.entries+1 > rd.lim.Entries {
			return nil, nil, refuse("file tree: more than %d entries", rd.lim.Entries)
		}
		if h.Size < 0 {
			return nil, nil, refuse("file tree: %q: size %d", h.Name, h.Size)
		}
		if rd.bytes += h.Size; rd.bytes > rd.lim.Bytes {
			return nil, nil, refuse("more than %d bytes", rd.lim.Bytes)
		}
		h.Name = name
		content := th.entry(name, h.Linkname, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Size, h.ModTime, h.PAXRecords)
		if err := x.Put(h, io.TeeReader(rd.tr, content)); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, nil, refuse("file tree: %q: truncated", name)
			}
			return nil, nil, fmt.Errorf("bundle refused: file tree: %w", err)
		}
	}
}

// checkSeal checks the seal against what was read: the header's and
// the manifest's hashes, the tree's digest, signed by signer.
func checkSeal(b []byte, header, manifest string, th *treeHash, signer string, k *ckstore.Keyring) error {
	var s Seal
	if err := strictJSON(b, &s); err != nil {
		return refuse("seal: %v", err)
	}
	switch {
	case s.Format != Version:
		return refuse("seal format %d", s.Format)
	case s.Signature == nil:
		return refuse("the seal is not signed")
	case s.Signature.Key != signer:
		return refuse("the seal is signed by %s, the manifest by %s", s.Signature.Key, signer)
	}
	if err := k.CheckBytes(*s.Signature, s.signedBytes()); err != nil {
		return fmt.Errorf("bundle refused: seal: %w", err)
	}
	switch {
	case s.Header != header:
		return refuse("the header was changed after the bundle was sealed")
	case s.Manifest != manifest:
		return refuse("the manifest was changed after the bundle was sealed")
	case s.FSEntries != th.entries || s.FSBytes != th.bytes:
		return refuse("the file tree has %d entries of %d bytes, the seal says %d of %d", th.entries, th.bytes, s.FSEntries, s.FSBytes)
	case s.FS != th.sum():
		return refuse("the file tree failed verification (its digest is not the sealed one)")
	}
	return nil
}

// strictJSON decodes exactly one JSON value of b into v.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}
