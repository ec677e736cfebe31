package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// Whiteouts, as the OCI image layer format and Docker write them: an
// entry ".wh.NAME" deletes NAME (and what it holds) from the layers
// below; ".wh..wh..opq" in a directory hides everything the layers below
// put in it. Other ".wh..wh." entries are the aufs driver's bookkeeping
// and mean nothing here.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// layerState is what the extractor knows of the layer being applied.
type layerState struct {
	// mine holds the names this layer wrote, and their parents: an
	// opaque directory keeps them and loses the rest.
	mine map[string]bool
	// opaque lists the directories this layer marked opaque, pruned
	// once the whole layer is written (the marker may come after the
	// layer's own entries in the directory).
	opaque []string
	// update is set for an updater (update.go): no whiteouts, and
	// directories that were there lose the xattrs their entry lacks.
	update bool
}

// beginLayer starts a layer: hard links may name entries of this layer or
// files the layers below left.
func (x *extractor) beginLayer() {
	x.layer = &layerState{mine: map[string]bool{".": true}}
	x.seen = map[string]byte{".": tar.TypeDir}
}

// endLayer applies the layer's opaque markers.
func (x *extractor) endLayer() error {
	for _, d := range x.layer.opaque {
		fd, err := openBeneath(x.root, d)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return entryError("image import", path.Join(d, whiteoutOpaque), err)
		}
		err = x.prune(fd, d)
		unix.Close(fd)
		if err != nil {
			return entryError("image import", path.Join(d, whiteoutOpaque), err)
		}
	}
	return nil
}

// written notes that the current layer wrote name.
func (x *extractor) written(name string) {
	if x.layer == nil {
		return
	}
	for n := name; !x.layer.mine[n]; n = path.Dir(n) {
		x.layer.mine[n] = true
	}
}

// whiteout handles name if it is a whiteout entry (done is then true).
// The entry's own type and contents do not matter.
func (x *extractor) whiteout(name string) (done bool, err error) {
	base := path.Base(name)
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return false, nil
	}
	dir := path.Dir(name)
	switch {
	case base == whiteoutOpaque:
		fd, err := x.openDir(dir)
		if err != nil {
			return true, err
		}
		unix.Close(fd)
		x.written(dir)
		x.layer.opaque = append(x.layer.opaque, dir)
		return true, nil
	case strings.HasPrefix(base, whiteoutMeta):
		return true, nil
	}
	victim := strings.TrimPrefix(base, whiteoutPrefix)
	if victim == "" || victim == "." || victim == ".." {
		return true, refusal(fmt.Sprintf("whiteout of %q", victim))
	}
	pfd, err := openBeneath(x.root, dir)
	if errors.Is(err, unix.ENOENT) {
		return true, nil // nothing below to hide
	}
	if err != nil {
		return true, err
	}
	defer unix.Close(pfd)
	target := path.Join(dir, victim)
	x.forget(target)
	return true, removeAt(pfd, victim)
}

// prune removes from the directory fd, named name, what the current
// layer did not write, and prunes the directories it did write.
func (x *extractor) prune(fd int, name string) error {
	names, err := readNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(name, n)
		if !x.layer.mine[p] {
			x.forget(p)
			if err := removeAt(fd, n); err != nil {
				return err
			}
			continue
		}
		cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue
		}
		if err != nil {
			return os.NewSyscallError("openat", err)
		}
		err = x.prune(cfd, p)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// forget notes that name and what is below it are being deleted: the
// directory modes recorded for them so far are not applied (finish).
// Noted, not filtered here, so that many whiteouts over many directories
// cost no more than their number.
func (x *extractor) forget(name string) {
	if x.deleted == nil {
		x.deleted = map[string]int{}
	}
	x.deleted[name] = len(x.dirs)
	delete(x.seen, name)
}

// deletedSince reports whether the directory recorded as x.dirs[i], name,
// or one of its parents was deleted after it was recorded.
func (x *extractor) deletedSince(name string, i int) bool {
	for p := name; ; p = path.Dir(p) {
		if n, ok := x.deleted[p]; ok && n > i {
			return true
		}
		if p == "." || p == "/" {
			return false
		}
	}
}

// lower returns the type of t, a file a layer below left, for a hard link
// to it; directories and missing files are not returned.
func (x *extractor) lower(t string) (byte, bool) {
	pfd, err := openBeneath(x.root, path.Dir(t))
	if err != nil {
		return 0, false
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, path.Base(t), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, false
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return tar.TypeReg, true
	case unix.S_IFLNK:
		return tar.TypeSymlink, true
	case unix.S_IFIFO:
		return tar.TypeFifo, true
	}
	return 0, false
}

// readNames lists the directory fd without moving fd's own offset.
func readNames(fd int) ([]string, error) {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("openat", err)
	}
	f := os.NewFile(uintptr(dfd), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

// removeAt removes base from the directory pfd, and all it holds if it is
// a directory, never following a symlink.
func removeAt(pfd int, base string) error {
	err := unix.Unlinkat(pfd, base, 0)
	switch {
	case err == nil, errors.Is(err, unix.ENOENT):
		return nil
	case !errors.Is(err, unix.EISDIR):
		return os.NewSyscallError("unlinkat", err)
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return os.NewSyscallError("openat", err)
	}
	// A read-only directory from a lower layer keeps its entries from
	// anyone without CAP_DAC_OVERRIDE; it is going anyway.
	_ = unix.Fchmod(fd, 0o700)
	names, err := readNames(fd)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	unix.Close(fd)
	if err != nil {
		return err
	}
	return os.NewSyscallError("unlinkat", unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR))
}
