package sandbox

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/sbinit"
)

// CgroupNS makes a cgroup namespace rooted at the cgroup join puts a
// process in (a sandbox's leaf), with a short-lived helper process, and
// returns it open. A CRIU started in it hands it to the tree it
// restores. The helper is util-linux's unshare behind a shell read when
// the host has them (three small execs: about 1/4 of the cost of
// starting the Go binary, which the fork path pays), else the binary's
// sbinit.CgroupNSHolder stage.
func (l *Launcher) CgroupNS(join func(pid int) error) (ns.Ref, error) {
	if sh, un := lookTools(); sh != "" && un != "" {
		return cgroupNSUnshare(sh, un, join)
	}
	return l.cgroupNSGo(join)
}

var lookTools = sync.OnceValues(func() (string, string) {
	sh, err1 := exec.LookPath("sh")
	un, err2 := exec.LookPath("unshare")
	if err1 != nil || err2 != nil {
		return "", ""
	}
	return sh, un
})

// cgroupNSUnshare runs sh, which waits on stdin until join has moved it,
// then becomes `unshare -C cat`: once its cgroup namespace differs from
// this process's it is the new one, open it.
func cgroupNSUnshare(sh, un string, join func(pid int) error) (ns.Ref, error) {
	cmd := exec.Command(sh, "-c", `read _ && exec "$0" -C cat`, un)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	stdin, stop, err := startJoined(cmd, join)
	if err != nil {
		return ns.Ref{}, err
	}
	defer stop()
	pid := cmd.Process.Pid
	if _, err := stdin.Write([]byte{'\n'}); err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %w", err)
	}
	var host unix.Stat_t
	if err := unix.Stat("/proc/self/ns/cgroup", &host); err != nil {
		return ns.Ref{}, err
	}
	path := fmt.Sprintf("/proc/%d/ns/cgroup", pid)
	deadline := time.Now().Add(5 * time.Second)
	for step := 50 * time.Microsecond; ; step = min(2*step, 5*time.Millisecond) {
		// The process is ours and unreaped until the deferred Wait: the
		// PID cannot be another's.
		f, err := os.Open(path)
		if err != nil {
			return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %w", err)
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Ino != host.Ino {
			// unshare has run; cat, which it executes next, keeps it.
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) != "sh" {
				return ns.Ref{Type: unix.CLONE_NEWCGROUP, File: f}, nil
			}
		}
		f.Close()
		if time.Now().After(deadline) {
			return ns.Ref{}, fmt.Errorf("cgroup namespace helper: no new cgroup namespace after 5 s")
		}
		time.Sleep(step)
	}
}

// cgroupNSGo is CgroupNS with the binary's own helper stage.
func (l *Launcher) cgroupNSGo(join func(pid int) error) (ns.Ref, error) {
	cmd := exec.Command(l.Binary, sbinit.ArgCgroupNS)
	cmd.Env = []string{}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return ns.Ref{}, err
	}
	stdin, stop, err := startJoined(cmd, join)
	if err != nil {
		return ns.Ref{}, err
	}
	defer stop()
	pid := cmd.Process.Pid
	if _, err := stdin.Write([]byte{'g'}); err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %w", err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	tid, ok := strings.CutPrefix(strings.TrimSpace(line), "ok ")
	if !ok {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %q, %v", line, err)
	}
	if _, err := strconv.Atoi(tid); err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: bad tid %q", tid)
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/task/%s/ns/cgroup", pid, tid))
	if err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %w", err)
	}
	return ns.Ref{Type: unix.CLONE_NEWCGROUP, File: f}, nil
}

// startJoined starts a cgroup namespace helper (cmd, in /), which waits
// on its stdin, and moves it with join. stop closes its stdin, kills it
// and reaps it.
func startJoined(cmd *exec.Cmd, join func(pid int) error) (stdin io.WriteCloser, stop func(), err error) {
	cmd.Dir = "/"
	if stdin, err = cmd.StdinPipe(); err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("cgroup namespace helper: %w", err)
	}
	stop = func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	if err := join(cmd.Process.Pid); err != nil {
		stop()
		return nil, nil, fmt.Errorf("cgroup namespace helper: %w", err)
	}
	return stdin, stop, nil
}

// OwnCgroupNS opens the cgroup namespace of the sandbox whose init is
// i, if it has one of its own (not the host's): a sandbox started or
// restored before it had one has none.
func (i Init) OwnCgroupNS() (ns.Ref, bool) {
	if !i.Alive() {
		return ns.Ref{}, false
	}
	var own, host unix.Stat_t
	if unix.Stat(fmt.Sprintf("/proc/%d/ns/cgroup", i.Pid), &own) != nil || unix.Stat("/proc/self/ns/cgroup", &host) != nil || own.Ino == host.Ino {
		return ns.Ref{}, false
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/cgroup", i.Pid))
	if err != nil {
		return ns.Ref{}, false
	}
	if !i.Alive() { // the PID was reused meanwhile
		f.Close()
		return ns.Ref{}, false
	}
	return ns.Ref{Type: unix.CLONE_NEWCGROUP, File: f}, true
}
