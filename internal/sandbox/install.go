package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// InstallInit puts a copy of bin at /.molt/init inside the sandbox root.
// bin should live on the same btrfs filesystem as root, where the copy is
// a reflink (O(1)). The sandbox may have replaced /.molt or /.molt/init by
// anything, symlinks included: the write never leaves root.
func InstallInit(root, bin string) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("install init: open root: %w", err)
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{
		Flags:   unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	dfd, err := unix.Openat2(rfd, ".molt", how)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		if err := unix.Unlinkat(rfd, ".molt", 0); err != nil {
			return fmt.Errorf("install init: replace /.molt: %w", err)
		}
		err = unix.ENOENT
	}
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(rfd, ".molt", 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("install init: mkdir /.molt: %w", err)
		}
		dfd, err = unix.Openat2(rfd, ".molt", how)
	}
	if err != nil {
		return fmt.Errorf("install init: open /.molt: %w", err)
	}
	defer unix.Close(dfd)
	if err := unix.Unlinkat(dfd, "init", 0); err != nil && !errors.Is(err, unix.ENOENT) {
		if err := unix.Unlinkat(dfd, "init", unix.AT_REMOVEDIR); err != nil {
			return fmt.Errorf("install init: remove old /.molt/init: %w", err)
		}
	}
	dst, err := unix.Openat(dfd, "init", unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o755)
	if err != nil {
		return fmt.Errorf("install init: create /.molt/init: %w", err)
	}
	df := os.NewFile(uintptr(dst), "init")
	defer df.Close()
	src, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("install init: %w", err)
	}
	defer src.Close()
	if err := unix.IoctlFileClone(dst, int(src.Fd())); err != nil {
		if _, err := io.Copy(df, src); err != nil {
			return fmt.Errorf("install init: copy: %w", err)
		}
	}
	if err := df.Chmod(0o755); err != nil {
		return fmt.Errorf("install init: %w", err)
	}
	return df.Close()
}
