package cgroup

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/molt-sh/molt/internal/testutil"
)

func TestParseDevRules(t *testing.T) {
	rules, err := parseDevRules([]string{"c 1:3 rwm", "c 136:* rwm"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 2 || rules[0] != (devRule{1, 3}) || rules[1] != (devRule{136, -1}) {
		t.Fatalf("rules: %+v", rules)
	}
	for _, bad := range []string{"b 8:0 rwm", "c 1:3 r", "c 1 rwm", "c x:1 rwm"} {
		if _, err := parseDevRules([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDeviceFilter runs a process in a cgroup2 directory with the filter
// attached: it opens an allowed device and is refused one outside the
// list, as root.
func TestDeviceFilter(t *testing.T) {
	testutil.RequireRoot(t)
	root, err := Cgroup2Root()
	if err != nil {
		testutil.Unavailable(t, "no cgroup2 mount: "+err.Error())
	}
	if _, err := os.Stat("/dev/kmsg"); err != nil {
		testutil.Unavailable(t, "no /dev/kmsg to be refused")
	}
	dir := filepath.Join(root, "molt-test-devfilter-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := AttachDeviceFilter(dir); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	cmd := exec.Command("/bin/sh", "-c", `
		exec 3</dev/null && echo null-ok
		exec 4</dev/urandom && echo urandom-ok
		(exec 5</dev/kmsg) 2>/dev/null && echo kmsg-opened || echo kmsg-refused`)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.Fields(string(out)); strings.Join(got, " ") != "null-ok urandom-ok kmsg-refused" {
		t.Fatalf("in the filtered cgroup: %q", out)
	}
	// The same outside: the refusal is the filter's.
	out, _ = exec.Command("/bin/sh", "-c", `(exec 5</dev/kmsg) 2>/dev/null && echo kmsg-opened`).CombinedOutput()
	if strings.TrimSpace(string(out)) != "kmsg-opened" {
		t.Fatalf("outside the cgroup: %q", out)
	}
}

// TestNewAttachesDeviceFilter: a sandbox cgroup in the unified hierarchy
// refuses devices outside the list by itself, whatever the v1 devices
// controller does.
func TestNewAttachesDeviceFilter(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := New(testName(t), Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy(context.Background()) })
	if c.unified == "" {
		testutil.Unavailable(t, "no unified hierarchy on this host")
	}
	fd, err := syscall.Open(c.unified, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	cmd := exec.Command("/bin/sh", "-c", `(exec 5</dev/kmsg) 2>/dev/null && echo kmsg-opened || echo kmsg-refused`)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "kmsg-refused" {
		t.Fatalf("%v: %q", err, out)
	}
}

// TestKillMember: a process of the sandbox (in its leaf, below the
// cgroup named) is killed; one outside is not.
func TestKillMember(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := New(testName(t), Resources{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy(context.Background()) })
	in, out := exec.Command("sleep", "100"), exec.Command("sleep", "100")
	for _, cmd := range []*exec.Cmd{in, out} {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	if err := c.Add(in.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := c.KillMember(out.Process.Pid); err == nil {
		t.Fatal("a process outside the cgroup was signalled")
	}
	if err := c.KillMember(in.Process.Pid); err != nil {
		t.Fatalf("KillMember of a member: %v", err)
	}
	if err := in.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("member: %v, want killed", err)
	}
	if err := out.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the process outside is gone: %v", err)
	}
}
