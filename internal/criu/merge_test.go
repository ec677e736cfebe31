package criu

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	pipe_data "github.com/checkpoint-restore/go-criu/v7/crit/images/pipe-data"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/molt-sh/molt/internal/cgroup"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/template"
	"github.com/molt-sh/molt/internal/testutil"
)

// treeScript is the init of a PID namespace with two children: a
// counter holding a heap and a log file it appends to, and a shell
// reading a pipe whose other end the init keeps. argv: a directory.
// The counter writes "count heap-byte" to DIR/count every tick and
// waits between ticks in a busy loop, so that the freeze most often
// finds it outside a system call (see pageAsFile); a file
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
        t0 = time.time()
        while time.time() - t0 < 0.02:  # busy: frozen in its own code
            pass
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
		files, _, err := OpenFiles(pid)
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
	if _, err := tool.Dump(ctx, DumpOptions{Pid: tree.init, ImagesDir: ref, LeaveRunning: true, FreezeCgroup: tree.cg.FreezerDir(), CgroupMode: "ignore"}); err != nil {
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
			Pid: cp, ImagesDir: parts[i].Dir, ShellJob: true, CgroupMode: "ignore",
			External: []string{"pid[" + ino + "]:pidns"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	merged := filepath.Join(work, "merged")
	if err := os.Mkdir(merged, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Merge(merged, parts, MergeOptions{Shared: shared}); err != nil {
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

// imageView is a dump's images in a form two dumps of one tree can be
// compared in: every field by path, with the ids a dump numbers itself
// (files, memory, descriptor tables, page images) replaced by what they
// name.
type imageView map[string]string

func viewOf(t *testing.T, dir string) imageView {
	t.Helper()
	v := imageView{}
	files := map[uint32]string{}
	regPaths := map[uint32]string{}
	ents, err := readImage[*fdinfo.FileEntry](filepath.Join(dir, "files.img"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range ents {
		f = proto.Clone(f).(*fdinfo.FileEntry)
		id := f.GetId()
		if r := f.GetReg(); r != nil {
			regPaths[id] = r.GetName()
		}
		if err := renumberFile(f, 0); err != nil {
			t.Fatal(err)
		}
		files[id] = prototext.MarshalOptions{}.Format(f)
	}
	file := func(id uint32) string {
		s, ok := files[id]
		if !ok {
			t.Fatalf("%s: no file %d", dir, id)
		}
		return s
	}
	ps, err := readImage[*pstree.PstreeEntry](filepath.Join(dir, "pstree.img"))
	if err != nil {
		t.Fatal(err)
	}
	// Which descriptors, across processes, are one open file.
	byFile := map[uint32][]string{}
	for _, e := range ps {
		pid := int(e.GetPid())
		v[fmt.Sprintf("pstree %d", pid)] = prototext.MarshalOptions{}.Format(e)
		path := func(kind string) string { return filepath.Join(dir, fmt.Sprintf("%s-%d.img", kind, pid)) }

		core, err := readOne[*criu_core.CoreEntry](path("core"))
		if err != nil {
			t.Fatal(err)
		}
		flatten(v, fmt.Sprintf("core %d", pid), core.ProtoReflect())

		ids, err := readOne[*criu_core.TaskKobjIdsEntry](path("ids"))
		if err != nil {
			t.Fatal(err)
		}
		fdt, err := readImage[*fdinfo.FdinfoEntry](filepath.Join(dir, fmt.Sprintf("fdinfo-%d.img", ids.GetFilesId())))
		if err != nil {
			t.Fatal(err)
		}
		ids.VmId, ids.FilesId, ids.FsId, ids.SighandId = nil, nil, nil, nil
		flatten(v, fmt.Sprintf("ids %d", pid), ids.ProtoReflect())
		for _, fd := range fdt {
			key := fmt.Sprintf("fd %d:%d", pid, fd.GetFd())
			v[key] = fmt.Sprintf("flags %d type %v file {%s}", fd.GetFlags(), fd.GetType(), file(fd.GetId()))
			byFile[fd.GetId()] = append(byFile[fd.GetId()], key)
		}

		mme, err := readOne[*mm.MmEntry](path("mm"))
		if err != nil {
			t.Fatal(err)
		}
		v[fmt.Sprintf("mm %d exe", pid)] = file(mme.GetExeFileId())
		mme.ExeFileId = nil
		var vmas []*vma.VmaEntry // before the ids go
		for _, area := range mme.GetVmas() {
			vmas = append(vmas, proto.Clone(area).(*vma.VmaEntry))
		}
		for i, vma := range mme.GetVmas() {
			if vma.GetStatus()&(vmaFilePrivate|vmaFileShared) != 0 {
				v[fmt.Sprintf("mm %d vma %d file", pid, i)] = file(uint32(vma.GetShmid()))
				vma.Shmid = nil
			}
		}
		flatten(v, fmt.Sprintf("mm %d", pid), mme.ProtoReflect())

		fse, err := readOne[*fs.FsEntry](path("fs"))
		if err != nil {
			t.Fatal(err)
		}
		v[fmt.Sprintf("fs %d", pid)] = fmt.Sprintf("cwd {%s} root {%s} umask %d", file(fse.GetCwdId()), file(fse.GetRootId()), fse.GetUmask())

		head, pm, err := readPagemap(path("pagemap"))
		if err != nil {
			t.Fatal(err)
		}
		pages, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("pages-%d.img", head.GetPagesId())))
		if err != nil {
			t.Fatal(err)
		}
		// The kernel writes the CPU a process runs on into its rseq
		// area (cpu_id_start and cpu_id, its first 8 bytes) whenever
		// it returns to it on another CPU: between the dump of the
		// frozen tree and the copies, it may have.
		rseq := core.GetThreadCore().GetRseqEntry().GetRseqAbiPointer()
		off := 0
		// Pages by address rather than pagemap entries by index: one
		// page more or less splits or joins entries.
		for _, e := range pm[1:] {
			pe := e.msg.(*pagemap.PagemapEntry)
			for va := pe.GetVaddr(); va < pe.GetVaddr()+uint64(nrPages(pe))*pageSize; va += pageSize {
				key := fmt.Sprintf("page %d %#x", pid, va)
				if pe.GetFlags()&pagePresent == 0 {
					v[key] = fmt.Sprintf("flags %d", pe.GetFlags())
					continue
				}
				if off+pageSize > len(pages) {
					t.Fatalf("%s: pages-%d.img is short", dir, head.GetPagesId())
				}
				page := slices.Clone(pages[off : off+pageSize])
				off += pageSize
				if rseq >= va && rseq+8 <= va+pageSize {
					clear(page[rseq-va : rseq-va+8])
				}
				if sameAsFile(t, vmas, regPaths, va, page) {
					v[key] = pageAsFile
					continue
				}
				v[key] = fmt.Sprintf("flags %d sha256 %x", pe.GetFlags(), sha256.Sum256(page))
			}
		}
		if off != len(pages) {
			t.Fatalf("%s: pages-%d.img holds %d bytes, its pagemap %d", dir, head.GetPagesId(), len(pages), off)
		}
	}
	for _, keys := range byFile {
		if len(keys) > 1 {
			slices.Sort(keys)
			v["shared "+keys[0]] = strings.Join(keys, " ")
		}
	}
	if pd, err := readPipesData(filepath.Join(dir, "pipes-data.img")); err == nil {
		for _, e := range pd {
			d := e.msg.(*pipe_data.PipeDataEntry)
			v[fmt.Sprintf("pipe %d", d.GetPipeId())] = fmt.Sprintf("%d bytes of %d: %q", d.GetBytes(), d.GetSize(), e.extra)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if imagesTakenOnce.MatchString(n.Name()) || clockImages.MatchString(n.Name()) {
			b, err := os.ReadFile(filepath.Join(dir, n.Name()))
			if err != nil {
				t.Fatal(err)
			}
			v["image "+n.Name()] = fmt.Sprintf("sha256 %x", sha256.Sum256(b))
		}
	}
	return v
}

// pageAsFile is the view of a dumped page of a private file mapping
// that holds the file's bytes.
const pageAsFile = "the bytes of its file"

// sameAsFile says whether page, dumped at va, lies in a private mapping
// of a regular file and holds that file's bytes there.
func sameAsFile(t *testing.T, vmas []*vma.VmaEntry, regPaths map[uint32]string, va uint64, page []byte) bool {
	t.Helper()
	for _, area := range vmas {
		if va < area.GetStart() || va >= area.GetEnd() || area.GetStatus()&vmaFilePrivate == 0 {
			continue
		}
		path, ok := regPaths[uint32(area.GetShmid())]
		if !ok {
			return false
		}
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		b := make([]byte, len(page))
		n, err := f.ReadAt(b, int64(area.GetPgoff()+va-area.GetStart()))
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		clear(b[n:]) // past the end of the file, a mapping reads zeros
		return slices.Equal(b, page)
	}
	return false
}

// flatten adds every set field of m to v, by path.
func flatten(v imageView, path string, m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := val.List()
			for i := range l.Len() {
				if fd.Message() != nil {
					flatten(v, fmt.Sprintf("%s[%d]", p, i), l.Get(i).Message())
				} else {
					v[fmt.Sprintf("%s[%d]", p, i)] = l.Get(i).String()
				}
			}
		case fd.Message() != nil:
			flatten(v, p, val.Message())
		default:
			v[p] = val.String()
		}
		return true
	})
}

// mergeDifferences are the only differences a merge may leave from a
// dump of the frozen tree, by field path (the task's PID left out).
var mergeDifferences = map[string]string{
	// The clocks of the time namespace are read at each dump.
	"image timens-0.img": "clocks read at each dump",
	// XSTATE_BV bit 0 says the x87 registers are saved rather than in
	// their initial state: the kernel's copy of the FPU state for the
	// fork sets it. The registers themselves are compared (equal). Only
	// that bit may differ: see compareImages.
	"core.thread_info.fpregs.xsave.xstate_bv": "x87 state saved by the fork",
}

// compareImages compares the direct dump of a frozen tree with the merge
// of its copies' dumps, field by field.
func compareImages(t *testing.T, ref, merged string) {
	t.Helper()
	a, b := viewOf(t, ref), viewOf(t, merged)
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var diffs []string
	for k := range keys {
		if a[k] == b[k] {
			continue
		}
		if _, inRef := a[k]; !inRef && b[k] == pageAsFile {
			// A page of a private file mapping that a copy holds
			// as its own, with the file's bytes: where the copy was
			// stopped outside a system call, a syscall instruction
			// was written over its code and put back
			// (internal/template), which leaves the page private.
			// Restored, it is what the mapping of the file gives.
			continue
		}
		if _, ok := mergeDifferences[pidless.ReplaceAllString(k, "$1")]; ok {
			if !strings.HasSuffix(k, "xstate_bv") || xorIs(a[k], b[k], 1) {
				continue
			}
		}
		diffs = append(diffs, fmt.Sprintf("%s:\n\tdump:   %s\n\tmerged: %s", k, a[k], b[k]))
	}
	slices.Sort(diffs)
	if len(diffs) > 0 {
		t.Errorf("the merged images differ from the dump of the frozen tree in %d fields:\n%s", len(diffs), strings.Join(diffs, "\n"))
	}
	if len(a) < 100 {
		t.Fatalf("only %d fields compared", len(a))
	}
}

// xorIs says whether the numbers a and b differ in exactly the bits of
// mask.
func xorIs(a, b string, mask uint64) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x^y == mask
}

// pidless drops the PID from a view's key.
var pidless = regexp.MustCompile(`^(\w+) \d+`)

// TestMergeRefuses: a merge refuses parts it cannot make a tree of, and
// images it does not know how to combine, with the kind of error that
// sends the caller back to an ordinary dump; it writes nothing.
func TestMergeRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"core-5.img", "tty-info.img"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		parts []MergePart
		want  error
	}{
		{"no parts", nil, errdefs.ErrInvalidArgument},
		{"root not PID 1", []MergePart{{Dir: dir, Pid: 5, As: 7}}, errdefs.ErrInvalidArgument},
		{"parent not earlier", []MergePart{{Dir: dir, Pid: 5, As: 1}, {Dir: dir, Pid: 6, As: 8, Parent: 9}}, errdefs.ErrInvalidArgument},
		{"a terminal's image", []MergePart{{Dir: dir, Pid: 5, As: 1}}, errdefs.ErrNotSupported},
		{"another process's image", []MergePart{{Dir: dir, Pid: 6, As: 1}}, errdefs.ErrNotSupported},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := t.TempDir()
			if err := Merge(dst, c.parts, MergeOptions{}); !errors.Is(err, c.want) {
				t.Fatalf("merge: %v, want %v", err, c.want)
			}
			if ents, _ := os.ReadDir(dst); len(ents) != 0 {
				t.Fatalf("a refused merge wrote %d files", len(ents))
			}
		})
	}
}
