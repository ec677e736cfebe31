package image

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// BuildOptions say which Debian tree Build makes. The zero value builds
// bookworm from deb.debian.org with the default packages.
type BuildOptions struct {
	Suite    string    // default "bookworm"
	Packages []string  // extra packages on top of the defaults
	Mirror   string    // default "http://deb.debian.org/debian"
	CacheDir string    // default "/var/cache/molt"; holds built trees as tar files keyed by options
	Log      io.Writer // debootstrap output and progress lines; may be nil
}

// cacheFormat versions the cache: change it when Build starts producing
// different trees for the same options.
const cacheFormat = "molt-image-debootstrap-v1"

var defaultPackages = []string{"bash", "coreutils", "procps", "python3", "ca-certificates"}

var (
	suiteRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
	packageRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`) // Debian policy 5.6.1
)

func (o BuildOptions) withDefaults() BuildOptions {
	if o.Suite == "" {
		o.Suite = "bookworm"
	}
	if o.Mirror == "" {
		o.Mirror = "http://deb.debian.org/debian"
	}
	if o.CacheDir == "" {
		o.CacheDir = "/var/cache/molt"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// packages returns the defaults and o.Packages, sorted, without duplicates.
func (o BuildOptions) packages() []string {
	p := slices.Concat(defaultPackages, o.Packages)
	slices.Sort(p)
	return slices.Compact(p)
}

func (o BuildOptions) validate() error {
	if !suiteRE.MatchString(o.Suite) {
		return fmt.Errorf("image build: bad suite %q: %w", o.Suite, errdefs.ErrInvalidArgument)
	}
	for _, p := range o.Packages {
		if !packageRE.MatchString(p) {
			return fmt.Errorf("image build: bad package name %q: %w", p, errdefs.ErrInvalidArgument)
		}
	}
	u, err := url.Parse(o.Mirror)
	if err != nil || !(u.Scheme == "file" || (u.Scheme == "http" || u.Scheme == "https") && u.Host != "") {
		return fmt.Errorf("image build: bad mirror %q (want an http, https or file URL): %w", o.Mirror, errdefs.ErrInvalidArgument)
	}
	if _, ok := debianArch[runtime.GOARCH]; !ok {
		return fmt.Errorf("image build: no Debian architecture for %s: %w", runtime.GOARCH, errdefs.ErrNotSupported)
	}
	return nil
}

var debianArch = map[string]string{
	"amd64": "amd64", "arm64": "arm64", "386": "i386", "arm": "armhf",
	"ppc64le": "ppc64el", "riscv64": "riscv64", "s390x": "s390x",
}

// CacheKey returns the cache key for opts: the hex SHA-256 of the suite,
// the sorted packages (defaults included), the mirror, the architecture
// and the cache format version, defaults applied first.
func CacheKey(opts BuildOptions) string {
	o := opts.withDefaults()
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00suite=%s\x00packages=%s\x00mirror=%s\x00arch=%s\x00",
		cacheFormat, o.Suite, strings.Join(o.packages(), ","), o.Mirror, debianArch[runtime.GOARCH])
	return hex.EncodeToString(h.Sum(nil))
}

// Build makes a Debian tree in dst (an existing empty directory) with
// debootstrap --variant=minbase and the default packages (bash, coreutils,
// procps, python3, ca-certificates) plus opts.Packages, or imports it from
// the cache in opts.CacheDir, which it fills on a miss.
func Build(ctx context.Context, opts BuildOptions, dst string) error {
	o := opts.withDefaults()
	if err := o.validate(); err != nil {
		return err
	}
	cached := filepath.Join(o.CacheDir, "debootstrap", CacheKey(o)+".tar")
	f, err := os.Open(cached)
	switch {
	case err == nil:
		defer f.Close()
		fmt.Fprintf(o.Log, "image build: importing cached tree %s\n", cached)
		if err := ImportTar(ctx, f, dst); err != nil {
			return fmt.Errorf("image build: from cache %s: %w", cached, err)
		}
		return nil
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("image build: %w", err)
	}
	d, err := openDst("image build", dst)
	if err != nil {
		return err
	}
	d.Close()
	start := time.Now()
	if err := debootstrap(ctx, o, dst); err != nil {
		return err
	}
	if err := tidy(dst); err != nil {
		return err
	}
	fmt.Fprintf(o.Log, "image build: debootstrap done in %s; writing %s\n", time.Since(start).Round(time.Second), cached)
	return writeCache(ctx, dst, cached)
}

func debootstrap(ctx context.Context, o BuildOptions, dst string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("image build: debootstrap needs root: %w", errdefs.ErrNotSupported)
	}
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		// A daemon's PATH may lack the sbin directories.
		if bin, err = exec.LookPath("/usr/sbin/debootstrap"); err != nil {
			return fmt.Errorf("image build: debootstrap is not installed (apt-get install debootstrap): %w", errdefs.ErrNotSupported)
		}
	}
	cmd := exec.CommandContext(ctx, bin, "--variant=minbase",
		"--arch="+debianArch[runtime.GOARCH],
		"--include="+strings.Join(o.packages(), ","),
		o.Suite, dst, o.Mirror)
	tail := &tailWriter{}
	cmd.Stdout = io.MultiWriter(o.Log, tail)
	cmd.Stderr = cmd.Stdout
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	// Mounts debootstrap makes in the target live in its own mount
	// namespace and vanish with it, even when it fails half-way; its own
	// process group lets cancellation reach chroot, dpkg and the rest.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	fmt.Fprintf(o.Log, "image build: %s\n", strings.Join(cmd.Args, " "))
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("image build: debootstrap %s: %w (last output: %s)", o.Suite, err, tail)
	}
	return nil
}

// tidy removes from a fresh debootstrap tree what an image must not or
// need not hold: device nodes (molt provides its own; imports refuse them),
// downloaded packages and apt lists. The directories stay. The root gets
// the owner and mode of a system's /, whatever dst had.
func tidy(dst string) error {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return fmt.Errorf("image build: %w", err)
	}
	defer root.Close()
	if err := root.Chown(".", 0, 0); err != nil {
		return fmt.Errorf("image build: tidy: %w", err)
	}
	if err := root.Chmod(".", 0o755); err != nil {
		return fmt.Errorf("image build: tidy: %w", err)
	}
	for _, c := range []struct {
		dir  string
		drop func(fs.DirEntry) bool
	}{
		{"dev", func(fs.DirEntry) bool { return true }},
		{"var/cache/apt/archives", func(e fs.DirEntry) bool { return !e.IsDir() && strings.HasSuffix(e.Name(), ".deb") }},
		{"var/lib/apt/lists", func(e fs.DirEntry) bool { return !e.IsDir() }},
	} {
		entries, err := fs.ReadDir(root.FS(), c.dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("image build: tidy: %w", err)
		}
		for _, e := range entries {
			if c.drop(e) {
				if err := root.RemoveAll(path.Join(c.dir, e.Name())); err != nil {
					return fmt.Errorf("image build: tidy: %w", err)
				}
			}
		}
	}
	return nil
}

// writeCache writes the tree at src as a tar file to file, atomically: a
// reader sees the whole file or none.
func writeCache(ctx context.Context, src, file string) (err error) {
	const op = "image build: write cache"
	dir := filepath.Dir(file)
	// The cache holds whole root filesystems (/etc/shadow included).
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(file)+"-")
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	bw := bufio.NewWriterSize(tmp, 1<<20)
	tw := tar.NewWriter(bw)
	err = walkTree(ctx, op, src, func(h *tar.Header, r io.Reader) error {
		if err := tw.WriteHeader(h); err != nil {
			return entryError(op, h.Name, err)
		}
		if r != nil {
			if _, err := io.CopyN(tw, r, h.Size); err != nil {
				return entryError(op, h.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("image build: write cache: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("image build: write cache: %w", err)
	}
	return nil
}

// tailWriter keeps the last lines written to it, for error messages.
type tailWriter struct{ buf []byte }

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if n := len(t.buf); n > 4096 {
		t.buf = t.buf[n-2048:]
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	lines = lines[max(0, len(lines)-3):]
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, "; ")
}
