// Command userns-measure starts sandbox-like process trees, with or
// without a user namespace, for scripts/userns-measure.sh, which measures
// what CRIU can checkpoint and restore of them (docs/architecture.md,
// "User namespaces"). Not part of the daemon.
//
//	userns-measure start ROOT BASE SCRIPT   start /bin/sh -c SCRIPT in new namespaces
//	                                        rooted at ROOT; BASE -1: no user namespace,
//	                                        else root inside maps to host uid/gid BASE
//	                                        (65536 ids); prints the host PID
//	userns-measure idmap SRC DST BASE       mount SRC on DST idmapped to BASE (65536 ids)
//	userns-measure hold BASE                start a sleep in a new user namespace (mapped to
//	                                        BASE) owning new network, UTS and IPC ones; print its PID
//	userns-measure shift DIR BASE           add BASE to every file's owner and group
//	userns-measure copy PID                 inject a clone into PID (internal/template),
//	                                        leave the copy stopped, print its PID
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/template"
)

const size = 65536

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: start, idmap or copy, with their arguments"))
	}
	var err error
	switch os.Args[1] {
	case "start":
		err = start(os.Args[2], atoi(os.Args[3]), os.Args[4])
	case "stage1":
		err = stage1(os.Args[2], os.Args[3])
	case "idmap":
		err = idmap(os.Args[2], os.Args[3], atoi(os.Args[4]))
	case "copy":
		err = copyOf(atoi(os.Args[2]))
	case "hold":
		err = hold(atoi(os.Args[2]))
	case "shift":
		err = shift(os.Args[2], atoi(os.Args[3]))
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "userns-measure:", err)
	os.Exit(1)
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fail(err)
	}
	return n
}

func start(root string, base int, script string) error {
	cmd := exec.Command("/proc/self/exe", "stage1", root, script)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "UXP_NOSYS=" + os.Getenv("UXP_NOSYS")}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.ExtraFiles = []*os.File{w}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET,
		Setsid:     true,
	}
	if base >= 0 {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}}
		cmd.SysProcAttr.GidMappingsEnableSetgroups = true
		cmd.SysProcAttr.Credential = &syscall.Credential{}
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if line != "ok\n" {
		return fmt.Errorf("stage1: %q", line)
	}
	fmt.Printf("%d %.1f\n", cmd.Process.Pid, float64(time.Since(t0).Microseconds())/1000)
	return nil
}

// stage1 runs as PID 1 of the new namespaces: what internal/sbinit's
// stage 1 does, reduced to what the measurement needs.
func stage1(root, script string) error {
	sync := os.NewFile(3, "sync")
	report := func(err error) error {
		fmt.Fprintf(sync, "error: %v\n", err)
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return report(fmt.Errorf("private: %w", err))
	}
	if err := unix.Mount(root, root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return report(fmt.Errorf("bind root: %w", err))
	}
	if err := unix.Chdir(root); err != nil {
		return report(err)
	}
	// The old root stays until /proc and /sys are mounted: in a user
	// namespace the kernel mounts them only while full ones are in the
	// namespace.
	_ = unix.Mkdir(".oldroot", 0o700)
	if err := unix.PivotRoot(".", ".oldroot"); err != nil {
		return report(fmt.Errorf("pivot_root: %w", err))
	}
	_ = unix.Chdir("/")
	const std = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("proc", "/proc", "proc", std, ""); err != nil {
		return report(fmt.Errorf("proc: %w", err))
	}
	if os.Getenv("UXP_NOSYS") != "1" {
		if err := unix.Mount("sysfs", "/sys", "sysfs", std|unix.MS_RDONLY, ""); err != nil {
			return report(fmt.Errorf("sysfs: %w", err))
		}
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return report(fmt.Errorf("devpts: %w", err))
	}
	if err := unix.Unmount("/.oldroot", unix.MNT_DETACH); err != nil {
		return report(fmt.Errorf("detach: %w", err))
	}
	_ = unix.Rmdir("/.oldroot")
	if err := unix.Sethostname([]byte("uxp")); err != nil {
		return report(err)
	}
	fd, err := unix.Open("/dev/null", unix.O_RDWR, 0)
	if err != nil {
		return report(fmt.Errorf("open /dev/null: %w", err))
	}
	for i := 0; i < 3; i++ {
		_ = unix.Dup3(fd, i, 0)
	}
	fmt.Fprintf(sync, "ok\n")
	_ = unix.CloseRange(3, ^uint(0), 0)
	return unix.Exec("/bin/sh", []string{"sh", "-c", script}, os.Environ())
}

// usernsFD returns a user namespace mapping 0 to base (size ids), held by
// nothing else: an idmapped mount keeps its own reference.
func usernsFD(base int) (*os.File, error) {
	cmd := exec.Command("/bin/sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	return os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
}

func idmap(src, dst string, base int) error {
	t0 := time.Now()
	us, err := usernsFD(base)
	if err != nil {
		return err
	}
	defer us.Close()
	t1 := time.Now()
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree: %w", err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(us.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr idmap: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	fmt.Printf("userns %.2f ms, mount %.2f ms\n", float64(t1.Sub(t0).Microseconds())/1000, float64(time.Since(t1).Microseconds())/1000)
	return nil
}

func copyOf(pid int) error {
	runtime.LockOSThread()
	t := template.NewTracer()
	t0 := time.Now()
	cp, err := t.Copy(pid, true)
	if err != nil {
		return err
	}
	d := time.Since(t0)
	if err := t.Detach(cp); err != nil {
		return err
	}
	t.Close()
	fmt.Printf("%d %.2f\n", cp, float64(d.Microseconds())/1000)
	return nil
}

// shift adds base to the owner and group of every file under dir (one
// filesystem), keeping setuid and setgid bits, which chown clears.
func shift(dir string, base int) error {
	n := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if err := unix.Lchown(p, int(st.Uid)+base, int(st.Gid)+base); err != nil {
			return err
		}
		if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 && st.Mode&unix.S_IFMT != unix.S_IFLNK {
			if err := unix.Chmod(p, st.Mode&07777); err != nil {
				return err
			}
		}
		n++
		return nil
	})
	fmt.Printf("%d files\n", n)
	return err
}

func hold(base int) error {
	cmd := exec.Command("/bin/sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: size}},
		Credential:  &syscall.Credential{},
		Setsid:      true,
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	fmt.Println(cmd.Process.Pid)
	return nil
}
