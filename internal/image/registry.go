package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ggtar "github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/units"
)

// RegistryOptions says how to reach a registry.
type RegistryOptions struct {
	// Insecure talks plain HTTP to the registry. Without it, HTTPS,
	// except to a registry on a loopback or private address, which
	// go-containerregistry tries over HTTPS and then HTTP.
	Insecure bool
	// Keychain finds credentials; nil: authn.DefaultKeychain, which
	// reads the docker config file ($DOCKER_CONFIG/config.json, else
	// ~/.docker/config.json) and its credential helpers.
	Keychain authn.Keychain
	// Transport carries the requests; nil: http.DefaultTransport.
	Transport http.RoundTripper
}

func (o RegistryOptions) remote(ctx context.Context) []remote.Option {
	kc := o.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	opts := []remote.Option{
		remote.WithContext(ctx), remote.WithAuthFromKeychain(kc),
		remote.WithPlatform(gv1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithUserAgent("molt"),
	}
	if o.Transport != nil {
		opts = append(opts, remote.WithTransport(o.Transport))
	}
	return opts
}

// OpenRegistry opens the image ref names in its registry: the image of
// this machine's platform if ref names an index. The manifest's size is
// checked (HEAD) before it is read; go-containerregistry checks what it
// reads (manifests, config, layers) against the digests that name it.
func OpenRegistry(ctx context.Context, ref string, o RegistryOptions) (*Image, error) {
	r, err := parseRef(ref, o.Insecure)
	if err != nil {
		return nil, err
	}
	opts := o.remote(ctx)
	d, err := remote.Head(r, opts...)
	if err != nil {
		return nil, registryError("image pull", ref, err)
	}
	if d.Size > MaxManifestBytes {
		return nil, fmt.Errorf("image pull %s: manifest of %d bytes (at most %d): %w", ref, d.Size, MaxManifestBytes, errdefs.ErrInvalidArgument)
	}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, registryError("image pull", ref, err)
	}
	if len(desc.Manifest) > MaxManifestBytes {
		return nil, fmt.Errorf("image pull %s: manifest of %d bytes (at most %d): %w", ref, len(desc.Manifest), MaxManifestBytes, errdefs.ErrInvalidArgument)
	}
	img, err := desc.Image()
	if err != nil {
		return nil, registryError("image pull", ref, err)
	}
	return &Image{img: img, bound: true, desc: r.Name()}, nil
}

// registryError gives err an errdefs kind from the registry's answer.
func registryError(op, ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%s %s: %w: %w", op, ref, err, errdefs.ErrNotFound)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%s %s: %w (credentials come from the daemon's docker config file): %w", op, ref, err, errdefs.ErrFailedPrecondition)
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s %s: %w", op, ref, err)
	}
	return fmt.Errorf("%s %s: %w: %w", op, ref, err, errdefs.ErrUnavailable)
}

// Push makes an image of the tree at src, one layer (a gzip-compressed
// tar written in the order ImportDir reads a tree: sorted, parents
// first, mtimes, owners, modes and xattrs kept) and a config carrying
// cfg, and pushes it to ref. The layer is staged in a file made in tmp.
// Device nodes are left out (an import refuses them) and named in log.
// It returns the pushed manifest's digest.
func Push(ctx context.Context, src string, cfg Config, ref string, o RegistryOptions, tmp string, log io.Writer) (string, error) {
	if log == nil {
		log = io.Discard
	}
	r, err := parseRef(ref, o.Insecure)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp(tmp, "layer-*.tar.gz")
	if err != nil {
		return "", fmt.Errorf("image push: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	start := time.Now()
	if err := writeLayer(ctx, src, f, log); err != nil {
		return "", err
	}
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("image push: %w", err)
	}
	fmt.Fprintf(log, "layer: %s compressed in %.1fs\n", units.Bytes(st.Size()), time.Since(start).Seconds())
	layer, err := ggtar.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(f.Name()) },
		ggtar.WithMediaType(types.OCILayer))
	if err != nil {
		return "", fmt.Errorf("image push: %w", err)
	}
	img, err := mutate.ConfigFile(empty.Image, &gv1.ConfigFile{
		Architecture: runtime.GOARCH, OS: "linux", Created: gv1.Time{Time: time.Now().UTC().Truncate(time.Second)},
		Config: gv1.Config{Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd},
		RootFS: gv1.RootFS{Type: "layers"},
	})
	if err != nil {
		return "", fmt.Errorf("image push: %w", err)
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return "", fmt.Errorf("image push: %w", err)
	}
	start = time.Now()
	if err := remote.Write(r, img, o.remote(ctx)...); err != nil {
		return "", registryError("image push", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", fmt.Errorf("image push: %w", err)
	}
	fmt.Fprintf(log, "pushed %s@%s in %.1fs\n", r.Context().Name(), d, time.Since(start).Seconds())
	return d.String(), nil
}

// writeLayer writes the tree at src to w as a gzip-compressed tar.
func writeLayer(ctx context.Context, src string, w io.Writer, log io.Writer) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return fmt.Errorf("image push: %w", err)
	}
	tw := tar.NewWriter(zw)
	err = walkTree(ctx, "image push", src, func(h *tar.Header, r io.Reader) error {
		if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
			fmt.Fprintf(log, "left out device node /%s\n", h.Name)
			return nil
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("image push: %s: %w", h.Name, err)
		}
		if r != nil {
			// The size in the header was read first: a file that
			// grows is cut there, one that shrinks fails the push.
			if _, err := io.CopyN(tw, r, h.Size); err != nil {
				return fmt.Errorf("image push: %s: %w", h.Name, err)
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		return fmt.Errorf("image push: write layer: %w", err)
	}
	return nil
}
