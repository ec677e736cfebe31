package sandbox

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// WriteIdentity writes /etc/hostname and /etc/machine-id inside the
// sandbox root from the host, for a sandbox whose processes are restored
// rather than started (a fresh init writes them itself). Paths resolve
// inside root: a symlink planted by a sandbox process cannot point the
// writes at a host file.
func WriteIdentity(root, hostname, machineID string) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("write identity: %w", err)
	}
	defer unix.Close(rfd)
	etc, err := unix.Openat2(rfd, "etc", &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOENT) {
		return nil // an image without /etc: nothing to rename
	}
	if err != nil {
		return fmt.Errorf("write identity: open /etc: %w", err)
	}
	defer unix.Close(etc)
	for name, content := range map[string]string{"hostname": hostname + "\n", "machine-id": machineID + "\n"} {
		if err := replaceAt(etc, name, content); err != nil {
			return fmt.Errorf("write identity: /etc/%s: %w", name, err)
		}
	}
	return nil
}

// replaceAt replaces dir/name by a file holding content (written next to
// it and renamed over it, so a symlink at name is replaced, not followed).
func replaceAt(dir int, name, content string) error {
	tmp := "." + name + ".molt-tmp"
	_ = unix.Unlinkat(dir, tmp, 0)
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	_, werr := unix.Write(fd, []byte(content))
	unix.Close(fd)
	if werr != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return werr
	}
	return unix.Renameat(dir, tmp, dir, name)
}
