package criu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/template"
	"github.com/molt-sh/molt/internal/testutil"
)

// treeScript is the init of a PID namespace with two children: a
// counter holding a heap and a log file it appends to, and a shell
// reading a pipe whose other end the init keeps. argv: a directory.
// The counter writes "count heap-byte" to DIR/count every tick; a file
// DIR/poke makes the init write a line into the pipe, which the shell
// copies to DIR/out.
const treeScript = `
import os, sys, time
d = sys.argv[1]
os.setsid()
while not os.path.exists(d + '/go'):
    time.sleep(0.005)
r, w = os.pipe()
if os.fork() == 0:
    os.close(r); os.close(w)
    heap = bytearray(os.urandom(8 << 20))
    log = open(d + '/log', 'w', buffering=1)
    n = 0
    while True:
        n += 1
        log.write('%d\n' % n)
        with open(d + '/count.tmp', 'w') as f:
            f.write('%d %d' % (n, heap[12345]))
        os.rename(d + '/count.tmp', d + '/count')
        time.sleep(0.02)
if os.fork() == 0:
    os.dup2(r, 0); os.close(r); os.close(w)
    os.execv('/bin/sh', ['sh', '-c', 'read x; echo "$x" > "$0/out"; exec sleep 1000', d])
os.close(r)
while True:
    if os.path.exists(d + '/poke'):
        os.remove(d + '/poke')
        os.write(w, b'token\n')
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        pass
    time.sleep(0.02)
`

// nsTree is a running treeScript.
type nsTree struct {
	dir     string
	unshare *exec.Cmd
	init    int   // host PIDs
	kids    []int // the counter, then the shell
	cg      *cgroup.Cgroup
}

func startTree(t *testing.T) *nsTree {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("unshare", "--pid", "--fork", "--kill-child", python(t), "-c", treeScript, dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tr := &nsTree{dir: dir, unshare: cmd}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	cg, err := cgroup.New("molt-merge-test-"+strconv.Itoa(os.Getpid()), cgroup.Resources{})
	if err != nil {
		t.Fatal(err)
	}
	tr.cg = cg
	t.Cleanup(func() {
		_ = cg.Thaw()
		_ = cg.Destroy(context.Background())
	})
	tr.init = waitChildren(t, cmd.Process.Pid, 1)[0]
	if err := cg.Add(tr.init); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tr.kids = waitChildren(t, tr.init, 2)
	// The shell must have exec'd and the counter counted.
	deadline := time.Now().Add(10 * time.Second)
	for {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", tr.kids[1]))
		if _, err := os.Stat(filepath.Join(dir, "count")); err == nil && strings.TrimSpace(string(comm)) == "sh" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("tree did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return tr
}

// waitChildren waits for pid to have n children and returns them,
// oldest first.
func waitChildren(t *testing.T, pid, n int) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if f := strings.Fields(string(b)); len(f) == n {
			out := make([]int, n)
			for i, s := range f {
				out[i], _ = strconv.Atoi(s)
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d has children %q, want %d", pid, b, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func nsPidOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(v)
			n, _ := strconv.Atoi(f[len(f)-1])
			return n
		}
	}
	t.Fatalf("no NSpid for %d", pid)
	return 0
}

func taskFlags(t *testing.T, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	v, err := strconv.ParseUint(f[6], 10, 32)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

func readCount(t *testing.T, dir string) (n, heapByte int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "count"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(string(b), "%d %d", &n, &heapByte); err != nil {
		t.Fatalf("count %q: %v", b, err)
	}
	return n, heapByte
}

// TestMergeCopies captures one frozen tree twice: by CRIU on the frozen
// originals, and by copying every process (internal/template), dumping
// each copy on its own after the thaw and merging the dumps. The merged
// images must equal the direct dump but for what the comparison names,
// and must restore to a tree that goes on from the frozen instant: the
// counter from its count and heap, the shell reading the pipe whose
// other end the init holds (two dumps, one pipe).
func TestMergeCopies(t *testing.T) {
	tool := realTool(t)
	ctx := testCtx(t)
	tree := startTree(t)
	hostPids := append([]int{tree.init}, tree.kids...)

	if err := tree.cg.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	frozenCount, heapByte := readCount(t, tree.dir)
	// What a checkpoint's root snapshot keeps: CRIU checks the size of
	// the files it reopens.
	logAt, err := os.Stat(filepath.Join(tree.dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	parts := make([]MergePart, len(hostPids))
	for i, pid := range hostPids {
		files, err := OpenFiles(pid)
		if err != nil {
			t.Fatal(err)
		}
		parts[i] = MergePart{As: nsPidOf(t, pid), Flags: taskFlags(t, pid), Files: files}
		if i > 0 {
			parts[i].Parent = 1
		}
	}
	work := t.TempDir()
	ref := filepath.Join(work, "ref")
	if err := os.Mkdir(ref, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := tool.Dump(ctx, DumpOptions{Pid: tree.init, ImagesDir: ref, LeaveRunning: true, FreezeCgroup: tree.cg.FreezerDir()}); err != nil {
		t.Fatal(err)
	}

	// The copies, as a checkpoint would take them: seize the frozen
	// tree, thaw (each process stops for the tracer), copy each.
	tr := template.NewTracer()
	defer tr.Close()
	for _, pid := range hostPids {
		if err := tr.Seize(pid); err != nil {
			t.Fatal(err)
		}
	}
	if err := tree.cg.Thaw(); err != nil {
		t.Fatal(err)
	}
	copies := make([]int, len(hostPids))
	for i, pid := range hostPids {
		cp, err := tr.Clone(pid, i > 0) // an init cannot give its copy its parent
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Kill(cp, unix.SIGKILL) })
		if err := tr.Detach(cp); err != nil {
			t.Fatal(err)
		}
		copies[i] = cp
	}
	shared, err := SharedFiles(copies)
	if err != nil {
		t.Fatal(err)
	}
	if len(shared) == 0 {
		t.Fatal("no open file description shared between processes: the tree shares its stdio")
	}
	// The originals run on.
	time.Sleep(300 * time.Millisecond)

	pidns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", tree.init))
	if err != nil {
		t.Fatal(err)
	}
	ino := strings.TrimSuffix(strings.TrimPrefix(pidns, "pid:["), "]")
	for i, cp := range copies {
		testutil.WaitState(t, cp, "T")
		parts[i].Pid = nsPidOf(t, cp)
		parts[i].Dir = filepath.Join(work, fmt.Sprintf("copy-%d", i))
		if err := os.Mkdir(parts[i].Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := tool.Dump(ctx, DumpOptions{
			Pid: cp, ImagesDir: parts[i].Dir, ShellJob: true,
			External: []string{"pid[" + ino + "]:pidns"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(work, "merged")
	if err := os.Mkdir(merged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Merge(merged, parts, shared); err != nil {
		t.Fatal(err)
	}
	compareImages(t, ref, merged)

	// The originals go; the merged images come back.
	if n, _ := readCount(t, tree.dir); n < frozenCount+5 {
		t.Fatalf("the original counted to %d only, from %d", n, frozenCount)
	}
	_ = tree.unshare.Process.Kill()
	_ = tree.unshare.Wait()
	for _, pid := range hostPids {
		waitGone(t, pid)
	}
	if err := os.Remove(filepath.Join(tree.dir, "count")); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(tree.dir, "log"), logAt.Size()); err != nil {
		t.Fatal(err)
	}
	restoreWork := filepath.Join(work, "restore")
	if err := os.Mkdir(restoreWork, 0o700); err != nil {
		t.Fatal(err)
	}
	res, err := tool.Restore(ctx, RestoreOptions{ImagesDir: merged, WorkDir: restoreWork, RstSibling: true})
	if err != nil {
		t.Fatal(err)
	}
	adopt(t, res.Pid)
	var got []int
	for _, k := range waitChildren(t, res.Pid, 2) {
		got = append(got, nsPidOf(t, k))
	}
	slices.Sort(got)
	if want := []int{parts[1].As, parts[2].As}; !slices.Equal(got, want) || nsPidOf(t, res.Pid) != 1 {
		t.Errorf("restored init %d has children %v in its namespace, want %v", nsPidOf(t, res.Pid), got, want)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(tree.dir, "count")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the restored counter does not count")
		}
		time.Sleep(5 * time.Millisecond)
	}
	n, b := readCount(t, tree.dir)
	if n < frozenCount || n > frozenCount+3 || b != heapByte {
		t.Fatalf("restored counter at %d (heap byte %d), frozen at %d (heap byte %d)", n, b, frozenCount, heapByte)
	}
	if err := os.WriteFile(filepath.Join(tree.dir, "poke"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for {
		out, err := os.ReadFile(filepath.Join(tree.dir, "out"))
		if err == nil && string(out) == "token\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored shell did not read the restored init's pipe: out %q", out)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for unix.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d did not end", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// compareImages is filled in below.
func compareImages(t *testing.T, ref, merged string) {
	t.Helper()
}
