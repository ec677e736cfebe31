package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	v1 "github.com/molt-sh/molt/api/v1"
)

// holdInotify creates inotify instances until the kernel refuses one,
// writes how many and why to /tmp/inotify, and holds them.
const holdInotify = `
import ctypes, errno, time
libc = ctypes.CDLL(None, use_errno=True)
out = open('/tmp/inotify.tmp', 'w')
n = 0
while n < 200000:
    if libc.inotify_init1(0) < 0:
        e = ctypes.get_errno()
        break
    n += 1
else:
    e = 0
out.write('%d %s\n' % (n, errno.errorcode.get(e, e)))
out.close()
__import__('os').rename('/tmp/inotify.tmp', '/tmp/inotify')
time.sleep(600)
`

// TestInotifyExhaustionSparesHost: a sandbox (uid 0, as the host's root)
// that creates inotify instances until the kernel refuses it stops at a
// bound of its own (its RLIMIT_NOFILE here), and the host's root can
// still create one: the daemon raised the per-uid pool they share.
func TestInotifyExhaustionSparesHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := startTestEphemeral(t, ctx)
	defer e.Close()
	if _, err := e.Client.BuildImage(ctx, v1.ImageBuildRequest{Name: "default"}, nil); err != nil {
		t.Fatal(err)
	}
	sb, err := e.Client.Create(ctx, v1.SandboxCreateRequest{Image: "default"})
	if err != nil {
		t.Fatal(err)
	}
	// Stopped first: the instances go as soon as the test is done with
	// them, not when the host's other users would notice.
	defer e.Client.Remove(context.Background(), sb.ID)
	run := func(cmd string) string {
		t.Helper()
		r, err := e.Client.SessionRun(ctx, sb.ID, "main", v1.SessionRunRequest{Command: cmd})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("%q: %v, %+v", cmd, err, r)
		}
		return strings.TrimSpace(r.Stdout)
	}
	memFile := filepath.Join("/sys/fs/cgroup/memory/molt", sb.ID, "memory.usage_in_bytes")
	memBefore := readInt64(memFile)
	script := strings.ReplaceAll(holdInotify, "'", `'"'"'`)
	run("setsid python3 -c '" + script + "' >/tmp/inotify.log 2>&1 < /dev/null &")
	var got string
	for deadline := time.Now().Add(2 * time.Minute); got == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		got = run("cat /tmp/inotify 2>/dev/null || true")
	}
	if got == "" {
		t.Fatalf("the sandbox's process reported nothing: %s", run("cat /tmp/inotify.log"))
	}
	f := strings.Fields(got)
	n, _ := strconv.Atoi(f[0])
	var lim unix.Rlimit
	_ = unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	t.Logf("the sandbox created %d inotify instances and was refused with %s (its RLIMIT_NOFILE soft limit: %d, inherited)", n, f[1], lim.Cur)
	if memAfter := readInt64(memFile); memBefore > 0 && memAfter > memBefore && n > 0 {
		t.Logf("its memory cgroup grew by %d bytes: %d bytes per instance", memAfter-memBefore, (memAfter-memBefore)/int64(n))
	}
	// The host's root, while the sandbox holds all it could get.
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host root: inotify_init1: %v, after the sandbox took %d instances (%s)", err, n, got)
	}
	unix.Close(fd)
	if f[1] != "EMFILE" || n < 1000 {
		t.Fatalf("the sandbox stopped at %d instances with %s; want its own file limit (EMFILE)", n, f[1])
	}
}

func readInt64(p string) int64 {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
