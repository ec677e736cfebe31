package remote

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/image"
	"github.com/molt-sh/molt/internal/objstore"
)

// listing describes a tree as WalkTree sees it, one line per entry:
// its header's fields and its contents' SHA-256.
func listing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := image.WalkTree(context.Background(), "list", dir, func(h *tar.Header, r io.Reader) error {
		sum := ""
		if r != nil {
			s := sha256.New()
			if _, err := io.Copy(s, r); err != nil {
				return err
			}
			sum = hex.EncodeToString(s.Sum(nil))
		}
		out = append(out, fmt.Sprintf("%s %c %o %d:%d %d %s %q %v %s", h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid,
			h.ModTime.Unix(), h.Linkname, h.PAXRecords, h.Size, sum))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func write(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", src+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
}

// baseAndChanged makes a base tree and a copy of it a sandbox changed.
func baseAndChanged(t *testing.T) (base, changed string) {
	base, changed = t.TempDir(), t.TempDir()
	big := make([]byte, 3<<20+100)
	for i := range big {
		big[i] = byte(i * 13)
	}
	for i := range 40 {
		write(t, filepath.Join(base, "usr/lib", fmt.Sprintf("f%02d", i)), bytes.Repeat([]byte{byte(i)}, 5000+i*100))
	}
	write(t, filepath.Join(base, "usr/lib/big"), big)
	write(t, filepath.Join(base, "usr/lib/same-big"), big[:2<<20])
	write(t, filepath.Join(base, "etc/passwd"), []byte("root:x:0:0\n"))
	write(t, filepath.Join(base, "etc/gone"), []byte("to be deleted"))
	write(t, filepath.Join(base, "var/dir/in"), []byte("a directory that becomes a file"))
	write(t, filepath.Join(base, "etc/chmod"), []byte("mode changes"))
	if err := os.Symlink("usr/lib", filepath.Join(base, "lib")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(base, "etc/passwd"), filepath.Join(base, "etc/passwd-link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(base, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	copyTree(t, base, changed)
	// The sandbox's changes: contents, mode, deletions, a directory
	// become a file, one MiB of a big file, new files (one named as a
	// layer's whiteout), a hard link's target changed.
	write(t, filepath.Join(changed, "usr/lib/f03"), []byte("changed"))
	if err := os.Chmod(filepath.Join(changed, "etc/chmod"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"etc/gone", "var/dir"} {
		if err := os.RemoveAll(filepath.Join(changed, p)); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(changed, "var/dir"), []byte("now a file"))
	b2 := slices.Clone(big)
	copy(b2[1<<20:], bytes.Repeat([]byte{1}, 1<<20))
	write(t, filepath.Join(changed, "usr/lib/big"), b2)
	write(t, filepath.Join(changed, "etc/.wh.passwd"), []byte("a file, not a whiteout"))
	write(t, filepath.Join(changed, "home/new"), []byte("new"))
	write(t, filepath.Join(changed, "etc/passwd"), []byte("root:x:0:0\nagent:x:1000:1000\n"))
	return base, changed
}

// TestFetchTreeOver: a tree fetched over a copy of its base is the tree
// uploaded, entry for entry; the base's unchanged files stay and its
// chunks are not fetched; a base whose bytes changed under the index is
// refused by the tree's hash.
func TestFetchTreeOver(t *testing.T) {
	ctx := context.Background()
	_, _, s := dirStore(t)
	base, changed := baseAndChanged(t)
	src := artifact(t, "ck0000000001", randomPages(t, 4), "x")
	src.Tree = changed
	if _, _, err := s.Upload(ctx, src); err != nil {
		t.Fatal(err)
	}
	r, err := s.Recipe(ctx, "ck0000000001")
	if err != nil {
		t.Fatal(err)
	}
	want := listing(t, changed)

	plain := t.TempDir()
	if err := s.FetchTree(ctx, r, plain); err != nil {
		t.Fatal(err)
	}
	if got := listing(t, plain); !slices.Equal(got, want) {
		t.Fatalf("plain fetch:\n%s\nwant\n%s", diffLines(got, want), "")
	}

	dst := t.TempDir()
	copyTree(t, base, dst)
	st, err := s.FetchTreeOver(ctx, r, dst, Base{Dir: base, Key: "base-1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := listing(t, dst); !slices.Equal(got, want) {
		t.Fatalf("fetch over the base differs from the tree uploaded:\n%s", diffLines(got, want))
	}
	t.Logf("%+v of a %d-byte tree", st, r.Tree.Size)
	// Fetched: the changed files (f03, passwd, the big file's changed
	// MiB, the new ones) and the headers of what changed: far less than
	// the tree.
	if st.KeptEntries < 40 || st.Fetched == 0 || st.Fetched > 1<<20+64<<10 || st.FromBase < 2<<20 {
		t.Fatalf("stats %+v: want the 40 small files kept, at most the changed MiB and headers fetched, the big file's other MiBs read from the base", st)
	}
	// The whiteout-named file is a file, and what went is gone.
	if b, err := os.ReadFile(filepath.Join(dst, "etc/passwd")); err != nil || !bytes.Contains(b, []byte("agent")) {
		t.Fatalf("etc/passwd: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "etc/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("etc/gone: %v, want it gone", err)
	}

	// A base file read for its chunks (the big file's unchanged MiBs)
	// that changed since the base was indexed: the tree's hash refuses.
	dst2 := t.TempDir()
	copyTree(t, base, dst2)
	f, err := os.OpenFile(filepath.Join(base, "usr/lib/big"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tampered"), 10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.FetchTreeOver(ctx, r, dst2, Base{Dir: base, Key: "base-1"}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("fetch over a base changed under its index: %v, want a refusal", err)
	}
}

func diffLines(got, want []string) string {
	var b bytes.Buffer
	for _, l := range got {
		if !slices.Contains(want, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	for _, l := range want {
		if !slices.Contains(got, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	return b.String()
}

// stuckBucket never answers a read of a pack.
type stuckBucket struct{ objstore.Bucket }

func (b stuckBucket) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "packs/") && !strings.HasSuffix(key, ".idx") {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return b.Bucket.Get(ctx, key, off, n)
}

// TestFetchStuckStore: a store that stops answering fails a fetch of a
// tree, over a base or not, and of an object, with its deadline, rather
// than holding it.
func TestFetchStuckStore(t *testing.T) {
	ctx := context.Background()
	b, k, s := dirStore(t)
	base, changed := baseAndChanged(t)
	src := artifact(t, "ck0000000001", randomPages(t, 4), "x")
	src.Tree = changed
	if _, _, err := s.Upload(ctx, src); err != nil {
		t.Fatal(err)
	}
	stuck, err := Open(ctx, stuckBucket{b}, k)
	if err != nil {
		t.Fatal(err)
	}
	r, err := stuck.Recipe(ctx, "ck0000000001")
	if err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { pieceTimeout = d }(pieceTimeout)
	pieceTimeout = 100 * time.Millisecond
	if err := stuck.FetchTree(ctx, r, t.TempDir()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("tree from a stuck store: %v", err)
	}
	dst := t.TempDir()
	copyTree(t, base, dst)
	if _, err := stuck.FetchTreeOver(ctx, r, dst, Base{Dir: base, Key: "b"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("tree over a base from a stuck store: %v", err)
	}
	if _, err := stuck.FetchObjects(ctx, r, t.TempDir()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("objects from a stuck store: %v", err)
	}
}
