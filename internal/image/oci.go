package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	ggtar "github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/units"
)

// Bounds on what an image's metadata may make molt read, checked before
// reading it. Layer contents are bounded by the disk they land on.
const (
	MaxManifestBytes = 4 << 20
	MaxConfigBytes   = 8 << 20
	MaxLayers        = 256
)

// Config is what an OCI or Docker image's configuration says of the
// processes of a container made from it, the part molt applies to its
// sandboxes.
type Config struct {
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// Image is an OCI or Docker image opened for unpacking: from a registry
// (OpenRegistry), a docker-save archive or an OCI image layout
// (OpenArchive). Close releases what opening it took.
type Image struct {
	img gv1.Image
	// bound says the image's manifest is its identity (a registry's or
	// a layout's): the config must match the manifest's digest of it,
	// and the layers the manifest's count. A docker-save archive has
	// no such manifest; its layers are still checked against the
	// config's diff IDs.
	bound bool
	desc  string
	close func() error
}

// Close releases the image's temporary files.
func (i *Image) Close() error {
	if i.close == nil {
		return nil
	}
	return i.close()
}

// String names where the image came from.
func (i *Image) String() string { return i.desc }

// Unpack applies the image's layers in order to dst, an existing empty
// directory, through the same checks as ImportTar, with whiteouts and
// opaque directories, and returns the image's config. Each layer's
// uncompressed contents must hash to its diff ID in the config, checked
// once the layer is read to its end; a layer that does not fails the
// unpack with errdefs.ErrInvalidArgument. Progress lines go to log
// (may be nil).
func (i *Image) Unpack(ctx context.Context, dst string, log io.Writer) (Config, error) {
	if log == nil {
		log = io.Discard
	}
	cf, err := i.configFile()
	if err != nil {
		return Config{}, err
	}
	x, err := newExtractor(dst)
	if err != nil {
		return Config{}, err
	}
	defer x.close()
	ids := cf.RootFS.DiffIDs
	for n, id := range ids {
		start := time.Now()
		size, err := i.applyLayer(ctx, x, id)
		if err != nil {
			return Config{}, fmt.Errorf("image import: layer %d of %d (%s): %w", n+1, len(ids), id, err)
		}
		fmt.Fprintf(log, "layer %d/%d %s: %s in %.1fs\n", n+1, len(ids), short(id), units.Bytes(size), time.Since(start).Seconds())
	}
	if err := x.finish(); err != nil {
		return Config{}, err
	}
	c := cf.Config
	return Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}, nil
}

func short(h gv1.Hash) string {
	if len(h.Hex) > 12 {
		return h.Algorithm + ":" + h.Hex[:12]
	}
	return h.String()
}

// applyLayer writes the layer with diff ID id over what x holds and
// returns its uncompressed size. The layer is fetched, decompressed and
// hashed by a goroutine of its own, ahead of the extractor.
func (i *Image) applyLayer(ctx context.Context, x *extractor, id gv1.Hash) (int64, error) {
	if id.Algorithm != "sha256" {
		return 0, fmt.Errorf("diff ID algorithm %q: only sha256 is supported: %w", id.Algorithm, errdefs.ErrInvalidArgument)
	}
	l, err := i.img.LayerByDiffID(id)
	if err != nil {
		return 0, fmt.Errorf("find layer: %w", err)
	}
	rc, err := i.uncompressed(l)
	if err != nil {
		return 0, layerReadError(err)
	}
	h := sha256.New()
	counted := &countReader{r: io.TeeReader(rc, h)}
	ahead := readAhead(counted, rc)
	x.beginLayer()
	err = x.readTar(ctx, sourceReader{ahead})
	if err == nil {
		// The digest covers the whole stream, padding after the
		// end-of-archive marker too.
		_, err = io.Copy(io.Discard, ctxReader{ctx, sourceReader{ahead}})
	}
	ahead.Close()
	if err != nil {
		return 0, layerReadError(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != id.Hex {
		return 0, fmt.Errorf("contents do not match the layer's digest (got sha256:%s): %w", got, errdefs.ErrInvalidArgument)
	}
	if err := x.endLayer(); err != nil {
		return 0, err
	}
	return counted.n, nil
}

// uncompressed opens the layer's tar stream. A registry's or a layout's
// layer is read as stored (go-containerregistry checks a registry's blob
// against its digest) and decompressed here, by its magic bytes; a
// docker-save archive's through go-containerregistry, which would
// otherwise compress it to find its digest.
func (i *Image) uncompressed(l gv1.Layer) (io.ReadCloser, error) {
	if !i.bound {
		return l.Uncompressed()
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, err
	}
	r, done, err := decompress(sourceReader{rc})
	if err != nil {
		rc.Close()
		return nil, err
	}
	return &closeFuncs{Reader: r, close: func() error { done(); return rc.Close() }}, nil
}

type closeFuncs struct {
	io.Reader
	close func() error
}

func (c *closeFuncs) Close() error { return c.close() }

// aheadReader reads its source in a goroutine of its own, a few chunks
// ahead of its reader, so that fetching, decompressing and hashing a
// layer run beside the extraction.
type aheadReader struct {
	ch    chan []byte
	cur   []byte
	err   error // the source's last error, set before ch is closed
	stop  chan struct{}
	done  chan struct{}
	src   io.Closer
	close sync.Once
}

const aheadChunk = 256 << 10

// readAhead starts reading r; Close stops it, closing src (which
// unblocks a read under way), and waits for the goroutine to end.
func readAhead(r io.Reader, src io.Closer) *aheadReader {
	a := &aheadReader{ch: make(chan []byte, 8), stop: make(chan struct{}), done: make(chan struct{}), src: src}
	go func() {
		defer close(a.done)
		defer close(a.ch)
		for {
			buf := make([]byte, aheadChunk)
			n, err := io.ReadFull(r, buf)
			if n > 0 {
				select {
				case a.ch <- buf[:n]:
				case <-a.stop:
					a.err = errors.New("read ahead: stopped")
					return
				}
			}
			if err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			if err != nil {
				a.err = err
				return
			}
		}
	}()
	return a
}

func (a *aheadReader) Read(p []byte) (int, error) {
	for len(a.cur) == 0 {
		b, ok := <-a.ch
		if !ok {
			return 0, a.err
		}
		a.cur = b
	}
	n := copy(p, a.cur)
	a.cur = a.cur[n:]
	return n, nil
}

// Close stops the goroutine and waits for it: what it wrote (a hash, a
// count) may be read afterwards.
func (a *aheadReader) Close() {
	a.close.Do(func() {
		close(a.stop)
		a.src.Close()
		<-a.done
	})
}

// layerReadError marks go-containerregistry's refusal of a blob whose
// digest or size is not what the manifest says (its error type is
// internal to it) as the image's fault.
func layerReadError(err error) error {
	if strings.Contains(err.Error(), "error verifying") && !errors.Is(err, errdefs.ErrInvalidArgument) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return err
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// configFile reads and checks the image's config.
func (i *Image) configFile() (*gv1.ConfigFile, error) {
	var want gv1.Hash
	layers := -1
	if i.bound {
		m, err := i.img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("image import: read manifest: %w", err)
		}
		if m.Config.Size > MaxConfigBytes || m.Config.Size < 0 {
			return nil, fmt.Errorf("image import: config of %d bytes (at most %d): %w", m.Config.Size, MaxConfigBytes, errdefs.ErrInvalidArgument)
		}
		if len(m.Layers) > MaxLayers {
			return nil, fmt.Errorf("image import: %d layers (at most %d): %w", len(m.Layers), MaxLayers, errdefs.ErrInvalidArgument)
		}
		want, layers = m.Config.Digest, len(m.Layers)
	}
	raw, err := i.img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image import: read config: %w", layerReadError(err))
	}
	if len(raw) > MaxConfigBytes {
		return nil, fmt.Errorf("image import: config of %d bytes (at most %d): %w", len(raw), MaxConfigBytes, errdefs.ErrInvalidArgument)
	}
	if i.bound {
		if got := sha256.Sum256(raw); want.Algorithm != "sha256" || hex.EncodeToString(got[:]) != want.Hex {
			return nil, fmt.Errorf("image import: config does not match the manifest's digest %s: %w", want, errdefs.ErrInvalidArgument)
		}
	}
	cf, err := gv1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("image import: parse config: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	switch n := len(cf.RootFS.DiffIDs); {
	case n > MaxLayers:
		return nil, fmt.Errorf("image import: %d layers (at most %d): %w", n, MaxLayers, errdefs.ErrInvalidArgument)
	case layers >= 0 && n != layers:
		return nil, fmt.Errorf("image import: the config lists %d layers, the manifest %d: %w", n, layers, errdefs.ErrInvalidArgument)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return nil, fmt.Errorf("image import: an image for %s, not linux: %w", cf.OS, errdefs.ErrInvalidArgument)
	}
	return cf, nil
}

// Format is what a path given to import holds.
type Format int

const (
	FormatDir        Format = iota // a root filesystem tree
	FormatTar                      // a tar (or tar.gz, tar.zst) of a root filesystem
	FormatDocker                   // a docker-save archive
	FormatOCILayout                // an OCI image layout directory
	FormatOCIArchive               // a tar of an OCI image layout
)

func (f Format) String() string {
	return [...]string{"dir", "tar", "docker-archive", "oci-layout", "oci-archive"}[f]
}

// Detect tells what p holds: a directory with an oci-layout file is an
// OCI image layout; a plain tar with a top-level manifest.json is a
// docker-save archive, one with oci-layout and index.json an OCI layout
// archive; anything else is a root filesystem.
func Detect(p string) (Format, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return 0, importPathError(err)
	}
	if fi.IsDir() {
		if st, err := os.Lstat(filepath.Join(p, "oci-layout")); err == nil && st.Mode().IsRegular() {
			return FormatOCILayout, nil
		}
		return FormatDir, nil
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("image import: %s is neither a directory nor a tar file: %w", p, errdefs.ErrInvalidArgument)
	}
	top, err := topEntries(p)
	if err != nil {
		return 0, err
	}
	switch {
	case top["manifest.json"] > 0:
		return FormatDocker, nil
	case top["oci-layout"] > 0 && top["index.json"] > 0:
		return FormatOCIArchive, nil
	}
	return FormatTar, nil
}

func importPathError(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("image import: %w: %w", err, errdefs.ErrNotFound)
	}
	return fmt.Errorf("image import: %w", err)
}

// OpenArchive opens the docker-save archive, OCI layout or OCI layout
// archive at p (see Detect). An archive of a layout is unpacked, with
// ImportTar's checks, into a directory made in tmp that Close removes.
func OpenArchive(ctx context.Context, p string, f Format, tmp string) (*Image, error) {
	switch f {
	case FormatDocker:
		return openDocker(p)
	case FormatOCILayout:
		return openLayout(p, p)
	case FormatOCIArchive:
		dir, err := os.MkdirTemp(tmp, "oci-")
		if err != nil {
			return nil, fmt.Errorf("image import: %w", err)
		}
		fail := func(err error) (*Image, error) {
			os.RemoveAll(dir)
			return nil, err
		}
		in, err := os.Open(p)
		if err != nil {
			return fail(importPathError(err))
		}
		err = ImportTar(ctx, in, dir)
		in.Close()
		if err != nil {
			return fail(err)
		}
		img, err := openLayout(dir, p)
		if err != nil {
			return fail(err)
		}
		img.close = func() error { return os.RemoveAll(dir) }
		return img, nil
	}
	return nil, fmt.Errorf("image import: %s is a %s, not an image archive: %w", p, f, errdefs.ErrInvalidArgument)
}

func openDocker(p string) (*Image, error) {
	sizes, err := tarSizes(p)
	if err != nil {
		return nil, err
	}
	if n := sizes["manifest.json"]; n > MaxManifestBytes {
		return nil, fmt.Errorf("image import: manifest.json of %d bytes (at most %d): %w", n, MaxManifestBytes, errdefs.ErrInvalidArgument)
	}
	m, err := ggtar.LoadManifest(func() (io.ReadCloser, error) { return os.Open(p) })
	if err != nil {
		return nil, fmt.Errorf("image import: read manifest.json: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(m) != 1 {
		return nil, fmt.Errorf("image import: the archive holds %d images, want 1: %w", len(m), errdefs.ErrInvalidArgument)
	}
	if n := sizes[strings.TrimPrefix(m[0].Config, "./")]; n > MaxConfigBytes {
		return nil, fmt.Errorf("image import: config of %d bytes (at most %d): %w", n, MaxConfigBytes, errdefs.ErrInvalidArgument)
	}
	if len(m[0].Layers) > MaxLayers {
		return nil, fmt.Errorf("image import: %d layers (at most %d): %w", len(m[0].Layers), MaxLayers, errdefs.ErrInvalidArgument)
	}
	img, err := ggtar.ImageFromPath(p, nil)
	if err != nil {
		return nil, fmt.Errorf("image import: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return &Image{img: img, desc: p}, nil
}

// openLayout opens the image of the OCI layout at dir: the index's only
// image, or the one for this machine's platform.
func openLayout(dir, desc string) (*Image, error) {
	if err := plainFiles(dir); err != nil {
		return nil, err
	}
	st, err := os.Stat(filepath.Join(dir, "index.json"))
	if err != nil {
		return nil, importPathError(err)
	}
	if st.Size() > MaxManifestBytes {
		return nil, fmt.Errorf("image import: index.json of %d bytes (at most %d): %w", st.Size(), MaxManifestBytes, errdefs.ErrInvalidArgument)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image import: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	img, err := pickImage(idx, 0)
	if err != nil {
		return nil, err
	}
	return &Image{img: img, bound: true, desc: desc}, nil
}

// plainFiles refuses a layout holding anything but directories and
// regular files: go-containerregistry opens blobs by path, and a blob
// that is a symlink (an archive may hold one pointing anywhere) would
// make it read a file of the host's.
func plainFiles(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return importPathError(err)
		}
		if p == dir || d.IsDir() || d.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		return fmt.Errorf("image import: OCI layout entry %q is not a regular file or a directory: %w", rel, errdefs.ErrInvalidArgument)
	})
}

// pickImage returns the image of idx for this platform, following nested
// indexes a few levels down. Each manifest read is bounded and checked
// against its digest.
func pickImage(idx gv1.ImageIndex, depth int) (gv1.Image, error) {
	if depth > 2 {
		return nil, fmt.Errorf("image import: indexes nested too deep: %w", errdefs.ErrInvalidArgument)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image import: read index: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	var pick *gv1.Descriptor
	for k := range im.Manifests {
		d := &im.Manifests[k]
		if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
			continue
		}
		if d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH) {
			continue
		}
		if pick != nil {
			return nil, fmt.Errorf("image import: the index has more than one image for linux/%s: %w", runtime.GOARCH, errdefs.ErrInvalidArgument)
		}
		pick = d
	}
	if pick == nil {
		return nil, fmt.Errorf("image import: no image for linux/%s in the index: %w", runtime.GOARCH, errdefs.ErrInvalidArgument)
	}
	if pick.Size > MaxManifestBytes || pick.Size < 0 {
		return nil, fmt.Errorf("image import: manifest of %d bytes (at most %d): %w", pick.Size, MaxManifestBytes, errdefs.ErrInvalidArgument)
	}
	var next interface{ RawManifest() ([]byte, error) }
	if pick.MediaType.IsIndex() {
		next, err = idx.ImageIndex(pick.Digest)
	} else {
		next, err = idx.Image(pick.Digest)
	}
	if err != nil {
		return nil, fmt.Errorf("image import: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	raw, err := next.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("image import: read manifest: %w", err)
	}
	if got := sha256.Sum256(raw); pick.Digest.Algorithm != "sha256" || hex.EncodeToString(got[:]) != pick.Digest.Hex {
		return nil, fmt.Errorf("image import: manifest does not match its digest %s: %w", pick.Digest, errdefs.ErrInvalidArgument)
	}
	if sub, ok := next.(gv1.ImageIndex); ok {
		return pickImage(sub, depth+1)
	}
	return next.(gv1.Image), nil
}

// parseRef parses an image reference; insecure allows plain HTTP.
func parseRef(ref string, insecure bool) (name.Reference, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	return r, nil
}

// topEntries returns the sizes of the top-level entries of the tar file
// at p; a compressed file, or one that is not a tar, has none.
func topEntries(p string) (map[string]int64, error) {
	return scanTar(p, func(n string) bool { return !strings.Contains(n, "/") })
}

// tarSizes returns the sizes of the entries of the tar file at p.
func tarSizes(p string) (map[string]int64, error) {
	return scanTar(p, func(string) bool { return true })
}

// maxScanned bounds the entries scanTar keeps.
const maxScanned = 1 << 16

func scanTar(p string, keep func(string) bool) (map[string]int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, importPathError(err)
	}
	defer f.Close()
	magic := make([]byte, len(zstdMagic))
	if _, err := io.ReadFull(f, magic); err != nil || bytes.HasPrefix(magic, gzipMagic) || bytes.Equal(magic, zstdMagic) {
		return nil, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	out := map[string]int64{}
	tr := tar.NewReader(f) // skips contents by seeking
	for {
		h, err := tr.Next()
		if err != nil {
			// The end, or not a tar: either way what was seen is all.
			return out, nil
		}
		n := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || !keep(n) {
			continue
		}
		if len(out) >= maxScanned {
			return nil, fmt.Errorf("image import: more than %d entries to scan: %w", maxScanned, errdefs.ErrInvalidArgument)
		}
		out[n] = h.Size
	}
}

// Digest is the image's manifest digest, or "" for a docker-save archive
// (which has no manifest of its own).
func (i *Image) Digest() string {
	if !i.bound {
		return ""
	}
	d, err := i.img.Digest()
	if err != nil {
		return ""
	}
	return d.String()
}
