package capture

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/molt-sh/molt/internal/template"
	"github.com/molt-sh/molt/internal/testutil"
)

// TestCopyCloseSparesReusedPID: a template capture's copies are killed
// by CRIU and reaped by pid1 as they are dumped, and their PIDs are then
// free; closing the capture afterwards must not signal whatever process
// got such a PID since (here made to get it through ns_last_pid).
func TestCopyCloseSparesReusedPID(t *testing.T) {
	testutil.RequireRoot(t)
	copyProc := exec.Command("sleep", "1000")
	if err := copyProc.Start(); err != nil {
		t.Fatal(err)
	}
	pid := copyProc.Process.Pid
	tc := &treeCopy{tracer: template.NewTracer(), copies: make([]int, 1)}
	tc.hold(0, pid)
	// The copy's end as a dump makes it: killed and reaped.
	_ = copyProc.Process.Kill()
	_ = copyProc.Wait()

	// Another process takes the PID: a shell sets the next PID and
	// forks at once (a Go program's threads would take PIDs in between).
	var other *exec.Cmd
	var otherPid int
	for try := 0; try < 50 && other == nil; try++ {
		c := exec.Command("sh", "-c", fmt.Sprintf("echo %d > /proc/sys/kernel/ns_last_pid || exit 3; sleep 1000 & echo $!; wait", pid-1))
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		out, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if n, _ := strconv.Atoi(strings.TrimSpace(line)); n == pid {
			other, otherPid = c, n
			break
		}
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		if err := c.Wait(); err != nil && c.ProcessState.ExitCode() == 3 {
			testutil.Unavailable(t, "cannot choose the next PID (ns_last_pid)")
		}
	}
	if other == nil {
		t.Fatalf("no process got PID %d again in 50 tries", pid)
	}
	t.Cleanup(func() { _ = syscall.Kill(-other.Process.Pid, syscall.SIGKILL); _ = other.Wait() })

	tc.close()
	// A SIGKILL takes effect on the way back to user space: give it time
	// to show.
	time.Sleep(300 * time.Millisecond)
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", otherPid))
	if err != nil {
		t.Fatalf("the process that reused a dumped copy's PID %d is gone after close: %v", pid, err)
	}
	if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:])); f[0] == "Z" || f[0] == "X" {
		t.Fatalf("the process that reused a dumped copy's PID %d was killed by close (state %s)", pid, f[0])
	}
}
