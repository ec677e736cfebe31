package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

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

// openDirIn opens the directory of path (absolute, inside the sandbox)
// resolving inside root, creating missing directories when mkdir is set.
func openDirIn(root, dir string, mkdir bool) (int, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(rfd)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	rel := strings.Trim(dir, "/")
	if rel == "" {
		return unix.Openat2(rfd, ".", how)
	}
	fd, err := unix.Openat2(rfd, rel, how)
	if err == nil || !mkdir || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	// Make each missing component, each resolved inside root.
	cur := ""
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			return -1, fmt.Errorf("path %q: bad component", dir)
		}
		cur = path.Join(cur, c)
		parent, err := unix.Openat2(rfd, "."+"/"+path.Dir(cur), how)
		if err != nil {
			return -1, err
		}
		err = unix.Mkdirat(parent, c, 0o755)
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, err
		}
	}
	return unix.Openat2(rfd, rel, how)
}

// WriteFileIn replaces the file at p (absolute, inside the sandbox)
// under root with content, resolving every component inside root and
// replacing a symlink at p rather than following it. Missing
// directories are made.
func WriteFileIn(root, p string, content []byte) error {
	dir, err := openDirIn(root, path.Dir(p), true)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer unix.Close(dir)
	if err := replaceAt(dir, path.Base(p), string(content)); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// ReadFileIn reads the regular file at p inside the sandbox root, at
// most limit bytes (a longer file is an error), resolving inside root.
func ReadFileIn(root, p string, limit int64) ([]byte, error) {
	dir, err := openDirIn(root, path.Dir(p), false)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, path.Base(p), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", p, limit)
	}
	return b, nil
}
