package criu

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// resolveStrict is how a path from the images is looked up under the
// restore's root: beneath it, through no symlink, magic link or mount.
const resolveStrict = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// CheckMounts checks, before a restore into root, the paths of the mount
// namespaces recorded in imagesDir that CRIU will look up in root's
// files: every mountpoint on the root mount and the source of every bind
// mount taken from the root's own filesystem (the /dev/null that masks a
// /proc file). The files come from the sandbox, which may have replaced a
// directory by a symlink to a host path; CRIU resolves these paths as
// host root, so it would mount, or bind a host file, there. Each must
// resolve beneath root through real directories (openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS); a path that
// does not exist yet (CRIU creates it) must have such a parent.
//
// Mounts on other filesystems (proc, sysfs, devpts, tmpfs) are not
// checked: their contents come from the kernel or from the images, not
// from root's files.
func CheckMounts(imagesDir, root string) error {
	names, err := filepath.Glob(filepath.Join(imagesDir, "mountpoints-*.img"))
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("restore root %s: %w", root, err)
	}
	defer unix.Close(rfd)
	for _, name := range names {
		ents, err := readImage[*mnt.MntEntry](name)
		if err != nil {
			return err
		}
		if err := checkMountEntries(rfd, ents); err != nil {
			return fmt.Errorf("restore into %s: %s: %w", root, filepath.Base(name), err)
		}
	}
	return nil
}

func checkMountEntries(rfd int, ents []*mnt.MntEntry) error {
	ids := map[uint32]bool{}
	for _, e := range ents {
		ids[e.GetMntId()] = true
	}
	// The namespace's root mount: the one whose parent is not in it.
	var top *mnt.MntEntry
	for _, e := range ents {
		if !ids[e.GetParentMntId()] || e.GetParentMntId() == e.GetMntId() {
			if top != nil {
				return fmt.Errorf("two root mounts (%q, %q): %w", top.GetMountpoint(), e.GetMountpoint(), errdefs.ErrFailedPrecondition)
			}
			top = e
		}
	}
	if top == nil {
		return fmt.Errorf("no root mount: %w", errdefs.ErrFailedPrecondition)
	}
	topMP := cleanMP(top.GetMountpoint())
	topRoot := path.Clean("/" + top.GetRoot())
	for _, e := range ents {
		if e == top {
			continue
		}
		mp := cleanMP(e.GetMountpoint())
		if e.GetParentMntId() == top.GetMntId() {
			rel, ok := strings.CutPrefix(mp, topMP)
			if !ok || (topMP != "/" && rel != "" && !strings.HasPrefix(rel, "/")) {
				return fmt.Errorf("mount %d at %q is outside the root mount %q: %w", e.GetMntId(), mp, topMP, errdefs.ErrFailedPrecondition)
			}
			if err := checkBeneath(rfd, rel); err != nil {
				return fmt.Errorf("mountpoint %q: %w", mp, err)
			}
		}
		if e.GetRootDev() != top.GetRootDev() || e.GetExtMount() || e.GetDeleted() {
			continue
		}
		// A bind mount of part of the root's filesystem.
		src, ok := strings.CutPrefix(path.Clean("/"+e.GetRoot()), topRoot)
		if !ok || (topRoot != "/" && src != "" && !strings.HasPrefix(src, "/")) {
			return fmt.Errorf("bind mount at %q comes from %q, outside the root %q: %w", mp, e.GetRoot(), topRoot, errdefs.ErrFailedPrecondition)
		}
		if err := checkBeneath(rfd, src); err != nil {
			return fmt.Errorf("source %q of the bind mount at %q: %w", src, mp, err)
		}
	}
	return nil
}

// cleanMP is a mountpoint as a clean absolute path (CRIU records them
// relative to its mount yard, as "./proc" or "/proc").
func cleanMP(p string) string {
	return path.Clean("/" + strings.TrimPrefix(p, "."))
}

// checkBeneath resolves rel under rfd strictly (resolveStrict). A path
// that does not exist is checked through its nearest existing parent.
func checkBeneath(rfd int, rel string) error {
	rel = strings.TrimPrefix(path.Clean("/"+rel), "/")
	for {
		if rel == "" {
			return nil
		}
		fd, err := unix.Openat2(rfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolveStrict})
		if err == nil {
			unix.Close(fd)
			return nil
		}
		if errors.Is(err, unix.ENOENT) {
			rel = strings.TrimPrefix(path.Dir("/"+rel), "/")
			continue
		}
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return fmt.Errorf("%s leaves the root through a symlink or mount (%v): refused, the sandbox may have planted it: %w", rel, err, errdefs.ErrFailedPrecondition)
		}
		return &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
}

func init() { imageKinds["*mnt.MntEntry"] = "MNTS" }
