package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/sbinit"
)

// CgroupNS makes a cgroup namespace rooted at the cgroup join puts a
// process in (a sandbox's leaf), with a short-lived helper process (the
// binary's sbinit.CgroupNSHolder stage), and returns it open. A CRIU
// started in it hands it to the tree it restores.
func (l *Launcher) CgroupNS(join func(pid int) error) (ns.Ref, error) {
	cmd := exec.Command(l.Binary, sbinit.ArgCgroupNS)
	cmd.Dir = "/"
	cmd.Env = []string{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return ns.Ref{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return ns.Ref{}, err
	}
	if err := cmd.Start(); err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %w", err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	pid := cmd.Process.Pid
	if err := join(pid); err != nil {
		return ns.Ref{}, fmt.Errorf("cgroup namespace helper: %w", err)
	}
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
