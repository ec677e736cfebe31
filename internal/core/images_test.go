package core

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	gv1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	ggtar "github.com/google/go-containerregistry/pkg/v1/tarball"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/meta"
)

// startRegistry serves a registry in memory on loopback.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// execOutput runs req and returns its stdout and exit code.
func execOutput(t *testing.T, m *Manager, sb string, req v1.ExecRequest) (string, int) {
	t.Helper()
	_, c, err := m.Exec(context.Background(), sb, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Args, err)
	}
	defer c.Close()
	var out bytes.Buffer
	for {
		typ, payload, err := v1.ReadFrame(c)
		if err != nil {
			t.Fatalf("exec %q: %v", req.Args, err)
		}
		switch typ {
		case v1.FrameStdout:
			out.Write(payload)
		case v1.FrameExit:
			var st v1.ExitStatus
			_ = json.Unmarshal(payload, &st)
			return out.String(), st.ExitCode
		case v1.FrameError:
			t.Fatalf("exec %q: %s", req.Args, payload)
		}
	}
}

// layerOf makes a layer of tar entries, each a header and its contents.
func layerOf(t *testing.T, ents ...tar.Header) gv1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range ents {
		body := h.Linkname // a regular file's contents ride in Linkname here
		if h.Typeflag == tar.TypeReg {
			h.Linkname, h.Size = "", int64(len(body))
		}
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := ggtar.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestOCIImages: the test image pushed to a registry, an image made over
// it (a whiteout, a layer of its own, a config) pulled back; a sandbox
// of it runs with the config's env, working dir, user and default
// command; a commit of the sandbox pushed and pulled again is the same
// tree.
func TestOCIImages(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	reg := startRegistry(t)
	var plog bytes.Buffer
	if _, err := m.PushImage(ctx, testImage, v1.ImagePushRequest{Ref: reg + "/molt/base:1"}, &plog); err != nil {
		t.Fatal(err)
	}
	base, err := remote.Image(mustRef(t, reg+"/molt/base:1"))
	if err != nil {
		t.Fatal(err)
	}
	app, err := mutate.AppendLayers(base, layerOf(t,
		tar.Header{Typeflag: tar.TypeReg, Name: "etc/.wh.motd", Mode: 0o644},
		tar.Header{Typeflag: tar.TypeDir, Name: "srv/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "srv/hello", Mode: 0o644, Linkname: "hello\n"},
	))
	if err != nil {
		t.Fatal(err)
	}
	app, err = mutate.Config(app, gv1.Config{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello", "FROMIMAGE=yes"},
		WorkingDir: "/srv", User: "nobody:nogroup",
		Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{`echo "$GREETING from $(pwd) as $(id -un):$(id -gn)"`},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustRef(t, reg+"/molt/app:1"), app); err != nil {
		t.Fatal(err)
	}

	var log bytes.Buffer
	img, err := m.PullImage(ctx, v1.ImagePullRequest{Name: "app", Ref: reg + "/molt/app:1"}, &log)
	if err != nil {
		t.Fatal(err)
	}
	if img.Config == nil || img.Config.WorkingDir != "/srv" || img.Config.User != "nobody:nogroup" || len(img.Config.Cmd) != 1 ||
		!strings.HasPrefix(img.Digest, "sha256:") || !strings.Contains(log.String(), "layer 2/2") {
		t.Fatalf("pulled %+v (config %+v), log %q", img, img.Config, log.String())
	}
	if _, err := os.Lstat(filepath.Join(m.imageDir("app"), "etc/motd")); !os.IsNotExist(err) {
		t.Errorf("etc/motd survived its whiteout: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(m.imageDir(testImage), "etc/motd")); err != nil {
		t.Fatalf("the test image has no etc/motd to white out: %v", err)
	}

	sb, err := m.Create(ctx, v1.SandboxCreateRequest{Image: "app", Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  v1.ExecRequest
		want string
	}{
		{v1.ExecRequest{}, "hi from /srv as nobody:nogroup\n"},
		{v1.ExecRequest{Args: []string{"/bin/sh", "-c", `echo "$FROMIMAGE $(pwd) $(id -u)"`}}, "yes /srv 65534\n"},
		{v1.ExecRequest{Args: []string{"pwd"}, Cwd: "/", User: "root"}, "/\n"},
	} {
		if out, code := execOutput(t, m, sb.ID, c.req); out != c.want || code != 0 {
			t.Errorf("exec %q: %q (exit %d), want %q", c.req.Args, out, code, c.want)
		}
	}

	// An image without a config has no default command.
	plain := newSandbox(t, m)
	if _, _, err := m.Exec(ctx, plain.ID, v1.ExecRequest{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("exec without a command in a sandbox of an image without one: %v, want invalid_argument", err)
	}

	// Commit, push, pull: the pulled tree is the committed one.
	if out, code := execOutput(t, m, sb.ID, v1.ExecRequest{User: "root", Args: []string{"/bin/sh", "-c", "echo new > /srv/new && ln -s new /srv/link && rm /srv/hello"}}); code != 0 {
		t.Fatalf("write: %q %d", out, code)
	}
	committed, err := m.CommitSandbox(ctx, sb.ID, v1.CommitRequest{Name: "app2"})
	if err != nil {
		t.Fatal(err)
	}
	if committed.Parent != "app" || committed.Config == nil || committed.Config.User != "nobody:nogroup" {
		t.Errorf("committed %+v", committed)
	}
	if b, err := os.ReadFile(filepath.Join(m.imageDir("app2"), "srv/new")); err != nil || string(b) != "new\n" {
		t.Errorf("committed srv/new: %q %v", b, err)
	}
	log.Reset()
	pushed, err := m.PushImage(ctx, "app2", v1.ImagePushRequest{Ref: reg + "/molt/app:2"}, &log)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := m.PullImage(ctx, v1.ImagePullRequest{Name: "app3", Ref: reg + "/molt/app@" + pushed.Digest}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pulled.Config == nil || !slices.Equal(pulled.Config.Cmd, committed.Config.Cmd) || pulled.Config.User != "nobody:nogroup" {
		t.Errorf("pulled config %+v, want %+v", pulled.Config, committed.Config)
	}
	a, b := treeOf(t, m.imageDir("app2")), treeOf(t, m.imageDir("app3"))
	for p, d := range a {
		if strings.HasPrefix(d, "device") {
			delete(a, p) // left out by the push
			if !strings.Contains(log.String(), "left out device node /"+p) {
				t.Errorf("device node %s left out silently", p)
			}
		}
	}
	for p, d := range a {
		if b[p] != d {
			t.Errorf("%s: pulled %q, committed %q", p, b[p], d)
		}
	}
	for p := range b {
		if _, ok := a[p]; !ok {
			t.Errorf("%s: pulled, not committed", p)
		}
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// treeOf describes every entry of the tree at root: type, mode, owner,
// mtime, and a regular file's hash or a symlink's target.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := ""
		switch fi.Mode().Type() {
		case fs.ModeDevice, fs.ModeDevice | fs.ModeCharDevice:
			out[rel] = "device"
			return nil
		case fs.ModeSymlink:
			target, _ := os.Readlink(p)
			desc = "-> " + target
		case 0:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h := sha256.Sum256(b)
			desc = hex.EncodeToString(h[:8])
		}
		out[rel] = fmt.Sprintf("%v %d:%d %d %s", fi.Mode(), st.Uid, st.Gid, st.Mtim.Nano(), desc)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImportOCIArchives: import finds a docker-save archive and an OCI
// layout by their contents and records the image's config.
func TestImportOCIArchives(t *testing.T) {
	m := openManager(t)
	ctx := context.Background()
	img, err := mutate.Config(empty.Image, gv1.Config{Env: []string{"A=1"}, Cmd: []string{"true"}, WorkingDir: "/w"})
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layerOf(t, tar.Header{Typeflag: tar.TypeReg, Name: "w/f", Mode: 0o644, Linkname: "x"})); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	docker := filepath.Join(dir, "docker.tar")
	tag, _ := name.NewTag("molt/x:1")
	if err := ggtar.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err == nil {
		err = lp.AppendImage(img)
	}
	if err != nil {
		t.Fatal(err)
	}
	for n, p := range map[string]string{"from-docker": docker, "from-layout": filepath.Join(dir, "layout")} {
		got, err := m.ImportImage(ctx, v1.ImageImportRequest{Name: n, Path: p}, nil)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if got.Config == nil || got.Config.WorkingDir != "/w" || !slices.Equal(got.Config.Env, []string{"A=1"}) {
			t.Errorf("%s: config %+v", n, got.Config)
		}
		if b, err := os.ReadFile(filepath.Join(m.imageDir(n), "w/f")); err != nil || string(b) != "x" {
			t.Errorf("%s: w/f %q %v", n, b, err)
		}
		var rec meta.Image
		if err := m.db.Get(meta.Images, n, &rec); err != nil || rec.Config == nil {
			t.Errorf("%s: record %+v %v", n, rec, err)
		}
	}
}
