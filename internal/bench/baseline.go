package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/core"
)

// criuBaseline is how a baseline runs plain CRIU (the command-line tool,
// full images, no molt).
type criuBaseline struct {
	path string
	// moltOpts runs CRIU with the options molt's own dumps and restores
	// use: the network, UTS and IPC namespaces left out of the images
	// (CRIU runs in the tree's on dump, in fresh ones on restore), no
	// network lock, cgroups left alone, molt's log level. Without it,
	// CRIU's defaults as a user would run them: every namespace dumped,
	// the network locked with nftables.
	moltOpts bool
}

// dump is the baseline's checkpoint: CRIU's own dump of the tree with
// full images, leaving it running.
func (b criuBaseline) dump(pid int, images string) error {
	if err := os.MkdirAll(images, 0o700); err != nil {
		return err
	}
	args := []string{"dump", "-t", strconv.Itoa(pid), "-D", images, "-o", "dump.log", "--leave-running", "--tcp-established", "--file-locks"}
	var cmd *exec.Cmd
	if b.moltOpts {
		args = append(args, "-v"+strconv.Itoa(core.DefaultCRIULogLevel), "--network-lock", "skip", "--manage-cgroups=ignore")
		// CRIU leaves out the namespaces it runs in itself.
		cmd = exec.Command("nsenter", append([]string{"--target", strconv.Itoa(pid), "--net", "--uts", "--ipc", "--", b.path}, args...)...)
	} else {
		cmd = exec.Command(b.path, append(args, "--network-lock", "nftables")...)
	}
	if out, err := runTimeout(cmd, 2*time.Minute); err != nil {
		return fmt.Errorf("criu dump: %v: %s%s", err, out, logTail(filepath.Join(images, "dump.log")))
	}
	return nil
}

// restore is the baseline's restore: CRIU's own restore of images onto
// root, detached; it returns the restored tree's root PID.
func (b criuBaseline) restore(images, work, root string) (int, error) {
	pidfile := filepath.Join(work, "pid")
	_ = os.Remove(pidfile)
	args := []string{"restore", "-D", images, "-W", work, "-o", "restore.log",
		"--root", root, "--restore-detached", "--pidfile", pidfile, "--tcp-established", "--file-locks"}
	var cmd *exec.Cmd
	if b.moltOpts {
		args = append(args, "-v"+strconv.Itoa(core.DefaultCRIULogLevel), "--network-lock", "skip", "--manage-cgroups=ignore")
		// The tree joins fresh namespaces of the types left out.
		cmd = exec.Command("unshare", append([]string{"--net", "--uts", "--ipc", "--", b.path}, args...)...)
	} else {
		cmd = exec.Command(b.path, append(args, "--network-lock", "nftables")...)
	}
	if out, err := runTimeout(cmd, 2*time.Minute); err != nil {
		return 0, fmt.Errorf("criu restore: %v: %s%s", err, out, logTail(filepath.Join(work, "restore.log")))
	}
	bs, err := os.ReadFile(pidfile)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(bs)))
}

func runTimeout(cmd *exec.Cmd, d time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	return c.CombinedOutput()
}

// logTail is the end of a CRIU log, for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return "\n" + path + ":\n" + string(b)
}

// killTree kills a restored tree's root (a PID namespace's init: all of
// it dies) and waits for it to go.
func killTree(pid int) {
	_ = unix.Kill(pid, unix.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); unix.Kill(pid, 0) == nil && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
}

// reflinkCopy copies src to dst the fastest way a btrfs pool offers a
// copy of a tree: cp sharing every file's extents (no data copied).
func reflinkCopy(src, dst string) error {
	if out, err := exec.Command("cp", "-a", "--reflink=always", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp --reflink=always %s: %v: %s", src, err, out)
	}
	return nil
}

// hostPython is the host's system Python for the copytree baseline:
// never one from PATH (a pyenv shim or a virtualenv measures something
// else and may be missing for root).
const hostPython = "/usr/bin/python3"

// pyCopytree replaces dst's contents with a copy of src's the way an
// agent framework in Python does it (DeltaBox's copytree baseline):
// shutil.rmtree of what is there, then shutil.copytree. A root file
// system holds device nodes (/dev/zero), which copy2 would read
// forever: special files are made anew, as cp -a does; owners are not
// kept (copytree does not).
const pyCopytree = `
import os, shutil, stat, sys
src, dst = sys.argv[1], sys.argv[2]
def copy(s, d):
    st = os.lstat(s)
    if stat.S_ISREG(st.st_mode):
        return shutil.copy2(s, d)
    os.mknod(d, st.st_mode, st.st_rdev)
    shutil.copystat(s, d)
    return d
for e in os.scandir(dst):
    if e.is_dir(follow_symlinks=False):
        shutil.rmtree(e.path)
    else:
        os.unlink(e.path)
shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, copy_function=copy)
`

// settlePool waits until the pool has no deleted subvolume left to
// clean, and its subvolume count has stopped changing (molt's deferred
// deletions queued), so that one method's garbage is not collected in
// the next method's window.
func settlePool(poolDir string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	prev := -1
	for {
		if out, err := exec.Command("btrfs", "filesystem", "sync", poolDir).CombinedOutput(); err != nil {
			return fmt.Errorf("btrfs filesystem sync: %v: %s", err, out)
		}
		if out, err := exec.Command("btrfs", "subvolume", "sync", poolDir).CombinedOutput(); err != nil {
			return fmt.Errorf("btrfs subvolume sync: %v: %s", err, out)
		}
		out, err := exec.Command("btrfs", "subvolume", "list", poolDir).Output()
		if err != nil {
			return fmt.Errorf("btrfs subvolume list: %v", err)
		}
		n := strings.Count(string(out), "\n")
		if n == prev {
			return nil
		}
		prev = n
		if time.Now().After(deadline) {
			return fmt.Errorf("pool not settled within %v", timeout)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
