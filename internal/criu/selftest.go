package criu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/errdefs"
)

// SelfTestTimeout bounds SelfTest unless its context ends earlier.
const SelfTestTimeout = 30 * time.Second

// selfTestScript closes every descriptor but stdio and the listening
// socket (3), which the test process would otherwise inherit from this
// one's parent, and becomes `sleep`.
const selfTestScript = `for fd in /proc/$$/fd/*; do fd=${fd##*/}; if [ "$fd" -gt 3 ]; then eval "exec $fd>&-"; fi; done; exec sleep infinity`

// SelfTest checks end to end that CRIU works on this host: it starts a
// process that holds a TCP socket listening on 127.0.0.1 and sleeps (in
// its own session, stdio on /dev/null, no other descriptors, as root),
// dumps it, restores it as a child of this process, checks that it runs
// and that its socket accepts a connection, and kills it. The error names
// the step that failed and CRIU's cause; the CRIU logs it names are kept
// (in a directory under os.TempDir) when the test fails. It runs within
// SelfTestTimeout.
//
// Preconditions: root (CRIU cannot dump processes of other users on hosts
// without CAP_SYS_RESOURCE), bash and sleep in PATH.
func (t *Tool) SelfTest(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, SelfTestTimeout)
	defer cancel()
	if err := t.selfTest(ctx); err != nil {
		return fmt.Errorf("criu self-test: %w", err)
	}
	return nil
}

func (t *Tool) selfTest(ctx context.Context) (err error) {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: %w", errdefs.ErrFailedPrecondition)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		return fmt.Errorf("start: %w: %w", err, errdefs.ErrNotSupported)
	}
	dir, err := os.MkdirTemp("", "molt-criu-selftest-")
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer func() {
		if err == nil {
			os.RemoveAll(dir)
		}
	}()
	images, restoreWork := filepath.Join(dir, "images"), filepath.Join(dir, "restore")
	for _, d := range []string{images, restoreWork} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("start: %w", err)
		}
	}

	ln, port, err := listenLoopback()
	if err != nil {
		return fmt.Errorf("start: listen: %w", err)
	}
	cmd := exec.Command(bash, "-c", selfTestScript)
	cmd.ExtraFiles = []*os.File{ln}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	ln.Close()
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	pid := cmd.Process.Pid
	if err := waitComm(ctx, pid, "sleep"); err != nil {
		return fmt.Errorf("start: %w", err)
	}

	if _, err := t.Dump(ctx, DumpOptions{Pid: pid, ImagesDir: images}); err != nil {
		return fmt.Errorf("dump: %w", err)
	}
	// The PID must be free again for the restore.
	select {
	case <-exited:
	case <-ctx.Done():
		return fmt.Errorf("dump: the dumped process did not exit: %w", ctx.Err())
	}

	res, err := t.Restore(ctx, RestoreOptions{ImagesDir: images, WorkDir: restoreWork, RstSibling: true})
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	proc, err := os.FindProcess(res.Pid)
	if err != nil {
		return fmt.Errorf("restore: restored pid %d: %w", res.Pid, err)
	}
	defer func() {
		proc.Kill()
		proc.Wait()
	}()
	if res.Pid != pid {
		return fmt.Errorf("restore: restored pid %d, dumped %d", res.Pid, pid)
	}
	if err := waitComm(ctx, res.Pid, "sleep"); err != nil {
		return fmt.Errorf("restored process not running: %w", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("restored socket refuses connections: %w", err)
	}
	c.Close()
	return nil
}

// listenLoopback returns a TCP socket listening on 127.0.0.1 and its port.
// It is made with plain system calls: Go's listeners use MPTCP, which
// CRIU cannot dump.
func listenLoopback() (*os.File, int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return nil, 0, err
	}
	f := os.NewFile(uintptr(fd), "selftest-listener")
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		f.Close()
		return nil, 0, err
	}
	if err := unix.Listen(fd, 8); err != nil {
		f.Close()
		return nil, 0, err
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, sa.(*unix.SockaddrInet4).Port, nil
}

// waitComm waits until process pid runs the command comm and is not a
// zombie.
func waitComm(ctx context.Context, pid int, comm string) error {
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	for step := 100 * time.Microsecond; ; step = min(2*step, 10*time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err == nil {
			// "pid (comm) S ..."; comm may hold spaces and parentheses.
			if i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')'); i >= 0 && j > i && j+2 < len(b) {
				if string(b[i+1:j]) == comm && b[j+2] != 'Z' {
					return nil
				}
			}
		} else if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pid %d is gone", pid)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pid %d is not %q: %w", pid, comm, ctx.Err())
		case <-time.After(step):
		}
	}
}
