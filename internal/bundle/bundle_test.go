package bundle

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/ckstore"
	"github.com/molt-sh/molt/internal/errdefs"
)

// fixture is a checkpoint to bundle: a tree, two images, a manifest,
// and the exporting host's keyring.
type fixture struct {
	src  Source
	keys *ckstore.Keyring
	pub  string // the exporting host's host.pub
}

func newFixture(t testing.TB, imageBytes int) fixture {
	t.Helper()
	dir := t.TempDir()
	fs := filepath.Join(dir, "fs")
	images := filepath.Join(dir, "images")
	for _, d := range []string{filepath.Join(fs, "etc"), filepath.Join(fs, "tmp"), images} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p string, b []byte) {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(fs, "etc", "hostname"), []byte("box\n"))
	write(filepath.Join(fs, "tmp", "data"), bytes.Repeat([]byte("molt"), 4096))
	if err := os.Symlink("/etc/hostname", filepath.Join(fs, "tmp", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(fs, "tmp", "data"), filepath.Join(fs, "tmp", "data2")); err != nil {
		t.Fatal(err)
	}
	var objs []ckstore.Object
	for i, name := range []string{"core-1.img", "pages-1.img"} {
		b := bytes.Repeat([]byte{byte(i + 1)}, 100+i*imageBytes)
		write(filepath.Join(images, name), b)
		s := sha256.Sum256(b)
		objs = append(objs, ckstore.Object{Path: "images/" + name, Size: int64(len(b)), SHA256: hex.EncodeToString(s[:])})
	}
	k, err := ckstore.LoadKeyring(filepath.Join(dir, "keys"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mf := ckstore.Manifest{Format: ckstore.Format, ID: "ck1", Sandbox: "sb1", Parent: "ck0", ParentDigest: strings.Repeat("a", 64),
		Kind: v1.KindFull, Image: "bookworm", CRIU: "4.2.1", Created: time.Now().UTC(), Objects: objs}
	return fixture{
		src: Source{Header: Header{Checkpoint: "ck1", Kind: v1.KindFull, CRIU: "4.2.1", Host: LocalHost(), Image: Image{Name: "bookworm"}},
			Manifest: mf, Images: images, FS: fs},
		keys: k, pub: filepath.Join(dir, "keys", "host.pub"),
	}
}

// importer is another host's keyring, trusting the fixture's host
// unless untrusted.
func (f fixture) importer(t testing.TB, trusted bool) *ckstore.Keyring {
	t.Helper()
	var extra []string
	if trusted {
		extra = []string{f.pub}
	}
	k, err := ckstore.LoadKeyring(t.TempDir(), extra)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (f fixture) bundle(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := Write(context.Background(), &buf, f.keys, f.src); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// read reads b into fresh directories.
func read(t testing.TB, b []byte, k *ckstore.Keyring) (Bundle, string, string, error) {
	t.Helper()
	dir := t.TempDir()
	images, fs := filepath.Join(dir, "images"), filepath.Join(dir, "fs")
	for _, d := range []string{images, fs} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	bd, err := Read(context.Background(), bytes.NewReader(b), images, fs, Options{Keys: k})
	return bd, images, fs, err
}

func TestRoundTrip(t *testing.T) {
	f := newFixture(t, 1<<16)
	bd, images, fs, err := read(t, f.bundle(t), f.importer(t, true))
	if err != nil {
		t.Fatal(err)
	}
	if bd.Manifest.ID != "ck1" || bd.Manifest.Parent != "" || bd.Signer != f.keys.KeyID() || bd.Stats.Objects != 2 {
		t.Fatalf("bundle: %+v", bd)
	}
	for _, o := range f.src.Manifest.Objects {
		want, _ := os.ReadFile(filepath.Join(f.src.Images, filepath.Base(o.Path)))
		got, err := os.ReadFile(filepath.Join(images, filepath.Base(o.Path)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %v", o.Path, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(fs, "etc", "hostname")); string(b) != "box\n" {
		t.Fatalf("hostname: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(fs, "tmp", "link")); l != "/etc/hostname" {
		t.Fatalf("link: %q", l)
	}
	a, _ := os.Stat(filepath.Join(fs, "tmp", "data"))
	b, _ := os.Stat(filepath.Join(fs, "tmp", "data2"))
	if a == nil || !os.SameFile(a, b) {
		t.Fatal("hard link not kept")
	}
}

// entry is one entry of a tar stream.
type entry struct {
	h    *tar.Header
	body []byte
}

func entriesOf(t testing.TB, b []byte) []entry {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []entry
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		out = append(out, entry{h, body})
	}
}

func tarOf(t testing.TB, es []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		e.h.Size = int64(len(e.body))
		if err := tw.WriteHeader(e.h); err != nil {
			t.Fatal(err)
		}
		tw.Write(e.body)
	}
	tw.Close()
	return buf.Bytes()
}

func TestRefusals(t *testing.T) {
	f := newFixture(t, 1<<16)
	good := f.bundle(t)
	trusted := f.importer(t, true)
	es := entriesOf(t, good)
	edit := func(fn func([]entry) []entry) []byte {
		c := make([]entry, len(es))
		for i, e := range es {
			h := *e.h
			c[i] = entry{&h, bytes.Clone(e.body)}
		}
		return tarOf(t, fn(c))
	}
	objAt := func(es []entry, name string) int {
		for i, e := range es {
			if e.h.Name == name {
				return i
			}
		}
		t.Fatalf("no entry %s", name)
		return -1
	}
	cases := []struct {
		name string
		b    []byte
		k    *ckstore.Keyring
		want string
		kind error
	}{
		{"flipped byte in an object", edit(func(es []entry) []entry {
			es[objAt(es, "objects/images/pages-1.img")].body[1000] ^= 1
			return es
		}), trusted, "images/pages-1.img failed verification", errdefs.ErrInvalidArgument},
		{"flipped byte in a file", edit(func(es []entry) []entry {
			es[objAt(es, "fs/etc/hostname")].body[0] ^= 1
			return es
		}), trusted, "file tree failed verification", errdefs.ErrInvalidArgument},
		{"truncated in an object", good[:len(good)/3], trusted, "truncated", errdefs.ErrInvalidArgument},
		{"truncated before the seal", good[:bytes.Index(good, []byte(sealName))-512], trusted, "truncated", errdefs.ErrInvalidArgument},
		{"truncated end marker", good[:len(good)-1024-512], trusted, "", nil},
		{"wrong format version", edit(func(es []entry) []entry {
			es[0].body = bytes.Replace(es[0].body, []byte(`"format": 1`), []byte(`"format": 99`), 1)
			return es
		}), trusted, "format version 99, this molt reads version 1", errdefs.ErrNotSupported},
		{"untrusted signer", good, f.importer(t, false), "untrusted key " + f.keys.KeyID(), errdefs.ErrFailedPrecondition},
		{"path traversal", edit(func(es []entry) []entry {
			i := objAt(es, "fs/etc/")
			evil := entry{&tar.Header{Name: "fs/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX}, []byte("x")}
			return append(es[:i:i], append([]entry{evil}, es[i:]...)...)
		}), trusted, "path escapes the root", errdefs.ErrInvalidArgument},
		{"object named outside images", edit(func(es []entry) []entry {
			es[objAt(es, "objects/images/core-1.img")].h.Name = "objects/../core-1.img"
			return es
		}), trusted, "where object images/core-1.img belongs", errdefs.ErrInvalidArgument},
		{"oversized header", edit(func(es []entry) []entry {
			es[0].body = append(es[0].body, bytes.Repeat([]byte(" "), maxHeader)...)
			return es
		}), trusted, "at most 65536 allowed", errdefs.ErrInvalidArgument},
		{"not a bundle", tarOf(t, []entry{{&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("x")}}), trusted, "not a molt checkpoint bundle", errdefs.ErrInvalidArgument},
		{"edited header", edit(func(es []entry) []entry {
			var h Header
			json.Unmarshal(es[0].body, &h)
			h.Image.Name = "other"
			es[0].body, _ = json.Marshal(h)
			return es
		}), trusted, "header was changed", errdefs.ErrInvalidArgument},
		{"data after the seal", edit(func(es []entry) []entry {
			return append(es, entry{&tar.Header{Name: "extra", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("x")})
		}), trusted, "data after the seal", errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			_, _, _, err := read(t, c.b, c.k)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) || (c.kind != nil && !errors.Is(err, c.kind)) {
				t.Fatalf("error %q; want %q (%v)", err, c.want, c.kind)
			}
			if _, err := os.Lstat(filepath.Join(dir, "..", "escaped")); err == nil {
				t.Fatal("wrote outside its directory")
			}
		})
	}
}

func TestAcceptRefuses(t *testing.T) {
	f := newFixture(t, 0)
	dir := t.TempDir()
	_, err := Read(context.Background(), bytes.NewReader(f.bundle(t)), dir, dir, Options{Keys: f.importer(t, true), Accept: func(h Header) error {
		if miss := MissingCPUFlags(append(h.Host.CPUFlags, "avx1024"), LocalHost().CPUFlags); len(miss) > 0 {
			return errors.New("CPU lacks " + strings.Join(miss, " "))
		}
		return nil
	}})
	if err == nil || !strings.Contains(err.Error(), "CPU lacks avx1024") {
		t.Fatalf("err %v", err)
	}
	if e, _ := os.ReadDir(dir); len(e) != 0 {
		t.Fatalf("wrote %v before the header was accepted", e)
	}
}
