package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// xattrMax is the kernel's limit on both an xattr name list and a value
// (XATTR_LIST_MAX, XATTR_SIZE_MAX), so one buffer each always suffices.
const xattrMax = 64 << 10

// walker turns a directory tree into tar headers: the root as "./", then
// every entry below it, parents before children, in lexical order. It
// reads through directory descriptors without following symlinks, and
// reports a file already seen by inode as a hard link to its first name.
type walker struct {
	ctx   context.Context
	op    string
	fn    func(h *tar.Header, r io.Reader) error
	links map[[2]uint64]string
	list  []byte
	value []byte
}

// walkTree calls fn for each entry of the tree at src, with the contents
// of regular files as r.
func walkTree(ctx context.Context, op, src string, fn func(h *tar.Header, r io.Reader) error) error {
	d, err := os.OpenFile(src, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	w := &walker{
		ctx:   ctx,
		op:    op,
		fn:    fn,
		links: map[[2]uint64]string{},
		list:  make([]byte, xattrMax),
		value: make([]byte, xattrMax),
	}
	return w.dir(d, ".")
}

// dir reports the open directory d, named name, and what it contains;
// it closes d.
func (w *walker) dir(d *os.File, name string) error {
	defer d.Close()
	fd := int(d.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return entryError(w.op, name, os.NewSyscallError("fstat", err))
	}
	h, err := w.header(fd, "", name+"/", &st)
	if err != nil {
		return entryError(w.op, name, err)
	}
	if err := w.fn(h, nil); err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return entryError(w.op, name, err)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := w.ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", w.op, err)
		}
		if err := w.entry(fd, n, path.Join(name, n)); err != nil {
			return err
		}
	}
	return nil
}

// entry reports n, named name, in the directory pfd.
func (w *walker) entry(pfd int, n, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return entryError(w.op, name, os.NewSyscallError("fstatat", err))
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		id := [2]uint64{st.Dev, st.Ino}
		if first, ok := w.links[id]; ok {
			return w.fn(&tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: first, Format: tar.FormatPAX}, nil)
		}
		w.links[id] = name
	}
	var h *tar.Header
	var err error
	switch typ {
	case unix.S_IFDIR:
		fd, err := unix.Openat(pfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return entryError(w.op, name, os.NewSyscallError("openat", err))
		}
		return w.dir(os.NewFile(uintptr(fd), name), name)
	case unix.S_IFREG:
		// Only regular files are opened (opening a device can have
		// effects); O_NONBLOCK keeps a FIFO swapped in meanwhile from
		// blocking, and the descriptor's own stat is what gets recorded.
		fd, err := unix.Openat(pfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return entryError(w.op, name, os.NewSyscallError("openat", err))
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		if err := unix.Fstat(fd, &st); err != nil {
			return entryError(w.op, name, os.NewSyscallError("fstat", err))
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return entryError(w.op, name, errors.New("changed type while being read"))
		}
		if h, err = w.header(fd, "", name, &st); err != nil {
			return entryError(w.op, name, err)
		}
		return w.fn(h, f)
	}
	if h, err = w.header(pfd, n, name, &st); err != nil {
		return entryError(w.op, name, err)
	}
	return w.fn(h, nil)
}

// header describes the file with stat st: n in the directory fd, or fd
// itself if n is empty.
func (w *walker) header(fd int, n, name string, st *unix.Stat_t) (*tar.Header, error) {
	h := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
		Format:  tar.FormatPAX,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		h.Typeflag = tar.TypeDir
	case unix.S_IFREG:
		h.Typeflag, h.Size = tar.TypeReg, st.Size
	case unix.S_IFLNK:
		h.Typeflag = tar.TypeSymlink
		k, err := unix.Readlinkat(fd, n, w.value[:unix.PathMax])
		if err != nil {
			return nil, os.NewSyscallError("readlinkat", err)
		}
		h.Linkname = string(w.value[:k])
	case unix.S_IFIFO:
		h.Typeflag = tar.TypeFifo
	case unix.S_IFCHR, unix.S_IFBLK:
		h.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			h.Typeflag = tar.TypeBlock
		}
		h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	default:
		return nil, refusal("sockets cannot be imported")
	}
	return h, w.xattrs(h, fd, n)
}

// xattrs adds the xattrs of n in the directory fd (or of fd if n is empty)
// to h as PAX records.
func (w *walker) xattrs(h *tar.Header, fd int, n string) error {
	// A symlink cannot be opened, so it is named through its parent's
	// descriptor, and the l* calls do not follow it.
	p := fmt.Sprintf("/proc/self/fd/%d/%s", fd, n)
	var k int
	var err error
	if n == "" {
		k, err = unix.Flistxattr(fd, w.list)
	} else {
		k, err = unix.Llistxattr(p, w.list)
	}
	if errors.Is(err, unix.ENOTSUP) || k == 0 {
		return nil
	}
	if err != nil {
		return os.NewSyscallError("listxattr", err)
	}
	for attr := range strings.SplitSeq(strings.TrimSuffix(string(w.list[:k]), "\x00"), "\x00") {
		if n == "" {
			k, err = unix.Fgetxattr(fd, attr, w.value)
		} else {
			k, err = unix.Lgetxattr(p, attr, w.value)
		}
		if errors.Is(err, unix.ENODATA) {
			continue
		}
		if err != nil {
			return fmt.Errorf("get xattr %s: %w", attr, err)
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords[xattrPrefix+attr] = string(w.value[:k])
	}
	return nil
}
