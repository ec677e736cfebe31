package image

import (
	"archive/tar"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	kgzip "github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// xattrPrefix marks an xattr in tar PAX records, as GNU tar and star write it.
const xattrPrefix = "SCHILY.xattr."

// refusal is the rule an entry breaks; it becomes ErrInvalidArgument.
type refusal string

func (r refusal) Error() string { return string(r) }

// entryError wraps err from handling the entry name during op.
func entryError(op, name string, err error) error {
	var r refusal
	if errors.As(err, &r) {
		return fmt.Errorf("%s: entry %q: %s: %w", op, name, r, errdefs.ErrInvalidArgument)
	}
	if badArchive(err) {
		return fmt.Errorf("%s: entry %q: %w: %w", op, name, err, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("%s: entry %q: %w", op, name, err)
}

// badArchive reports whether err says the archive itself is malformed.
func badArchive(err error) bool {
	var corrupt flate.CorruptInputError
	return errors.As(err, new(malformed)) || errors.Is(err, tar.ErrHeader) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) || errors.As(err, &corrupt) ||
		errors.Is(err, kgzip.ErrHeader) || errors.Is(err, kgzip.ErrChecksum)
}

// cleanName returns name relative to the root ("." for the root itself), or
// the rule it breaks.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", refusal("empty name")
	}
	if strings.HasPrefix(name, "/") {
		return "", refusal("absolute path")
	}
	for c := range strings.SplitSeq(name, "/") {
		if c == ".." {
			return "", refusal("path escapes the root")
		}
	}
	return path.Clean(name), nil
}

// openDst opens dst, which must be an existing empty directory.
func openDst(op, dst string) (*os.File, error) {
	f, err := os.Open(dst)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w: %w", op, err, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	names, err := f.Readdirnames(1)
	switch {
	case err == io.EOF:
		return f, nil
	case errors.Is(err, syscall.ENOTDIR):
		err = fmt.Errorf("%s: destination %s is not a directory: %w", op, dst, errdefs.ErrInvalidArgument)
	case err == nil:
		err = fmt.Errorf("%s: destination %s is not empty (has %q): %w", op, dst, names[0], errdefs.ErrFailedPrecondition)
	default:
		err = fmt.Errorf("%s: %w", op, err)
	}
	f.Close()
	return nil, err
}

// extractor writes entries beneath one destination directory, resolving
// every path with the kernel's help so that nothing outside it is touched.
type extractor struct {
	dst   *os.File
	root  int
	chown bool            // preserve uid/gid; needs CAP_CHOWN
	seen  map[string]byte // entry name -> type, for hard link targets
	dirs  []dirEntry      // modes and times to apply after the contents
	// layer is set while image layers are applied one over the other
	// (layers.go): whiteouts delete, and entries replace what lower
	// layers left.
	layer *layerState
	// deleted maps a name deleted by a layer to len(dirs) then.
	deleted map[string]int
}

type dirEntry struct {
	name string
	h    *tar.Header
}

func newExtractor(dst string) (*extractor, error) {
	f, err := openDst("image import", dst)
	if err != nil {
		return nil, err
	}
	return &extractor{
		dst:   f,
		root:  int(f.Fd()),
		chown: os.Geteuid() == 0,
		seen:  map[string]byte{".": tar.TypeDir},
	}, nil
}

func (x *extractor) close() { x.dst.Close() }

// put writes one entry; r holds the contents of a regular file.
func (x *extractor) put(h *tar.Header, r io.Reader) error {
	if err := x.write(h, r); err != nil {
		return entryError("image import", h.Name, err)
	}
	return nil
}

func (x *extractor) write(h *tar.Header, r io.Reader) error {
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	if x.layer != nil && !x.layer.update {
		if done, err := x.whiteout(name); done || err != nil {
			return err
		}
	}
	kind := h.Typeflag
	switch kind {
	case tar.TypeChar, tar.TypeBlock:
		return refusal("device nodes are not allowed")
	case tar.TypeGNUSparse:
		kind = tar.TypeReg
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	default:
		return refusal(fmt.Sprintf("unsupported entry type %q", h.Typeflag))
	}
	if name == "." {
		if kind != tar.TypeDir {
			return refusal("the root must be a directory")
		}
		x.dirs = append(x.dirs, dirEntry{name, h})
		if x.layer != nil && x.layer.update {
			if err := x.dropXattrs(x.root, h); err != nil {
				return err
			}
		}
		return x.own(x.root, "", x.root, h)
	}
	pfd, err := x.openDir(path.Dir(name))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(name)
	switch kind {
	case tar.TypeDir:
		err = x.mkdir(pfd, base, name, h)
	case tar.TypeLink:
		kind, err = x.link(pfd, base, name, h.Linkname)
	case tar.TypeSymlink:
		err = x.symlink(pfd, base, name, h)
	case tar.TypeFifo:
		err = x.mkfifo(pfd, base, name, h)
	default:
		err = x.create(pfd, base, name, h, r)
	}
	if err == nil && kind != tar.TypeDir && h.Typeflag != tar.TypeLink {
		err = setTimes(pfd, base, h, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return err
	}
	x.seen[name] = kind
	x.written(name)
	return nil
}

// finish applies directory modes and times, children before parents and
// the last entry for a directory winning.
func (x *extractor) finish() error {
	done := make(map[string]bool, len(x.dirs))
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		if done[d.name] || x.deletedSince(d.name, i) {
			continue
		}
		done[d.name] = true
		if err := x.finishDir(d); err != nil {
			return entryError("image import", d.h.Name, err)
		}
	}
	return nil
}

func (x *extractor) finishDir(d dirEntry) error {
	fd, err := openBeneath(x.root, d.name)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchmodat(fd, ".", mode(d.h), 0); err != nil {
		return os.NewSyscallError("fchmodat", err)
	}
	return setTimes(fd, ".", d.h, 0)
}

// openDir returns an O_PATH descriptor of the directory dir, creating it
// and its missing parents (mode 0755) as needed.
func (x *extractor) openDir(dir string) (int, error) {
	fd, err := openBeneath(x.root, dir)
	if !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	fd, err = unix.Dup(x.root)
	if err != nil {
		return -1, os.NewSyscallError("dup", err)
	}
	for c := range strings.SplitSeq(dir, "/") {
		next, err := openBeneath(fd, c)
		if errors.Is(err, unix.ENOENT) {
			// Exactly 0755, whatever the umask.
			if err = unix.Mkdirat(fd, c, 0o755); err == nil {
				err = unix.Fchmodat(fd, c, 0o755, 0)
			}
			if err == nil || errors.Is(err, unix.EEXIST) {
				next, err = openBeneath(fd, c)
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// openBeneath opens the directory p below dirfd without following any
// symlink or leaving dirfd, enforced by the kernel.
func openBeneath(dirfd int, p string) (int, error) {
	fd, err := unix.Openat2(dirfd, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ELOOP):
		return -1, refusal(fmt.Sprintf("parent %q goes through a symlink", p))
	case errors.Is(err, unix.ENOTDIR):
		return -1, refusal(fmt.Sprintf("parent %q is not a directory", p))
	case errors.Is(err, unix.EXDEV):
		return -1, refusal(fmt.Sprintf("parent %q escapes the root", p))
	case errors.Is(err, unix.ENOSYS):
		return -1, fmt.Errorf("openat2 is missing (Linux 5.6 or later needed): %w", errdefs.ErrNotSupported)
	}
	return -1, os.NewSyscallError("openat2", err)
}

// replaceable removes a non-directory at base, so the entry can be created
// with O_EXCL semantics; a directory stays and refuses the entry, unless
// a lower layer left it (then it goes, with what it holds).
func (x *extractor) replaceable(pfd int, base, name string) error {
	err := unix.Unlinkat(pfd, base, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EISDIR) && x.layer != nil && x.seen[name] == 0:
		x.forget(name)
		return removeAt(pfd, base)
	case errors.Is(err, unix.EISDIR):
		return refusal("would replace a directory")
	}
	return os.NewSyscallError("unlinkat", err)
}

func (x *extractor) mkdir(pfd int, base, name string, h *tar.Header) error {
	err := unix.Mkdirat(pfd, base, 0o700)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		err = unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err = unix.Unlinkat(pfd, base, 0); err == nil {
				err = unix.Mkdirat(pfd, base, 0o700)
			}
		}
	}
	if err != nil {
		return os.NewSyscallError("mkdirat", err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	defer unix.Close(fd)
	x.dirs = append(x.dirs, dirEntry{name, h})
	if x.layer != nil && x.layer.update {
		if err := x.dropXattrs(fd, h); err != nil {
			return err
		}
	}
	return x.own(fd, "", fd, h)
}

func (x *extractor) create(pfd int, base, name string, h *tar.Header, r io.Reader) error {
	if err := x.replaceable(pfd, base, name); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if sparse(h) {
		err = copySparse(f, r)
	} else {
		_, err = io.Copy(f, r)
	}
	if err != nil {
		return err
	}
	if err := x.own(fd, "", fd, h); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode(h)); err != nil {
		return os.NewSyscallError("fchmod", err)
	}
	return f.Close()
}

// sparse reports whether h is a sparse file (old GNU or PAX format): its
// holes read as zeros, and a few bytes of archive can declare terabytes.
func sparse(h *tar.Header) bool {
	if h.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

var zeroBlock [4096]byte

// copySparse copies a sparse file's contents to f leaving every block of
// zeros a hole, so that what it takes on disk follows the archive's data
// and not the size the entry declares.
func copySparse(f *os.File, r io.Reader) error {
	buf := make([]byte, 256<<10)
	var off int64
	for {
		n, rerr := r.Read(buf)
		chunk := buf[:n]
		for i := 0; i < n; {
			j := min(i+len(zeroBlock), n)
			if bytes.Equal(chunk[i:j], zeroBlock[:j-i]) {
				i = j
				continue
			}
			for j < n { // coalesce the data blocks that follow
				k := min(j+len(zeroBlock), n)
				if bytes.Equal(chunk[j:k], zeroBlock[:k-j]) {
					break
				}
				j = k
			}
			if _, err := f.WriteAt(chunk[i:j], off+int64(i)); err != nil {
				return err
			}
			i = j
		}
		off += int64(n)
		if rerr == io.EOF {
			return f.Truncate(off)
		}
		if rerr != nil {
			return rerr
		}
	}
}

func (x *extractor) mkfifo(pfd int, base, name string, h *tar.Header) error {
	if err := x.replaceable(pfd, base, name); err != nil {
		return err
	}
	if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
		return os.NewSyscallError("mknodat", err)
	}
	// A non-blocking read-only open of a FIFO neither blocks nor has effects.
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	defer unix.Close(fd)
	if err := x.own(fd, "", fd, h); err != nil {
		return err
	}
	return os.NewSyscallError("fchmod", unix.Fchmod(fd, mode(h)))
}

func (x *extractor) symlink(pfd int, base, name string, h *tar.Header) error {
	t := h.Linkname
	if t == "" {
		return refusal("empty symlink target")
	}
	if !path.IsAbs(t) {
		if j := path.Join(path.Dir(name), t); j == ".." || strings.HasPrefix(j, "../") {
			return refusal(fmt.Sprintf("symlink target %q escapes the root", t))
		}
	}
	if err := x.replaceable(pfd, base, name); err != nil {
		return err
	}
	if err := unix.Symlinkat(t, pfd, base); err != nil {
		return os.NewSyscallError("symlinkat", err)
	}
	return x.own(-1, base, pfd, h)
}

// link makes name a hard link to the earlier entry target and returns that
// entry's type.
func (x *extractor) link(pfd int, base, name, target string) (byte, error) {
	t, err := cleanName(target)
	if err != nil {
		return 0, refusal(fmt.Sprintf("hard link target %q: %s", target, err))
	}
	kind, ok := x.seen[t]
	if !ok && x.layer != nil && !x.layer.update {
		kind, ok = x.lower(t)
	}
	switch {
	case !ok:
		return 0, refusal(fmt.Sprintf("hard link target %q does not name an earlier entry", target))
	case kind == tar.TypeDir:
		return 0, refusal(fmt.Sprintf("hard link target %q is a directory", target))
	case t == name:
		return 0, refusal("hard link to itself")
	}
	tfd, err := openBeneath(x.root, path.Dir(t))
	if err != nil {
		return 0, err
	}
	defer unix.Close(tfd)
	if err := x.replaceable(pfd, base, name); err != nil {
		return 0, err
	}
	// Without AT_SYMLINK_FOLLOW, linkat links a symlink itself.
	return kind, os.NewSyscallError("linkat", unix.Linkat(tfd, path.Base(t), pfd, base, 0))
}

// own sets the owner and xattrs of an entry: through fd if it is open
// (fd >= 0), else of base in the directory pfd without following it.
func (x *extractor) own(fd int, base string, pfd int, h *tar.Header) error {
	if x.chown {
		var err error
		if fd >= 0 {
			err = unix.Fchown(fd, h.Uid, h.Gid)
		} else {
			err = unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		if err != nil {
			return os.NewSyscallError("chown", err)
		}
	}
	for k, v := range h.PAXRecords {
		attr, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok {
			continue
		}
		var err error
		if fd >= 0 {
			err = unix.Fsetxattr(fd, attr, []byte(v), 0)
		} else {
			// Symlinks cannot be opened for fsetxattr; name one through
			// the parent's descriptor, without following the last part.
			err = unix.Lsetxattr(fmt.Sprintf("/proc/self/fd/%d/%s", pfd, base), attr, []byte(v), 0)
		}
		if err != nil {
			return fmt.Errorf("set xattr %s: %w", attr, err)
		}
	}
	return nil
}

func mode(h *tar.Header) uint32 { return uint32(h.Mode) & 0o7777 }

func setTimes(dirfd int, p string, h *tar.Header, flags int) error {
	atime := h.AccessTime
	if atime.IsZero() {
		atime = h.ModTime
	}
	a, err := unix.TimeToTimespec(atime)
	if err != nil {
		return err
	}
	m, err := unix.TimeToTimespec(h.ModTime)
	if err != nil {
		return err
	}
	return os.NewSyscallError("utimensat", unix.UtimesNanoAt(dirfd, p, []unix.Timespec{a, m}, flags))
}
