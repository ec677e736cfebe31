package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// An updater is an extractor over a tree that is there already (a
// snapshot of a tree much like the one the entries describe): entries
// replace what is at their names, Keep marks an entry that is right as
// it is, and Finish removes what was neither put nor kept. Unlike an
// image layer's, its entries are never whiteouts: a file named ".wh.x"
// is a file.

// NewUpdater returns an Extractor that turns dst, an existing directory,
// into the tree its entries describe. Every directory of that tree must
// be Put (its mode, owner, xattrs and times are applied again, after
// its contents changed); other entries already right may be kept.
func NewUpdater(dst string) (*Extractor, error) {
	f, err := os.Open(dst)
	if err != nil {
		return nil, fmt.Errorf("tree update: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		f.Close()
		return nil, fmt.Errorf("tree update: %s is not a directory", dst)
	}
	x := &extractor{dst: f, root: int(f.Fd()), chown: os.Geteuid() == 0}
	x.beginLayer()
	x.layer.update = true
	return &Extractor{x: x}, nil
}

// Keep notes that the entry h, of an updater, is already in place as h
// describes it (not a directory, nor a hard link: those are put).
func (e *Extractor) Keep(h *tar.Header) error {
	x := e.x
	if x.layer == nil || !x.layer.update {
		return errors.New("tree update: keep outside an update")
	}
	name, err := cleanName(h.Name)
	if err != nil {
		return entryError("tree update", h.Name, err)
	}
	switch h.Typeflag {
	case tar.TypeReg, tar.TypeSymlink, tar.TypeFifo:
	default:
		return entryError("tree update", h.Name, refusal(fmt.Sprintf("an entry of type %q is put, not kept", h.Typeflag)))
	}
	x.seen[name] = h.Typeflag
	x.written(name)
	return nil
}

// finishUpdate removes what the update neither put nor kept.
func (x *extractor) finishUpdate() error {
	if err := x.prune(x.root, "."); err != nil {
		return entryError("tree update", ".", err)
	}
	return nil
}

// dropXattrs removes from the directory fd, there before an update put
// it again, the xattrs h does not list.
func (x *extractor) dropXattrs(fd int, h *tar.Header) error {
	buf := make([]byte, xattrMax)
	n, err := unix.Flistxattr(fd, buf)
	if errors.Is(err, unix.ENOTSUP) || n == 0 {
		return nil
	}
	if err != nil {
		return os.NewSyscallError("flistxattr", err)
	}
	for attr := range strings.SplitSeq(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00") {
		if _, ok := h.PAXRecords[xattrPrefix+attr]; ok || attr == "" {
			continue
		}
		if err := unix.Fremovexattr(fd, attr); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("remove xattr %s: %w", attr, err)
		}
	}
	return nil
}
