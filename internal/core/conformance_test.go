package core

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "github.com/molt-sh/molt/api/v1"
	"github.com/molt-sh/molt/internal/capture"
)

// stateCase is one kind of process state a full checkpoint must bring
// back exactly. setup (a shell command in the session) makes it and
// writes the PID to look at into /tmp/c; probe prints the state (with $P
// that PID); want is what probe prints at the checkpoint, or "" to take
// it from a probe run just before (probes that consume what they read,
// such as queued data, say it). mutate changes the state after the
// checkpoint, so the rollback has something to undo.
type stateCase struct {
	name, setup, probe, want, mutate string
	// refused, if set, is what the error of a full checkpoint of the
	// state says: no path can take it (the state stays as it was).
	refused string
}

// pyCase makes a case of a Python process: code sets up the state and
// defines probe() (run on SIGUSR1, its result the probe's output).
func pyCase(name, code, want, mutate string) stateCase {
	script := "import os, signal, socket, time, mmap, fcntl, threading\n" + code + `
def h(*a):
    try:
        r = probe()
    except Exception as e:
        r = 'error: %r' % e
    with open('/tmp/out.tmp', 'w') as out:
        out.write(r)
    os.rename('/tmp/out.tmp', '/tmp/out')
signal.signal(signal.SIGUSR1, h)
with open('/tmp/c.tmp', 'w') as pidf:
    pidf.write(str(os.getpid()))
os.rename('/tmp/c.tmp', '/tmp/c')
while True:
    signal.pause()
`
	return stateCase{
		name:   name,
		setup:  "cat > /tmp/case.py <<'PYEOF'\n" + script + "PYEOF\npython3 /tmp/case.py >/dev/null 2>/tmp/case.err &",
		probe:  `rm -f /tmp/out; kill -USR1 $P; for i in $(seq 200); do [ -e /tmp/out ] && break; sleep 0.02; done; cat /tmp/out`,
		want:   want,
		mutate: mutate,
	}
}

func withRefusal(c stateCase, refused string) stateCase {
	c.refused = refused
	return c
}

// stateCases are the process states of the conformance table.
var stateCases = []stateCase{
	{name: "stopped", setup: "sleep 1000 >/dev/null 2>&1 & echo $! >/tmp/c; kill -STOP $!",
		probe: "st $P", want: "T", mutate: "kill -CONT $P"},
	withRefusal(pyCase("traced", `import ctypes
libc = ctypes.CDLL(None, use_errno=True)
child = os.fork()
if child == 0:
    os.execvp('sleep', ['sleep', '1000'])
time.sleep(0.1)
libc.ptrace(16, child, 0, 0)  # PTRACE_ATTACH
os.waitpid(child, 0)
def probe():
    with open('/proc/%d/status' % child) as f:
        tracer = [l.split()[1] for l in f if l.startswith('TracerPid')][0]
    return 'traced' if tracer == str(os.getpid()) else 'tracer ' + tracer
`, "traced", ""), "is traced by"),
	{name: "zombie", setup: "bash -c 'sleep 0.01 & exec sleep 1000' >/dev/null 2>&1 & echo $! >/tmp/c; sleep 0.3",
		probe: "for k in $(cat /proc/$P/task/*/children); do st $k; done; echo end", want: "Z\nend"},
	{name: "deleted-cwd", setup: "mkdir /tmp/d; (cd /tmp/d && exec sleep 1000) >/dev/null 2>&1 & echo $! >/tmp/c; sleep 0.1; rmdir /tmp/d",
		probe: "readlink /proc/$P/cwd", want: "/tmp/d (deleted)", mutate: "mkdir -p /tmp/d"},
	{name: "deleted-mapped", setup: "cp /bin/sleep /tmp/s; /tmp/s 1000 >/dev/null 2>&1 & echo $! >/tmp/c; sleep 0.1; rm /tmp/s",
		probe: "grep -c '/tmp/s (deleted)' /proc/$P/maps; ls -l /proc/$P/fd | grep -c /tmp/s", mutate: "cp /bin/true /tmp/s"},
	{name: "deleted-open", setup: "(exec 7<>/tmp/o; echo content >&7; rm /tmp/o; exec sleep 1000) >/dev/null 2>&1 & echo $! >/tmp/c; sleep 0.1",
		probe: "readlink /proc/$P/fd/7; cat /proc/$P/fd/7", want: "/tmp/o (deleted)\ncontent", mutate: "echo more >>/proc/$P/fd/7"},
	{name: "fifo-data", setup: "mkfifo /tmp/f; sleep 1000 <>/tmp/f >/dev/null 2>&1 & echo $! >/tmp/c; sleep 0.1; echo queued >/tmp/f",
		probe: "timeout 2 dd if=/proc/$P/fd/0 bs=64 count=1 iflag=nonblock 2>/dev/null", want: "queued", mutate: "timeout 2 dd if=/proc/$P/fd/0 bs=64 count=1 iflag=nonblock >/dev/null 2>&1"},
	{name: "pipe-data", setup: "{ echo queued; exec sleep 1000; } | sleep 1000 >/dev/null 2>&1 & echo $! >/tmp/c; sleep 0.2",
		probe: "timeout 2 dd if=/proc/$P/fd/0 bs=64 count=1 iflag=nonblock 2>/dev/null", want: "queued", mutate: "timeout 2 dd if=/proc/$P/fd/0 bs=64 count=1 iflag=nonblock >/dev/null 2>&1"},
	pyCase("unix-stream", `a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
a.send(b'queued')
def probe():
    b.setblocking(False)
    return b.recv(64).decode()
`, "queued", "kill -USR1 $P"),
	pyCase("unix-dgram", `a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
a.send(b'queued')
def probe():
    b.setblocking(False)
    return b.recv(64).decode()
`, "queued", "kill -USR1 $P"),
	pyCase("tcp-listen", `l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', 7001))
l.listen()
def probe():
    c = socket.create_connection(('127.0.0.1', 7001), timeout=2)
    s, _ = l.accept()
    c.send(b'x')
    r = s.recv(1)
    c.close(); s.close()
    return 'accepted ' + r.decode()
`, "accepted x", ""),
	pyCase("tcp-established", `l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', 7002))
l.listen()
c = socket.create_connection(('127.0.0.1', 7002))
s, _ = l.accept()
c.send(b'queued')
time.sleep(0.1)
def probe():
    s.setblocking(False)
    r = s.recv(64)
    c.send(b'!')
    time.sleep(0.05)
    return r.decode() + s.recv(64).decode()
`, "queued!", "kill -USR1 $P"),
	pyCase("udp", `u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(('127.0.0.1', 7003))
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
def probe():
    v.sendto(b'ping', ('127.0.0.1', 7003))
    u.settimeout(2)
    return u.recv(64).decode() + ' ' + str(u.getsockname()[1])
`, "ping 7003", ""),
	pyCase("itimer", `signal.signal(signal.SIGALRM, lambda *a: None)
signal.setitimer(signal.ITIMER_REAL, 1000, 1000)
def probe():
    v, i = signal.getitimer(signal.ITIMER_REAL)
    return 'armed' if 800 < v <= 1000 and i == 1000 else 'itimer %r %r' % (v, i)
`, "armed", ""),
	pyCase("pending-signal", `signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
os.kill(os.getpid(), signal.SIGUSR2)
def probe():
    return ' '.join(s.name for s in sorted(signal.sigpending()))
`, "SIGUSR2", ""),
	pyCase("terminal", `m, s = os.openpty()
os.write(m, b'typed\n')
time.sleep(0.1)
def probe():
    return '%s %s' % (os.isatty(s), os.ttyname(s).startswith('/dev/pts/'))
`, "True True", ""),
	pyCase("file-lock", `lk = open('/tmp/l', 'w')
fcntl.lockf(lk, fcntl.LOCK_EX)
def probe():
    if os.fork() == 0:
        g = open('/tmp/l', 'w')
        try:
            fcntl.lockf(g, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os._exit(1)
        except OSError:
            os._exit(0)
    _, st = os.wait()
    return 'held' if st == 0 else 'free'
`, "held", ""),
	pyCase("threads", `ts = [threading.Thread(target=time.sleep, args=(10**6,), daemon=True) for _ in range(2)]
for t in ts: t.start()
def probe():
    with open('/proc/self/status') as f:
        return [l.split()[1] for l in f if l.startswith('Threads')][0]
`, "3", ""),
	pyCase("shared-memory", `shm = mmap.mmap(-1, 4096)
shm[:6] = b'shared'
child = os.fork()
if child == 0:
    while True:
        time.sleep(0.01)
        if shm[:1] == b'?':
            shm[:6] = b'answer'
def probe():
    seen = shm[:6]
    shm[:1] = b'?'
    for _ in range(200):
        time.sleep(0.01)
        if shm[:6] == b'answer':
            break
    r = seen.decode() + ' ' + shm[:6].decode()
    shm[:6] = b'shared'
    return r
`, "shared answer", ""),
}

// captureModes forces each capture path of a full checkpoint: frozen
// CRIU copy, copy-on-write and template, the latter two on a tree with a
// 48 MiB heap (cowHolder), above the size they need.
var captureModes = []struct {
	name          string
	noCOW, noTmpl bool
}{
	{capture.Copy, true, true},
	{capture.COW, false, true},
	{capture.Template, false, false},
}

// TestProcessStateConformance runs the table of process states against
// every capture path: the state is made, a full checkpoint taken, the
// state changed, the sandbox rolled back and forked, and the state in
// both must be the one at the checkpoint. A path that cannot take a
// tree must say why (capture_note) and another path takes it. Each path
// has one sandbox, whose case processes are killed between cases.
func TestProcessStateConformance(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	const helpers = `st(){ read -r l < /proc/$1/stat; s=${l##*) }; echo ${s%% *}; }; P=$(cat /tmp/c 2>/dev/null); `
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			m.opts.noCOWCapture, m.opts.noTemplateCapture = mode.noCOW, mode.noTmpl
			// The frozen copy is what small trees get: its tree has no
			// big heap (restores are quicker).
			holder := cowHolder
			if mode.name == capture.Copy {
				holder = "open('/tmp/ready', 'w').close()\nimport time\nwhile True:\n    time.sleep(1)\n"
			}
			sb := pythonSandbox(t, m, holder)
			defer func() { _ = m.Remove(ctx, sb.ID) }()
			base, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
			if err != nil {
				t.Fatal(err)
			}
			if base.Capture != mode.name {
				t.Fatalf("the clean tree was captured %q (%s), want %q", base.Capture, base.CaptureNote, mode.name)
			}
			_ = m.DeleteCheckpoint(ctx, base.ID)
			// Between cases the processes a case started are killed
			// (every process not there now), which costs less than a
			// rollback to the clean checkpoint.
			// With builtins only: a command's own process listed here
			// would spare a case process that reuses its PID.
			run(t, m, sb.ID, `for d in /proc/[0-9]*; do echo ${d#/proc/}; done > /tmp/basepids`)
			for _, c := range stateCases {
				t.Run(c.name, func(t *testing.T) {
					defer run(t, m, sb.ID, `b=" $(tr '\n' ' ' </tmp/basepids) "; for d in /proc/[0-9]*; do p=${d#/proc/}; case "$b" in *" $p "*) continue;; esac; [ "$p" = $$ ] || kill -9 $p 2>/dev/null; done; rm -f /tmp/c /tmp/out`)
					run(t, m, sb.ID, "rm -f /tmp/c; export X=at; "+c.setup)
					for deadline := time.Now().Add(10 * time.Second); run(t, m, sb.ID, "cat /tmp/c 2>/dev/null").Stdout == ""; time.Sleep(20 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("setup wrote no /tmp/c: %s", run(t, m, sb.ID, "cat /tmp/case.err").Stdout)
						}
					}
					probe := func(id string) string {
						return strings.TrimSpace(run(t, m, id, helpers+c.probe).Stdout)
					}
					want := c.want
					if want == "" {
						want = probe(sb.ID)
					}
					ck, err := m.Checkpoint(ctx, sb.ID, v1.CheckpointRequest{Kind: v1.KindFull, Wait: true})
					if c.refused != "" {
						if err == nil || !strings.Contains(err.Error(), c.refused) {
							t.Fatalf("full checkpoint: %v, want a refusal saying %q", err, c.refused)
						}
						if got := probe(sb.ID); got != want {
							t.Errorf("after the refused checkpoint: %q, want %q", got, want)
						}
						return
					}
					if err != nil {
						t.Fatalf("full checkpoint: %v", err)
					}
					t.Logf("state %q captured %s (%s), stall %.1f ms", want, ck.Capture, ck.CaptureNote, ck.StallMS)
					if ck.Capture != mode.name && (mode.name == capture.Copy || ck.CaptureNote == "") {
						t.Fatalf("captured %q with no reason given, want %q", ck.Capture, mode.name)
					}
					run(t, m, sb.ID, helpers+"export X=changed; "+c.mutate)
					if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
						t.Fatalf("rollback: %v", err)
					}
					if r := run(t, m, sb.ID, "echo $X"); r.Stdout != "at\n" {
						t.Fatalf("rollback: session X=%q", r.Stdout)
					}
					if got := probe(sb.ID); got != want {
						t.Errorf("after the rollback: %q, want %q", got, want)
					}
					fr, err := m.Fork(ctx, ck.ID, v1.ForkRequest{})
					if err != nil {
						t.Fatalf("fork: %v", err)
					}
					f := fr.Sandboxes[0].ID
					defer func() { _ = m.Remove(ctx, f) }()
					if got := probe(f); got != want {
						t.Errorf("in the fork: %q, want %q", got, want)
					}
					if err := m.DeleteCheckpoint(ctx, ck.ID); err != nil {
						t.Logf("delete %s: %v", ck.ID, err)
					}
				})
			}
		})
	}
}

// conformanceTree is the tree every capture path takes in
// TestCaptureConformance: a Python process holding 48 MiB of known
// contents (enough for copy-on-write and template captures), a child
// it talks to through a pair of pipes (empty between requests), which
// holds 1 MiB of its own, and a child that writes a numbered line to a
// file every 10 ms. SIGUSR1 to the parent (PID in /tmp/pid) writes the
// tree's state to /tmp/out: its heap's hash, the child's answer through
// the pipes (its memory's hash, its parent), whether the writer's file
// holds exactly the lines it wrote and ends at its file offset (files
// and processes from one instant), and whether both children live.
// SIGUSR2 changes the memory of the parent and the first child.
const conformanceTree = `
import os, signal, time, hashlib, select
heap = bytearray(bytes(range(256)) * (48 << 12))
heap[12345] = 7
parent = os.getpid()
p2c_r, p2c_w = os.pipe()
c2p_r, c2p_w = os.pipe()
child = os.fork()
if child == 0:
    os.close(p2c_w); os.close(c2p_r)
    mem = bytearray(bytes(range(255, -1, -1)) * 4096)
    while True:
        req = os.read(p2c_r, 64)
        if req == b'mutate':
            mem[0] ^= 0xff
            os.write(c2p_w, b'ok')
        else:
            os.write(c2p_w, ('pong parent-ok=%s mem=%s' % (os.getppid() == parent, hashlib.sha256(mem).hexdigest()[:16])).encode())
writer = os.fork()
if writer == 0:
    for fd in (p2c_r, p2c_w, c2p_r, c2p_w):
        os.close(fd)
    out = os.open('/tmp/log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n = 0
    def report(*a):
        off = os.lseek(out, 0, os.SEEK_CUR)
        with open('/tmp/log', 'rb') as f:
            data = f.read()
        want = b''.join(b'%d\n' % i for i in range(1, n + 1))
        r = 'consistent' if data == want and off == len(data) else 'inconsistent: %d lines written, offset %d, file %d bytes' % (n, off, len(data))
        with open('/tmp/w.tmp', 'w') as f:
            f.write(r)
        os.rename('/tmp/w.tmp', '/tmp/w.out')
    signal.signal(signal.SIGUSR1, report)
    while True:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        n += 1
        os.write(out, b'%d\n' % n)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR1])
        time.sleep(0.01)
os.close(p2c_r); os.close(c2p_w)
def ask(req):
    os.write(p2c_w, req)
    r, _, _ = select.select([c2p_r], [], [], 5)
    return os.read(c2p_r, 128).decode() if r else 'no answer'
def probe(*a):
    h = hashlib.sha256(heap).hexdigest()[:16]
    reply = ask(b'ping')
    try:
        os.unlink('/tmp/w.out')
    except FileNotFoundError:
        pass
    os.kill(writer, signal.SIGUSR1)
    w = 'no report'
    for _ in range(500):
        if os.path.exists('/tmp/w.out'):
            with open('/tmp/w.out') as f:
                w = f.read()
            break
        time.sleep(0.01)
    alive = os.waitpid(child, os.WNOHANG)[0] == 0 and os.waitpid(writer, os.WNOHANG)[0] == 0
    with open('/tmp/out.tmp', 'w') as f:
        f.write('heap %s | child %s | writer %s | children alive %s' % (h, reply, w, alive))
    os.rename('/tmp/out.tmp', '/tmp/out')
def mutate(*a):
    heap[0] ^= 0xff
    ask(b'mutate')
signal.signal(signal.SIGUSR1, probe)
signal.signal(signal.SIGUSR2, mutate)
with open('/tmp/pid.tmp', 'w') as f:
    f.write(str(parent))
os.rename('/tmp/pid.tmp', '/tmp/pid')
open('/tmp/ready', 'w').close()
while True:
    signal.pause()
`

// TestCaptureConformance runs every capture path (capture.Plan's
// strategies, forced through the configuration) against the same tree
// (conformanceTree): the path must be the one forced, and the state
// after a rollback and in a fork must be the state at the checkpoint,
// the same for every path.
func TestCaptureConformance(t *testing.T) {
	m := openManager(t)
	requireCRIU(t, m)
	ctx := context.Background()
	probe := func(t *testing.T, id string) string {
		t.Helper()
		r := run(t, m, id, `rm -f /tmp/out; kill -USR1 $(cat /tmp/pid); for i in $(seq 500); do [ -e /tmp/out ] && break; sleep 0.02; done; cat /tmp/out`)
		return strings.TrimSpace(r.Stdout)
	}
	states := map[string]string{}
	for _, mode := range captureModes {
		t.Run(mode.name, func(t *testing.T) {
			m.opts.noCOWCapture, m.opts.noTemplateCapture = mode.noCOW, mode.noTmpl
			defer func() { m.opts.noCOWCapture, m.opts.noTemplateCapture = false, false }()
			sb := pythonSandbox(t, m, conformanceTree)
			defer func() { _ = m.Remove(ctx, sb.ID) }()
			want := probe(t, sb.ID)
			if !strings.Contains(want, "writer consistent") || !strings.Contains(want, "parent-ok=True") || !strings.HasSuffix(want, "alive True") {
				t.Fatalf("the tree is not as made: %s", want)
			}
			ck := fullCaptured(t, m, sb.ID, mode.name)
			t.Logf("captured %s, stall %.1f ms, parts %+v", ck.Capture, ck.StallMS, ck.StallParts)
			run(t, m, sb.ID, "kill -USR2 $(cat /tmp/pid); sleep 0.2")
			if got := probe(t, sb.ID); got == want {
				t.Fatalf("the change after the checkpoint changed nothing: %s", got)
			}
			if _, err := m.RollbackWith(ctx, sb.ID, v1.RollbackRequest{Checkpoint: ck.ID, Tier: v1.TierWarm}); err != nil {
				t.Fatalf("rollback: %v", err)
			}
			got := probe(t, sb.ID)
			if got != want {
				t.Errorf("after the rollback:\n got %s\nwant %s", got, want)
			}
			fr, err := m.Fork(ctx, ck.ID, v1.ForkRequest{})
			if err != nil {
				t.Fatalf("fork: %v", err)
			}
			defer func() { _ = m.Remove(ctx, fr.Sandboxes[0].ID) }()
			if f := probe(t, fr.Sandboxes[0].ID); f != want {
				t.Errorf("in the fork:\n got %s\nwant %s", f, want)
			}
			states[mode.name] = got
		})
	}
	for name, s := range states {
		if ref := states[capture.Copy]; ref != "" && s != ref {
			t.Errorf("%s restored %s, the frozen CRIU dump %s", name, s, ref)
		}
	}
}
