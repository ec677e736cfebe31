package criu

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/testutil"
)

// realTool returns a Tool for the installed CRIU, or skips (fails in CI).
func realTool(t testing.TB) *Tool {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := os.Stat(DefaultPath); err != nil {
		testutil.Unavailable(t, "criu not installed: run scripts/criu.sh")
	}
	return New(DefaultPath)
}

// python returns the system's python3 (never a user's pyenv build).
func python(t testing.TB) string {
	t.Helper()
	return testutil.Python(t)
}

// counterScript counts in memory, one step per 100 ms (one step only
// across a checkpoint, however long it lasts), and answers every
// connection to its listening socket with the count. argv: heap bytes
// (held as random, incompressible data) and the file that receives the
// port. Like most servers it sets SO_REUSEADDR: without it, the restored
// socket cannot bind while the connections it closed are in TIME_WAIT.
const counterScript = `
import os, select, socket, sys, time
os.closerange(3, 1 << 16)
heap = os.urandom(int(sys.argv[1]))
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0))
s.listen(8)
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
n, last = 0, time.monotonic()
while True:
    r, _, _ = select.select([s], [], [], 0.1)
    if r:
        c, _ = s.accept()
        c.sendall(b"%d\n" % n)
        c.close()
    now = time.monotonic()
    if now - last >= 0.1:
        n, last = n + 1, now
`

// counter is a running counterScript: a child of the test, in its own
// session, stdio on /dev/null.
type counter struct {
	cmd    *exec.Cmd
	port   int
	exited chan struct{}
}

func startCounter(t testing.TB, heap int) *counter {
	t.Helper()
	portFile := filepath.Join(t.TempDir(), "port")
	c := startScript(t, counterScript, strconv.Itoa(heap), portFile)
	c.port = waitPort(t, portFile)
	return c
}

// startScript runs a Python script with args as startCounter does.
func startScript(t testing.TB, script string, args ...string) *counter {
	t.Helper()
	cmd := exec.Command(python(t), append([]string{"-c", script}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &counter{cmd: cmd, exited: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(c.kill)
	return c
}

// waitPort returns the port a script wrote to portFile.
func waitPort(t testing.TB, portFile string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(portFile)
		if err == nil {
			port, err := strconv.Atoi(string(b))
			if err != nil {
				t.Fatal(err)
			}
			return port
		}
		if time.Now().After(deadline) {
			t.Fatal("the script did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *counter) pid() int { return c.cmd.Process.Pid }

// kill kills the original process (if it still runs) and reaps it.
func (c *counter) kill() {
	c.cmd.Process.Kill()
	<-c.exited
}

// count asks the process listening on port for its count.
func count(port int) (int, error) {
	conn, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("read count: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(line))
}

func mustCount(t testing.TB, port int) int {
	t.Helper()
	n, err := count(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCount waits until the count reaches n.
func waitCount(t testing.TB, port, n int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v := mustCount(t, port)
		if v >= n {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("count stuck at %d, want %d", v, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// adopt returns the restored process (a child of the test when restored
// with RstSibling) and kills and reaps it at cleanup.
func adopt(t testing.TB, pid int) *os.Process {
	t.Helper()
	p, err := os.FindProcess(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		p.Wait()
	})
	return p
}

// ppid returns the parent of pid.
func ppid(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	n, _ := strconv.Atoi(f[1])
	return n
}

// procState returns the state letter of pid ("R", "S", "t", ...).
func procState(t testing.TB, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	return b[strings.LastIndexByte(string(b), ')')+2]
}

// freePid returns a PID that no process has.
func freePid(t testing.TB) int {
	t.Helper()
	for pid := 4000000; pid > 1000; pid-- {
		if unix.Kill(pid, 0) == unix.ESRCH {
			return pid
		}
	}
	t.Fatal("no free pid")
	return 0
}

func dirs3(t testing.TB) (images, dumpWork, restoreWork string) {
	t.Helper()
	d := t.TempDir()
	images, dumpWork, restoreWork = filepath.Join(d, "images"), filepath.Join(d, "dump"), filepath.Join(d, "restore")
	for _, p := range []string{images, dumpWork, restoreWork} {
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}
