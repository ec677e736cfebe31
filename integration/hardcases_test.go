package integration

import (
	"strings"
	"testing"
	"time"
)

// Each hard case starts background processes with setup, takes a full
// checkpoint, lets things change, rolls back, and runs check, which
// prints "ok" when the restored processes behave.
var hardCases = []struct {
	name, setup, check string
}{
	{
		name: "file open for writing",
		setup: `import os, time
f = open('/work/log', 'w')
n = 0
while True:
    n += 1
    f.write('%d\n' % n); f.flush()
    time.sleep(0.05)`,
		// The writer goes on at its restored offset: lines stay in order.
		check: `sleep 0.5; python3 -c "
l = [int(x) for x in open('/work/log').read().split()]
assert l == list(range(1, len(l) + 1)), l[-5:]
assert len(l) > 2
print('ok')"`,
	},
	{
		name: "deleted but open file",
		setup: `import os, time
f = open('/work/ghost', 'w+'); f.write('still here'); f.flush()
os.unlink('/work/ghost')
while True:
    f.seek(0)
    open('/work/seen', 'w').write(f.read())
    time.sleep(0.05)`,
		check: `rm -f /work/seen; sleep 0.3; test "$(cat /work/seen)" = "still here" && test ! -e /work/ghost && echo ok`,
	},
	{
		name: "pipe between two processes",
		setup: `import os, time
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    n = 0
    while True:
        n += 1
        os.write(w, b'%d\n' % n)
        time.sleep(0.05)
os.close(w)
f = os.fdopen(r)
last = 0
for line in f:
    n = int(line)
    assert n == last + 1
    last = n
    # Replaced whole: the check never reads it half-written.
    open('/work/last.tmp', 'w').write(str(n))
    os.replace('/work/last.tmp', '/work/last')`,
		check: `a=$(cat /work/last); sleep 0.3; b=$(cat /work/last); test "$b" -gt "$a" && echo ok`,
	},
	{
		name: "listening TCP server",
		setup: `import http.server, os
os.chdir('/work')
open('/work/index.html', 'w').write('served')
http.server.HTTPServer(('127.0.0.1', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()`,
		check: `python3 -c "
import urllib.request
assert urllib.request.urlopen('http://127.0.0.1:8080/index.html', timeout=5).read() == b'served'
print('ok')"`,
	},
	{
		name: "established loopback TCP connection",
		setup: `import socket, threading, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 9090)); srv.listen()
def echo():
    c, _ = srv.accept()
    while True:
        d = c.recv(100)
        if not d: return
        c.sendall(d)
threading.Thread(target=echo, daemon=True).start()
cl = socket.create_connection(('127.0.0.1', 9090))
n = 0
while True:
    n += 1
    cl.sendall(b'%d;' % n)
    assert cl.recv(100) == b'%d;' % n
    open('/work/echoed', 'w').write(str(n))
    time.sleep(0.05)`,
		check: `a=$(cat /work/echoed); sleep 0.3; b=$(cat /work/echoed); test "$b" -gt "$a" && echo ok`,
	},
	{
		name: "file lock",
		setup: `import fcntl, time
f = open('/work/lockfile', 'w')
fcntl.flock(f, fcntl.LOCK_EX)
while True: time.sleep(1)`,
		// The restored holder still holds the lock.
		check: `python3 -c "
import fcntl
f = open('/work/lockfile', 'w')
try:
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print('ok')"`,
	},
	{
		name: "process with a terminal",
		setup: `import os, pty, time
pid, fd = pty.fork()
if pid == 0:
    os.execvp('bash', ['bash', '--norc'])
os.write(fd, b'export T=term; stty -echo\n')
while True:
    os.write(fd, b'echo tick $T > /work/tty\n')
    time.sleep(0.1)`,
		check: `rm -f /work/tty; sleep 0.5; grep -q "tick term" /work/tty && echo ok`,
	},
}

func TestFullCheckpointHardCases(t *testing.T) {
	requireCRIU(t)
	for _, c := range hardCases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			sb := newSandbox(t)
			sh(t, sb, "mkdir -p /work")
			must(t, "exec", "--detach", sb, "--", "python3", "-c", c.setup)
			time.Sleep(700 * time.Millisecond)
			ck := strings.TrimSpace(must(t, "checkpoint", sb, "--kind", "full"))
			time.Sleep(300 * time.Millisecond)
			must(t, "rollback", sb, ck)
			if got := sh(t, sb, c.check); strings.TrimSpace(got) != "ok" {
				t.Fatalf("after rollback: %q", got)
			}
		})
	}
}

// A process running as another user cannot be dumped on a host without
// CAP_SYS_RESOURCE (CRIU cannot read its rlimits): the checkpoint is
// refused up front, naming the process, and the sandbox runs on.
func TestFullCheckpointNonRootProcess(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	must(t, "exec", "--detach", "-u", "nobody", sb, "--", "sleep", "1000")
	r := molt(t, "checkpoint", sb, "--kind", "full")
	if hasSysResource() {
		if r.code != 0 {
			t.Fatalf("checkpoint with a non-root process on a host with CAP_SYS_RESOURCE: %s", r.stderr)
		}
		return
	}
	if r.code == 0 || !strings.Contains(r.stderr, "uid 65534") || !strings.Contains(r.stderr, "sleep") || !strings.Contains(r.stderr, "CAP_SYS_RESOURCE") {
		t.Fatalf("checkpoint with a non-root process: exit %d %q", r.code, r.stderr)
	}
	if got := sh(t, sb, "pgrep -u nobody sleep >/dev/null && echo running"); got != "running\n" {
		t.Fatalf("the sandbox did not run on: %q", got)
	}
	if cks := must(t, "--json", "checkpoints", sb); strings.Contains(cks, "full") {
		t.Fatalf("a refused checkpoint is listed: %s", cks)
	}
}

// The sandbox's network namespace holds only loopback: no connection
// can leave it, so none needs a policy on restore.
func TestNoExternalNetwork(t *testing.T) {
	sb := newSandbox(t)
	r := molt(t, "exec", sb, "--", "python3", "-c", "import socket; socket.create_connection(('192.0.2.1', 80), timeout=2)")
	if r.code == 0 || !strings.Contains(r.stderr, "unreachable") {
		t.Fatalf("connection out of the sandbox: exit %d %q", r.code, r.stderr)
	}
}

// A command still running through molt exec holds a daemon connection
// inside the sandbox: a full checkpoint is refused with the reason, and
// works once the command ended.
func TestFullCheckpointWaitsForCommands(t *testing.T) {
	requireCRIU(t)
	sb := newSandbox(t)
	done := make(chan result, 1)
	go func() { done <- molt(t, "exec", sb, "--", "sleep", "3") }()
	time.Sleep(500 * time.Millisecond)
	r := molt(t, "checkpoint", sb, "--kind", "full")
	if r.code == 0 || !strings.Contains(r.stderr, "still running") {
		t.Fatalf("full checkpoint during an exec: exit %d %q", r.code, r.stderr)
	}
	if r := <-done; r.code != 0 {
		t.Fatalf("the exec was disturbed: %+v", r)
	}
	must(t, "checkpoint", sb, "--kind", "full")
}
