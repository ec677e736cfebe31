package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/molt-sh/molt/internal/errdefs"
)

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// zstdMaxWindow bounds the memory a zstd stream can make the decoder
// take (the format lets a frame ask for up to 3.75 TiB).
const zstdMaxWindow = 128 << 20

// ImportTar extracts a tar stream (plain, or gzip or zstd-compressed:
// detected by their magic bytes) into dst, an existing empty directory. See the package
// documentation for what is refused.
func ImportTar(ctx context.Context, r io.Reader, dst string) error {
	x, err := newExtractor(dst)
	if err != nil {
		return err
	}
	defer x.close()
	src, done, err := decompress(sourceReader{r})
	if err != nil {
		return err
	}
	defer done()
	if err := x.readTar(ctx, src); err != nil {
		return err
	}
	return x.finish()
}

// decompress returns r uncompressed: gzip and zstd are told by their
// magic bytes, anything else is read as it is. done releases the
// decompressor.
func decompress(r io.Reader) (io.Reader, func(), error) {
	br := bufio.NewReaderSize(r, 1<<20)
	magic, _ := br.Peek(len(zstdMagic))
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err == io.EOF {
			// The magic bytes and then the end: a truncated header.
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return nil, nil, archiveError(err)
		}
		return decoded{zr}, func() { zr.Close() }, nil
	case bytes.Equal(magic, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, nil, archiveError(err)
		}
		return decoded{zr}, zr.Close, nil
	}
	return br, func() {}, nil
}

// decoded marks what a decompressor fails with, other than its source's
// errors, as a malformed archive, whatever words it uses.
type decoded struct{ r io.Reader }

func (d decoded) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil && err != io.EOF && !errors.As(err, new(sourceError)) && !errors.As(err, new(malformed)) {
		err = malformed{err}
	}
	return n, err
}

// readTar writes the entries of the tar stream src, which must end with
// its end-of-archive marker.
func (x *extractor) readTar(ctx context.Context, src io.Reader) error {
	end := NewEndReader(src)
	tr := tar.NewReader(end)
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("image import: %w", err)
		}
		h, err := tr.Next()
		if err == io.EOF {
			if !end.Ended() {
				return fmt.Errorf("image import: read archive: truncated (no end-of-archive marker): %w", errdefs.ErrInvalidArgument)
			}
			return nil
		}
		// With GODEBUG=tarinsecurepath=0 the reader flags names that the
		// rules in put refuse anyway, with a better message.
		if err != nil && !(errors.Is(err, tar.ErrInsecurePath) && h != nil) {
			return archiveError(err)
		}
		if h.Typeflag == tar.TypeXGlobalHeader { // archive-wide comments (git archive)
			continue
		}
		if err := x.put(h, ctxReader{ctx, tr}); err != nil {
			return err
		}
	}
}

// ctxReader ends a read when ctx ends: an entry's contents (a sparse
// file's declared size above all) can take long to copy.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF && !errors.As(err, new(sourceError)) {
		// Not the source failing: archive/tar refusing the entry's
		// contents (a sparse map that does not match its data, a
		// short entry), whatever words it uses.
		err = malformed{err}
	}
	return n, err
}

// sourceReader marks the errors of the stream an archive is read from, so
// that a failing source is told apart from a malformed archive.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = sourceError{err}
	}
	return n, err
}

type sourceError struct{ err error }

func (e sourceError) Error() string { return e.err.Error() }
func (e sourceError) Unwrap() error { return e.err }

// malformed is an error of archive/tar reading an entry's contents.
type malformed struct{ err error }

func (e malformed) Error() string { return e.err.Error() }
func (e malformed) Unwrap() error { return e.err }

// EndReader counts the zero bytes that end what has been read. An
// archive ends with two zero blocks; archive/tar also reports io.EOF for
// a stream cut before a header or in a file's padding, which would read a
// truncated archive as a smaller one: Ended tells the two apart.
type EndReader struct {
	r     io.Reader
	zeros int
}

// NewEndReader reads r, counting its trailing zero bytes.
func NewEndReader(r io.Reader) *EndReader { return &EndReader{r: r} }

func (e *EndReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	i := n - 1
	for i >= 0 && p[i] == 0 {
		i--
	}
	if i < 0 {
		e.zeros += n
	} else {
		e.zeros = n - 1 - i
	}
	return n, err
}

// Ended reports whether what was read so far ends with a tar archive's
// end marker (two zero blocks).
func (e *EndReader) Ended() bool { return e.zeros >= 2*512 }

func archiveError(err error) error {
	if badArchive(err) {
		return fmt.Errorf("image import: read archive: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("image import: read archive: %w", err)
}

// ImportDir copies the tree at src into dst, an existing empty directory,
// under the same rules as ImportTar. Hard-linked files in src stay linked.
func ImportDir(ctx context.Context, src, dst string) error {
	if err := checkNotInside(src, dst); err != nil {
		return err
	}
	x, err := newExtractor(dst)
	if err != nil {
		return err
	}
	defer x.close()
	if err := walkTree(ctx, "image import", src, x.put); err != nil {
		return err
	}
	return x.finish()
}

// checkNotInside refuses a dst inside src, which would copy the tree into
// itself without end.
func checkNotInside(src, dst string) error {
	s, err := realPath(src)
	if err != nil {
		return err
	}
	d, err := realPath(dst)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(s, d); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("image import: destination %s is inside the source %s: %w", dst, src, errdefs.ErrInvalidArgument)
	}
	return nil
}

func realPath(p string) (string, error) {
	p, err := filepath.EvalSymlinks(p)
	if err == nil {
		p, err = filepath.Abs(p)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("image import: %w: %w", err, errdefs.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("image import: %w", err)
	}
	return p, nil
}

// Import imports path into dst: with ImportDir if it is a directory, with
// ImportTar if it is a regular file.
func Import(ctx context.Context, path, dst string) error {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image import: %w: %w", err, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("image import: %w", err)
	}
	if fi.IsDir() {
		return ImportDir(ctx, path, dst)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("image import: %s is neither a directory nor a tar file: %w", path, errdefs.ErrInvalidArgument)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("image import: %w", err)
	}
	defer f.Close()
	return ImportTar(ctx, f, dst)
}
