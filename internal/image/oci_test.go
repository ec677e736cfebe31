package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ggtar "github.com/google/go-containerregistry/pkg/v1/tarball"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// startRegistry serves a registry in memory on loopback; h wraps its
// handler when not nil.
func startRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// layerOf makes an image layer of entries.
func layerOf(t *testing.T, ents ...ent) gv1.Layer {
	t.Helper()
	b := tarball(t, ents...)
	l, err := ggtar.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOf(t *testing.T, cfg gv1.Config, layers ...gv1.Layer) gv1.Image {
	t.Helper()
	img, err := mutate.Config(empty.Image, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layers...); err != nil {
		t.Fatal(err)
	}
	return img
}

func whiteout(name string) ent { return file(name, 0o644, "") }

// layeredImage has three layers exercising whiteouts and opaque
// directories; wantLayered is the tree it makes.
func layeredImage(t *testing.T) gv1.Image {
	return imageOf(t, gv1.Config{Env: []string{"PATH=/usr/bin:/bin", "GREETING=hi"}, WorkingDir: "/srv", User: "1000:1000",
		Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"echo hi"}},
		layerOf(t, dir("etc/", 0o755), file("etc/keep", 0o644, "keep"), file("etc/gone", 0o644, "gone"),
			dir("etc/sub/", 0o755), file("etc/sub/deep", 0o644, "deep"),
			dir("opq/", 0o755), file("opq/old", 0o644, "old"), dir("opq/olddir/", 0o755), file("opq/olddir/f", 0o644, "f"),
			dir("ro/", 0o555), file("ro/f", 0o644, "f"), file("target", 0o644, "t"), hardlink("etc/link", "etc/keep"),
			dir("dirtofile/", 0o755), file("dirtofile/x", 0o644, "x")),
		layerOf(t, whiteout("etc/.wh.gone"), whiteout("etc/.wh.sub"),
			dir("opq/", 0o750), file("opq/new", 0o644, "new"), whiteout("opq/.wh..wh..opq"), dir("opq/olddir/", 0o755),
			whiteout("ro/.wh.f"), hardlink("target2", "target"), file("dirtofile", 0o600, "now a file")),
		layerOf(t, file("etc/gone", 0o600, "back"), whiteout("etc/.wh.never-there"), whiteout("nodir/.wh.x")),
	)
}

func checkLayered(t *testing.T, dst string) {
	t.Helper()
	var got []string
	err := filepath.WalkDir(dst, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dst, p)
		if d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			rel += "=" + string(b)
		}
		got = append(got, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".", "dirtofile=now a file", "etc", "etc/gone=back", "etc/keep=keep", "etc/link=keep",
		"opq", "opq/new=new", "opq/olddir", "ro", "target=t", "target2=t"}
	if !slices.Equal(got, want) {
		t.Errorf("tree:\n%q\nwant\n%q", got, want)
	}
	if st := lstat(t, filepath.Join(dst, "opq")); st.Mode&0o7777 != 0o750 {
		t.Errorf("opq: mode %o, want 750 (the upper layer's)", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(dst, "ro")); st.Mode&0o7777 != 0o555 {
		t.Errorf("ro: mode %o, want 555", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(dst, "etc/gone")); st.Mode&0o7777 != 0o600 {
		t.Errorf("etc/gone: mode %o, want 600", st.Mode&0o7777)
	}
	if a, b := lstat(t, filepath.Join(dst, "target")), lstat(t, filepath.Join(dst, "target2")); a.Ino != b.Ino {
		t.Error("target2 is not a hard link to the lower layer's target")
	}
}

func checkLayeredConfig(t *testing.T, cfg Config) {
	t.Helper()
	if !slices.Equal(cfg.Env, []string{"PATH=/usr/bin:/bin", "GREETING=hi"}) || cfg.WorkingDir != "/srv" || cfg.User != "1000:1000" ||
		!slices.Equal(cfg.Entrypoint, []string{"/bin/sh", "-c"}) || !slices.Equal(cfg.Cmd, []string{"echo hi"}) {
		t.Errorf("config %+v", cfg)
	}
}

func push(t *testing.T, reg, repo string, img gv1.Image) string {
	t.Helper()
	ref := reg + "/" + repo
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

func unpack(t *testing.T, img *Image, err error) (string, Config, error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	dst := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg, err := img.Unpack(t.Context(), dst, &out)
	if err == nil && !strings.Contains(out.String(), "layer 1/") {
		t.Errorf("no progress lines: %q", out.String())
	}
	return dst, cfg, err
}

func TestPullLayered(t *testing.T) {
	reg := startRegistry(t, nil)
	ref := push(t, reg, "test/layered:v1", layeredImage(t))
	img, err := OpenRegistry(t.Context(), ref, RegistryOptions{})
	dst, cfg, err := unpack(t, img, err)
	if err != nil {
		t.Fatal(err)
	}
	checkLayered(t, dst)
	checkLayeredConfig(t, cfg)
}

func TestPullMissing(t *testing.T) {
	reg := startRegistry(t, nil)
	_, err := OpenRegistry(t.Context(), reg+"/no/such:tag", RegistryOptions{})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("got %v, want ErrNotFound", err)
	}
}

func TestImportDockerArchive(t *testing.T) {
	p := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("test/layered:v1")
	if err := ggtar.WriteToFile(p, tag, layeredImage(t)); err != nil {
		t.Fatal(err)
	}
	f, err := Detect(p)
	if err != nil || f != FormatDocker {
		t.Fatalf("Detect: %v %v, want docker-archive", f, err)
	}
	img, err := OpenArchive(t.Context(), p, f, t.TempDir())
	dst, cfg, err := unpack(t, img, err)
	if err != nil {
		t.Fatal(err)
	}
	checkLayered(t, dst)
	checkLayeredConfig(t, cfg)
}

// ociLayout writes img as an OCI layout in a new directory.
func ociLayout(t *testing.T, img gv1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDir writes the tree at dir as a tar file.
func tarDir(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "archive.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = walkTree(t.Context(), "test", dir, func(h *tar.Header, r io.Reader) error {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if r != nil {
			_, err := io.Copy(tw, r)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestImportOCILayout(t *testing.T) {
	dir := ociLayout(t, layeredImage(t))
	for _, c := range []struct {
		path string
		want Format
	}{{dir, FormatOCILayout}, {tarDir(t, dir), FormatOCIArchive}} {
		t.Run(c.want.String(), func(t *testing.T) {
			f, err := Detect(c.path)
			if err != nil || f != c.want {
				t.Fatalf("Detect: %v %v, want %v", f, err, c.want)
			}
			tmp := t.TempDir()
			img, err := OpenArchive(t.Context(), c.path, f, tmp)
			dst, cfg, err := unpack(t, img, err)
			if err != nil {
				t.Fatal(err)
			}
			checkLayered(t, dst)
			checkLayeredConfig(t, cfg)
			if names := dirNames(t, tmp); len(names) != 0 {
				t.Errorf("left in the temporary directory: %v", names)
			}
		})
	}
}

func TestDetectRootfs(t *testing.T) {
	d := t.TempDir()
	p := filepath.Join(d, "rootfs.tar")
	if err := os.WriteFile(p, tarball(t, file("manifest.json.txt", 0o644, "x"), dir("etc/", 0o755), file("etc/manifest.json", 0o644, "x")), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]Format{d: FormatDir, p: FormatTar} {
		if f, err := Detect(p); err != nil || f != want {
			t.Errorf("Detect(%s) = %v %v, want %v", p, f, err, want)
		}
	}
}

// Hostile layers are refused as hostile archives are, and nothing lands
// outside the destination.
func TestUnpackRefusesHostileLayers(t *testing.T) {
	for _, c := range []struct {
		name   string
		layers func(outside string) [][]ent
		want   string
	}{
		{"absolute", func(o string) [][]ent { return [][]ent{{file(o+"/evil", 0o644, "x")}} }, "absolute path"},
		{"dotdot", func(string) [][]ent { return [][]ent{{file("../outside/evil", 0o644, "x")}} }, "path escapes the root"},
		{"device", func(string) [][]ent { return [][]ent{{entry(tar.TypeChar, "dev/null", 0o666)}} }, "device nodes are not allowed"},
		{"symlink then write", func(o string) [][]ent {
			return [][]ent{{symlink("etc", o)}, {file("etc/passwd", 0o644, "x")}}
		}, "goes through a symlink"},
		{"relative symlink escape", func(string) [][]ent { return [][]ent{{symlink("up", "../outside")}} }, "escapes the root"},
		{"whiteout dotdot", func(string) [][]ent { return [][]ent{{dir("a/", 0o755)}, {whiteout("a/.wh...")}} }, `whiteout of ".."`},
		{"whiteout dot", func(string) [][]ent { return [][]ent{{dir("a/", 0o755)}, {whiteout("a/.wh..")}} }, `whiteout of "."`},
		{"whiteout empty", func(string) [][]ent { return [][]ent{{dir("a/", 0o755)}, {whiteout("a/.wh.")}} }, `whiteout of ""`},
		{"whiteout through symlink", func(o string) [][]ent {
			return [][]ent{{symlink("l", o)}, {whiteout("l/.wh.keep")}}
		}, "goes through a symlink"},
		{"opaque through symlink", func(o string) [][]ent {
			return [][]ent{{symlink("l", o)}, {whiteout("l/.wh..wh..opq")}}
		}, "goes through a symlink"},
		{"hard link out", func(o string) [][]ent { return [][]ent{{hardlink("h", o+"/keep")}} }, "absolute path"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst, outside := sandbox(t)
			if err := os.WriteFile(filepath.Join(outside, "keep"), []byte("k"), 0o644); err != nil {
				t.Fatal(err)
			}
			var layers []gv1.Layer
			for _, l := range c.layers(outside) {
				layers = append(layers, layerOf(t, l...))
			}
			img := &Image{img: imageOf(t, gv1.Config{}, layers...), bound: true}
			_, err := img.Unpack(t.Context(), dst, nil)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want ErrInvalidArgument with %q", err, c.want)
			}
			if names := dirNames(t, outside); !slices.Equal(names, []string{"keep"}) {
				t.Errorf("outside changed: %v", names)
			}
		})
	}
}

// A layout whose blob is a symlink (to a file of the host's) is refused
// before anything is read through it.
func TestImportOCILayoutRefusesSymlinks(t *testing.T) {
	img := imageOf(t, gv1.Config{}, layerOf(t, file("f", 0o644, "x")))
	dir := ociLayout(t, img)
	l, _ := img.Layers()
	d, _ := l[0].Digest()
	blob := filepath.Join(dir, "blobs", "sha256", d.Hex)
	host := filepath.Join(t.TempDir(), "host-file")
	b, _ := os.ReadFile(blob)
	if err := os.WriteFile(host, b, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Remove(blob)
	if err := os.Symlink(host, blob); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, tarDir(t, dir)} {
		f, err := Detect(p)
		if err != nil {
			t.Fatal(err)
		}
		_, err = OpenArchive(t.Context(), p, f, t.TempDir())
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: got %v, want a refusal of the symlink", f, err)
		}
	}
}

// A layer whose contents do not match its digest is refused: in a layout
// (read from disk as is) and from a registry (go-containerregistry
// checks the blob).
func TestUnpackRefusesWrongDigest(t *testing.T) {
	good := layerOf(t, file("f", 0o644, "good contents"))
	img := imageOf(t, gv1.Config{}, good)
	t.Run("layout", func(t *testing.T) {
		dir := ociLayout(t, img)
		d, _ := good.Digest()
		bad := gzipped(t, tarball(t, file("f", 0o644, "evil contents")))
		if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", d.Hex), bad, 0o644); err != nil {
			t.Fatal(err)
		}
		i, err := OpenArchive(t.Context(), dir, FormatOCILayout, t.TempDir())
		_, _, err = unpack(t, i, err)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "do not match the layer's digest") {
			t.Errorf("got %v, want a digest mismatch", err)
		}
	})
	t.Run("registry", func(t *testing.T) {
		d, _ := good.Digest()
		rc, err := good.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		blob, _ := io.ReadAll(rc)
		// The gzip header's mtime: the layer still reads as the same
		// tar, but is not the blob the manifest names.
		blob[4] ^= 0xff
		var served atomic.Int32
		reg := startRegistry(t, func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
					served.Add(1)
					w.Write(blob)
					return
				}
				h.ServeHTTP(w, r)
			})
		})
		ref := push(t, reg, "test/tampered:v1", img)
		i, err := OpenRegistry(t.Context(), ref, RegistryOptions{})
		_, _, err = unpack(t, i, err)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "error verifying sha256") || served.Load() == 0 {
			t.Errorf("got %v (tampered blob served %d times), want ErrInvalidArgument", err, served.Load())
		}
	})
}

func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// Credentials come from the docker config file.
func TestPullAuth(t *testing.T) {
	reg := startRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "molt" || p != "secret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	img := imageOf(t, gv1.Config{}, layerOf(t, file("f", 0o644, "x")))
	r, _ := name.ParseReference(reg + "/test/private:v1")
	if err := remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: "molt", Password: "secret"})); err != nil {
		t.Fatal(err)
	}
	cfgDir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", cfgDir)
	if _, err := OpenRegistry(t.Context(), r.String(), RegistryOptions{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("without credentials: got %v, want ErrFailedPrecondition", err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte("molt:secret"))
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(`{"auths":{"`+reg+`":{"auth":"`+auth+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	i, err := OpenRegistry(t.Context(), r.String(), RegistryOptions{})
	dst, _, err := unpack(t, i, err)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "f")); string(b) != "x" {
		t.Errorf("f = %q", b)
	}
}

// Push writes a tree that a pull makes again, equal.
func TestPushPullRoundTrip(t *testing.T) {
	src := makeTree(t)
	reg := startRegistry(t, nil)
	cfg := Config{Env: []string{"A=1"}, WorkingDir: "/w", User: "nobody", Cmd: []string{"true"}}
	var out bytes.Buffer
	dg, err := Push(t.Context(), src, cfg, reg+"/test/pushed:v1", RegistryOptions{}, t.TempDir(), &out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dg, "sha256:") || !strings.Contains(out.String(), "pushed") {
		t.Errorf("digest %q, log %q", dg, out.String())
	}
	i, err := OpenRegistry(t.Context(), reg+"/test/pushed@"+dg, RegistryOptions{})
	dst, got, err := unpack(t, i, err)
	if err != nil {
		t.Fatal(err)
	}
	compareTrees(t, src, dst, true)
	if !slices.Equal(got.Env, cfg.Env) || got.WorkingDir != "/w" || got.User != "nobody" || !slices.Equal(got.Cmd, cfg.Cmd) {
		t.Errorf("config %+v, want %+v", got, cfg)
	}
	// The layer is deterministic: a second push of the same tree is the
	// same layer.
	dg2, err := Push(t.Context(), src, cfg, reg+"/test/pushed:v2", RegistryOptions{}, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	l1, l2 := layerDigest(t, reg+"/test/pushed@"+dg), layerDigest(t, reg+"/test/pushed@"+dg2)
	if l1 != l2 {
		t.Errorf("layer digests %s and %s of one tree", l1, l2)
	}
}

func layerDigest(t *testing.T, ref string) gv1.Hash {
	t.Helper()
	r, _ := name.ParseReference(ref)
	img, err := remote.Image(r)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	return m.Layers[0].Digest
}

// FuzzUnpackLayers: two layers of arbitrary bytes, applied one over the
// other (whiteouts, opaque directories, replaced directories), never
// write outside the destination, and fail only as invalid_argument.
func FuzzUnpackLayers(f *testing.F) {
	seed := func(ents ...ent) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, e := range ents {
			h := e.h
			h.Size = int64(len(e.body))
			tw.WriteHeader(&h)
			tw.Write([]byte(e.body))
		}
		tw.Close()
		return buf.Bytes()
	}
	f.Add(seed(dir("a/", 0o755), file("a/f", 0o644, "x"), symlink("l", "a")),
		seed(whiteout("a/.wh.f"), whiteout("l/.wh..wh..opq"), file("a", 0o644, "file now")))
	f.Add(seed(dir("d/", 0o555), file("d/x", 0o644, "x"), hardlink("h", "d/x")),
		seed(whiteout("d/.wh..wh..opq"), hardlink("d/y", "h"), whiteout(".wh...")))
	f.Fuzz(func(t *testing.T, l1, l2 []byte) {
		parent := t.TempDir()
		dst, outside := filepath.Join(parent, "dst"), filepath.Join(parent, "outside")
		for _, d := range []string{dst, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		var layers []gv1.Layer
		for _, b := range [][]byte{l1, l2} {
			l, err := ggtar.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
			if err != nil {
				t.Skip(err)
			}
			layers = append(layers, l)
		}
		img, err := mutate.AppendLayers(empty.Image, layers...)
		if err != nil {
			t.Skip(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		_, err = (&Image{img: img, bound: true}).Unpack(ctx, dst, nil)
		if err != nil && ctx.Err() == nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			var errno syscall.Errno
			if !errors.As(err, &errno) {
				t.Fatalf("refused as %v, not invalid_argument", err)
			}
		}
		if names := dirNames(t, outside); len(names) != 0 {
			t.Fatalf("written outside the destination: %v", names)
		}
		if names := dirNames(t, parent); !slices.Equal(names, []string{"dst", "outside"}) {
			t.Fatalf("written next to the destination: %v", names)
		}
		filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
}

// A directory whited out and made again as something else: its recorded
// mode is not applied to what took its place.
func TestUnpackDirectoryReplacedLater(t *testing.T) {
	img := imageOf(t, gv1.Config{},
		layerOf(t, dir("x/", 0o555), file("x/f", 0o644, "f"), dir("y/", 0o700), dir("y/sub/", 0o500)),
		layerOf(t, whiteout(".wh.x"), symlink("x", "y"), whiteout("y/.wh.sub"), file("y/sub", 0o644, "now a file")),
	)
	dst, _ := sandbox(t)
	if _, err := (&Image{img: img, bound: true}).Unpack(t.Context(), dst, nil); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "x")); err != nil || target != "y" {
		t.Errorf("x: %q %v, want a symlink to y", target, err)
	}
	if st := lstat(t, filepath.Join(dst, "y/sub")); st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o7777 != 0o644 {
		t.Errorf("y/sub: mode %o, want a regular file 644", st.Mode)
	}
}
