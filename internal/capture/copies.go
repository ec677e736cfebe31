package capture

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/molt-sh/molt/internal/criu"
	"github.com/molt-sh/molt/internal/errdefs"
	"github.com/molt-sh/molt/internal/ns"
	"github.com/molt-sh/molt/internal/pid1"
	"github.com/molt-sh/molt/internal/template"
)

// errNoTemplate is a tree found, once frozen, not to be copyable: the
// checkpoint thaws it and captures it another way.
var errNoTemplate = errors.New("the tree cannot be copied")

// templateObstacle says why the tree of pids (the live tree of init)
// cannot be captured by copies ("" if it can), from what can be
// read before the freeze; copyTree checks what can change again in the
// frozen window, and the dumps check the rest (criu.Merge refuses the
// images it cannot combine). What a fork does not give a copy, or gives
// it shared with the original, rules a tree out: threads (cowObstacle),
// memory shared between processes (cowObstacle: a copy shares it),
// mappings a fork leaves out or empties (MADV_DONTFORK, MADV_WIPEONFORK),
// POSIX timers, file locks, a socket or terminal outside PID 1's
// listening socket (their queues cannot be read without taking them),
// a stopped, traced or zombie process (stateObstacle), what the merge
// cannot combine (unmergeable: deleted files, cwd or root, FIFOs), and
// a pid1 too old to copy itself.
func templateObstacle(init int, pids []int) string {
	// The tree as its processes make it, zombies included (the
	// cgroup's list leaves them out, and a copy cannot be made of one).
	if tree, err := procTree(init); err == nil {
		pids = tree
	}
	for _, pid := range pids {
		if why := stateObstacle(pid, true); why != "" {
			return why
		}
	}
	if why := cowObstacle(pids); why != "" {
		return why
	}
	if !pid1.CanCopy(init) {
		return "the sandbox's pid1 predates copying (restart the sandbox)"
	}
	locks, err := os.ReadFile("/proc/locks")
	if err != nil {
		return err.Error()
	}
	for _, pid := range pids {
		p := "/proc/" + strconv.Itoa(pid)
		if holdsLock(locks, pid) {
			return fmt.Sprintf("pid %d holds a file lock", pid)
		}
		if timers, err := os.ReadFile(p + "/timers"); err != nil || len(timers) > 0 {
			return fmt.Sprintf("pid %d has POSIX timers", pid)
		}
		smaps, err := os.ReadFile(p + "/smaps")
		if err != nil {
			return fmt.Sprintf("pid %d: %v", pid, err)
		}
		if why := forkOmits(smaps); why != "" {
			return fmt.Sprintf("pid %d: %s", pid, why)
		}
		if why := unmergeable(pid, pid == init); why != "" {
			return why
		}
	}
	return ""
}

// procTree lists the tree of init from the processes themselves: init
// and, depth first, the children of each of its threads, zombies
// included (cgroup.procs lists no zombie).
func procTree(init int) ([]int, error) {
	out := []int{init}
	seen := map[int]bool{init: true}
	for i := 0; i < len(out); i++ {
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(out[i]) + "/task")
		if err != nil {
			if i == 0 {
				return nil, err
			}
			continue // gone meanwhile
		}
		for _, t := range tasks {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(out[i]) + "/task/" + t.Name() + "/children")
			for _, f := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(f); err == nil && !seen[n] {
					seen[n] = true
					out = append(out, n)
				}
			}
		}
	}
	return out, nil
}

// stateObstacle says why pid's state keeps its tree from a capture that
// seizes every process (copy-on-write, template): stopped by job
// control or traced (the seizure waits for a stop that never comes, and
// a copy would run), or, for copies (template), a zombie, of which no
// copy can be made.
func stateObstacle(pid int, copies bool) string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	switch s[i+2] {
	case 'T':
		return fmt.Sprintf("pid %d is stopped (job control)", pid)
	case 't':
		return fmt.Sprintf("pid %d is traced", pid)
	case 'Z', 'X':
		if copies {
			return fmt.Sprintf("pid %d is a zombie", pid)
		}
	}
	return ""
}

// unmergeable says why a dump of pid's copy would hold images the merge
// cannot combine (criu.Merge): its open files (fdObstacle), a FIFO (its
// queue is shared with the original, and reading it from outside would
// count as a reader), a deleted working directory or root, or a mapped
// file that is deleted (CRIU keeps those as ghost files).
func unmergeable(pid int, init bool) string {
	if why := fdObstacle(pid, init); why != "" {
		return why
	}
	p := "/proc/" + strconv.Itoa(pid)
	for _, l := range []string{"cwd", "root"} {
		if target, err := os.Readlink(p + "/" + l); err == nil && strings.HasSuffix(target, " (deleted)") {
			return fmt.Sprintf("pid %d's %s is deleted (%s)", pid, l, target)
		}
	}
	maps, err := os.ReadFile(p + "/maps")
	if err != nil {
		return fmt.Sprintf("pid %d: %v", pid, err)
	}
	for line := range strings.Lines(string(maps)) {
		if f := strings.Fields(line); len(f) >= 6 && strings.HasPrefix(f[5], "/") && strings.HasSuffix(strings.TrimSpace(line), " (deleted)") {
			return fmt.Sprintf("pid %d maps a deleted file (%s)", pid, strings.Join(f[5:], " "))
		}
	}
	return ""
}

// holdsLock says whether /proc/locks lists a lock held by pid.
func holdsLock(locks []byte, pid int) bool {
	for line := range strings.Lines(string(locks)) {
		// "1: POSIX  ADVISORY  WRITE 1234 00:2a:123 0 EOF"
		f := strings.Fields(line)
		if len(f) >= 5 && f[4] == strconv.Itoa(pid) {
			return true
		}
	}
	return false
}

// forkOmits names a mapping of smaps that a fork leaves out of the child
// (MADV_DONTFORK: "dc") or empties in it (MADV_WIPEONFORK: "wf").
func forkOmits(smaps []byte) string {
	for line := range strings.Lines(string(smaps)) {
		flags, ok := strings.CutPrefix(line, "VmFlags:")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(flags) {
			switch f {
			case "dc":
				return "a mapping is not copied by fork (MADV_DONTFORK)"
			case "wf":
				return "a mapping is emptied by fork (MADV_WIPEONFORK)"
			}
		}
	}
	return ""
}

// fdObstacle says why pid's open files keep it from being copied: a
// socket (but PID 1's, its listening socket), a terminal, or a kind of
// file the merge does not combine.
func fdObstacle(pid int, init bool) string {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("pid %d: %v", pid, err)
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		switch {
		case strings.HasPrefix(target, "pipe:"),
			target == "anon_inode:[signalfd]", target == "anon_inode:[eventfd]",
			target == "anon_inode:[eventpoll]", target == "anon_inode:[timerfd]":
		case strings.HasPrefix(target, "socket:") && init:
		case strings.HasPrefix(target, "/dev/pts/"), strings.HasPrefix(target, "/dev/tty"), target == "/dev/console":
			return fmt.Sprintf("pid %d has a terminal open (%s)", pid, target)
		case strings.HasPrefix(target, "/") && !strings.HasSuffix(target, " (deleted)"):
			var st unix.Stat_t
			if unix.Stat(filepath.Join(dir, e.Name()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO {
				return fmt.Sprintf("pid %d has a FIFO open (%s)", pid, target)
			}
		default:
			return fmt.Sprintf("pid %d has %s open", pid, target)
		}
	}
	return ""
}

// treeCopy is a tree copied in the frozen window, waiting for its dumps.
type treeCopy struct {
	tracer *template.Tracer // holds the copies of all but PID 1
	parts  []criu.MergePart // As, Parent, Flags and Files, read frozen
	copies []int            // host PIDs of the copies, as parts
	pidfds []int            // a pidfd of each copy (-1: none), as copies
	pidns  uint64           // the tree's PID namespace (inode)
	maps   [][]uint64       // each original's mappings (starts), read frozen
	closed bool
}

// hold records the copy at index i, with a pidfd of it: close signals
// and waits through the pidfd, never by PID. A dumped copy is killed by
// CRIU and reaped by pid1, and its PID is free at once (pid_max is
// 32768 on a small host, and PIDs come round within seconds under
// load): a kill by that PID could reach any process, another sandbox's
// copy in the middle of its own dump among them.
func (c *treeCopy) hold(i, pid int) {
	if c.pidfds == nil {
		c.pidfds = make([]int, len(c.copies))
		for j := range c.pidfds {
			c.pidfds[j] = -1
		}
	}
	c.copies[i] = pid
	if pid > 0 {
		if fd, err := unix.PidfdOpen(pid, 0); err == nil {
			c.pidfds[i] = fd
		}
	}
}

// close kills the copies still there and waits (a second at most) for
// their parents to reap them: the next capture must not find them in
// the tree. It may be called again.
func (c *treeCopy) close() {
	if c == nil || c.closed {
		return
	}
	c.closed = true
	c.tracer.Close()
	for _, fd := range c.pidfds {
		if fd >= 0 {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		}
	}
	// Signal 0 through a pidfd fails once the process is reaped (a
	// zombie still takes it).
	deadline := time.Now().Add(time.Second)
	for _, fd := range c.pidfds {
		for fd >= 0 && unix.PidfdSendSignal(fd, 0, nil, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
	}
	for _, fd := range c.pidfds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// frozenProc is what copyTree reads of one process while frozen.
type frozenProc struct {
	host, ns, parentHost int
	flags                uint32
	files                map[int]criu.FileAt
	maps                 []uint64
}

// readFrozen reads what a copy does not carry of pid, and says why the
// tree cannot be copied ("") if pid stands in the way: a zombie, a
// signal pending (a copy has none), a pipe with data in it (pipes are
// shared with the original, which reads and writes them on after the
// thaw). Pipes already in checked (by their /proc name) are not checked
// again; those checked are added.
func readFrozen(pid int, init bool, checked map[string]bool) (frozenProc, string, error) {
	fp := frozenProc{host: pid}
	p := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(p + "/stat")
	if err != nil {
		return fp, "", err
	}
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 7 {
		return fp, "", fmt.Errorf("stat of %d: %q", pid, s)
	}
	switch f[0] {
	case "Z", "X":
		return fp, fmt.Sprintf("pid %d is a zombie", pid), nil
	case "T":
		return fp, fmt.Sprintf("pid %d is stopped (job control)", pid), nil
	case "t":
		return fp, fmt.Sprintf("pid %d is traced", pid), nil
	}
	// What the merge cannot combine may have appeared since the check
	// before the freeze; found now, the tree is dumped frozen instead.
	if why := unmergeable(pid, init); why != "" {
		return fp, why, nil
	}
	fp.parentHost, _ = strconv.Atoi(f[1])
	flags, err := strconv.ParseUint(f[6], 10, 32)
	if err != nil {
		return fp, "", fmt.Errorf("stat of %d: %w", pid, err)
	}
	fp.flags = uint32(flags)
	status, err := os.ReadFile(p + "/status")
	if err != nil {
		return fp, "", err
	}
	for line := range strings.Lines(string(status)) {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "NSpid":
			nf := strings.Fields(v)
			fp.ns, _ = strconv.Atoi(nf[len(nf)-1])
		case "SigPnd", "ShdPnd":
			mask, _ := strconv.ParseUint(v, 16, 64)
			if init {
				// pid1 takes SIGCHLD and its copy signal from its
				// signalfd after the thaw, before it copies itself.
				mask &^= 1<<(unix.SIGCHLD-1) | 1<<(pid1.CopySignal-1)
			}
			if mask != 0 {
				return fp, fmt.Sprintf("pid %d has signals pending (%s %s)", pid, k, v), nil
			}
		}
	}
	var pipes map[int]string
	if fp.files, pipes, err = criu.OpenFiles(pid); err != nil {
		return fp, "", err
	}
	for fd, name := range pipes {
		if checked[name] {
			continue
		}
		checked[name] = true
		if n, err := pipeBytes(filepath.Join(p, "fd", strconv.Itoa(fd))); err != nil {
			return fp, "", err
		} else if n > 0 {
			return fp, fmt.Sprintf("pid %d: a pipe holds %d bytes", pid, n), nil
		}
	}
	maps, err := os.ReadFile(p + "/maps")
	if err != nil {
		return fp, "", err
	}
	for line := range strings.Lines(string(maps)) {
		// The kernel's own areas, which a fork always gives (and CRIU
		// takes [vvar] and [vvar_vclock] as one): see
		// criu.MappingStarts.
		if strings.Contains(line, " [vdso]") || strings.Contains(line, " [vvar") || strings.Contains(line, " [vsyscall]") {
			continue
		}
		start, _, _ := strings.Cut(line, "-")
		if v, err := strconv.ParseUint(start, 16, 64); err == nil {
			fp.maps = append(fp.maps, v)
		}
	}
	return fp, "", nil
}

// pipeBytes returns how many bytes the pipe that link names holds.
func pipeBytes(link string) (int, error) {
	fd, err := unix.Open(link, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		// The write end of a pipe opens read-only too (pipefs); a pipe
		// gone meanwhile is empty.
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("open %s: %w", link, err)
	}
	defer unix.Close(fd)
	n, err := unix.IoctlGetInt(fd, unix.TIOCINQ) // FIONREAD
	if err != nil {
		return 0, fmt.Errorf("FIONREAD %s: %w", link, err)
	}
	return n, nil
}

// copyTree captures the sandbox's tree by copies: it freezes the cgroup,
// reads what the copies will not carry, seizes every process but PID 1,
// thaws (each stops for the tracer), has pid1 copy itself and copies the
// others, freezes again and lets the originals go to the freezer. The
// root's read-only snapshot runs meanwhile; its result arrives on
// snapped. The cgroup is left frozen. A tree found not copyable in the
// window fails with errNoTemplate (the cgroup frozen, nothing copied).
func copyTree(ctx context.Context, t *Target, outside int, capt *state) (freezeStart time.Time, snapped chan error, tc *treeCopy, err error) {
	init, cg := t.Pid, t.Cgroup
	freezeStart = time.Now()
	capt.watch.Arm("the freeze")
	if err := cg.Freeze(ctx); err != nil {
		return freezeStart, nil, nil, err
	}
	capt.watch.Enter("the template copy (ptrace)")
	if outside&unix.CLONE_NEWIPC != 0 {
		if inUse, err := sysvIPCInUse(init); err != nil {
			return freezeStart, nil, nil, err
		} else if inUse {
			return freezeStart, nil, nil, errIPCAppeared
		}
	}
	procs, byHost, err := readTree(init)
	if err != nil {
		return freezeStart, nil, nil, err
	}
	var pidns unix.Stat_t
	if err := unix.Stat("/proc/"+strconv.Itoa(init)+"/ns/pid", &pidns); err != nil {
		return freezeStart, nil, nil, err
	}
	tc = &treeCopy{tracer: template.NewTracer(), pidns: pidns.Ino}
	for i, p := range procs {
		part := criu.MergePart{As: p.ns, Flags: p.flags, Files: p.files}
		if i > 0 {
			part.Parent = byHost[p.parentHost].ns // reached from it above
		}
		tc.parts = append(tc.parts, part)
		tc.maps = append(tc.maps, p.maps)
	}
	defer func() {
		if err != nil {
			tc.close()
			tc = nil
		}
	}()
	t0 := time.Now()
	rest := make([]int, 0, len(procs)-1)
	for _, p := range procs[1:] {
		rest = append(rest, p.host)
	}
	for _, pid := range rest {
		if err := tc.tracer.Seize(pid); err != nil {
			return freezeStart, nil, tc, err
		}
	}
	before := childrenOf(init)
	if err := cg.Thaw(); err != nil {
		return freezeStart, nil, tc, err
	}
	refreeze := func(err error) error {
		if ferr := cg.Freeze(ctx); ferr != nil {
			err = errors.Join(err, ferr)
		}
		for _, pid := range rest {
			if rerr := tc.tracer.Release(pid); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
		return err
	}
	// What a fork would not carry over, read from the stopped originals
	// (pid1, molt's own, sets none of it).
	for _, pid := range rest {
		why, err := tc.tracer.NotInherited(pid)
		if err == nil && why != "" {
			err = fmt.Errorf("%w: %s", errNoTemplate, why)
		} else if errors.Is(err, errdefs.ErrUnavailable) {
			// It did not stop for the tracer (stopped or traced since
			// the checks): dumped frozen instead, at the same instant.
			err = fmt.Errorf("%w: %v", errNoTemplate, err)
		}
		if err != nil {
			return freezeStart, nil, tc, refreeze(err)
		}
	}
	// Nothing of the tree runs until the second freeze (pid1 only copies
	// itself and reaps): the snapshot can start now, next to the copies.
	snapped = startSnapshot(t.Snapshot, capt)
	if err := unix.Kill(init, pid1.CopySignal); err != nil {
		return freezeStart, snapped, tc, refreeze(fmt.Errorf("ask pid1 for its copy: %w", err))
	}
	tc.copies = make([]int, len(procs))
	for i, pid := range rest {
		// A copy is pid1's child, whatever its original's parent: pid1
		// reaps any child, and another parent waiting for any child
		// (wait(-1)) would take the copy's stop or end for one of its
		// own. A child of init gets there by CLONE_PARENT; deeper, the
		// copy is orphaned to it (no subreaper in the tree:
		// NotInherited).
		copyOf := tc.tracer.CopyOrphan
		if procs[i+1].parentHost == init {
			copyOf = func(pid int) (int, error) { return tc.tracer.Copy(pid, true) }
		}
		cp, cerr := copyOf(pid)
		if cerr != nil {
			err = fmt.Errorf("copy of %d: %w", pid, cerr)
			break
		}
		tc.hold(i+1, cp)
	}
	// pid1's copy, even after a failure: it goes with the others. Held
	// like them, it dies with the daemon should the daemon die first.
	cp, werr := waitCopy(init, before, tc.copies)
	tc.hold(0, cp)
	if werr == nil {
		t.crash("template:copied")
		werr = tc.tracer.Adopt(cp)
	}
	err = refreeze(errors.Join(err, werr))
	if err == nil {
		err = noneStarted(init, before, tc.copies)
	}
	capt.parts.CopyMS = ms(time.Since(t0))
	return freezeStart, snapped, tc, err
}

// readTree reads the frozen tree of init (readFrozen): its processes,
// init first, then parents before children as the merge wants them,
// and each by host PID. A tree that cannot be copied fails with
// errNoTemplate.
func readTree(init int) ([]frozenProc, map[int]frozenProc, error) {
	// From the processes, not the cgroup's list: a zombie must be seen
	// (readFrozen refuses it), or it would be missing from the images.
	pids, err := procTree(init)
	if err != nil {
		return nil, nil, err
	}
	byHost := map[int]frozenProc{}
	children := map[int][]int{}
	pipes := map[string]bool{}
	for _, pid := range pids {
		fp, why, err := readFrozen(pid, pid == init, pipes)
		if err != nil {
			return nil, nil, err
		}
		if why != "" {
			return nil, nil, fmt.Errorf("%w: %s", errNoTemplate, why)
		}
		byHost[pid] = fp
		children[fp.parentHost] = append(children[fp.parentHost], pid)
	}
	// init first, then parents before children, as the merge wants them.
	procs := make([]frozenProc, 0, len(pids))
	if fp, ok := byHost[init]; ok && fp.ns == 1 {
		procs = append(procs, fp)
	}
	for i := 0; i < len(procs); i++ {
		kids := children[procs[i].host]
		slices.Sort(kids)
		for _, k := range kids {
			procs = append(procs, byHost[k])
		}
	}
	if len(procs) != len(pids) {
		return nil, nil, fmt.Errorf("%w: %d of the tree's %d processes do not descend from its init", errNoTemplate, len(pids)-len(procs), len(pids))
	}
	return procs, byHost, nil
}

// noneStarted checks, with the tree frozen again, that init's children
// are those it had at the first freeze (before) and copies: pid1 ran
// between the two (it copied itself), and a process it started before
// its copy (a request served then) would be known to its copy but
// missing from the images. Only pid1 can have started one: the others
// were stopped by the tracer.
func noneStarted(init int, before map[int]bool, copies []int) error {
	for pid := range childrenOf(init) {
		if !before[pid] && !slices.Contains(copies, pid) {
			return fmt.Errorf("process %d started in the sandbox during the capture: try again", pid)
		}
	}
	return nil
}

// childrenOf lists pid's children (host PIDs).
func childrenOf(pid int) map[int]bool {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	out := map[int]bool{}
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out[n] = true
		}
	}
	return out
}

// waitCopy waits for pid1's copy of itself: a child of init, new since
// before and not one of copies, stopped.
func waitCopy(init int, before map[int]bool, copies []int) (int, error) {
	deadline := time.Now().Add(time.Second)
	for spin := 0; ; spin++ {
		for pid := range childrenOf(init) {
			if before[pid] || slices.Contains(copies, pid) {
				continue
			}
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				s := string(st)
				if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) && s[i+2] == 'T' {
					return pid, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("pid1 made no copy of itself within a second")
		}
		if spin > 200 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// dumpCopies dumps each copy of tc on its own, in the sandbox's
// namespaces of the types in outside as the tree's dumps are, and merges
// the dumps into staging. The copies are gone after.
func dumpCopies(ctx context.Context, t *Target, tc *treeCopy, outside int) error {
	defer tc.close()
	if err := t.fail("full:copies"); err != nil {
		return err
	}
	t.crash("template:dumping")
	tool, staging, work := t.Tool, t.Staging, t.Work
	shared, err := criu.SharedFiles(tc.copies)
	if err != nil {
		return err
	}
	var nss []ns.Ref
	if outside != 0 {
		if nss, err = ns.Open(t.Pid, outside); err != nil {
			return err
		}
		defer ns.Close(nss)
	}
	ext := fmt.Sprintf("pid[%d]:molt-pidns", tc.pidns)
	for i, cp := range tc.copies {
		part := &tc.parts[i]
		if part.Pid, err = template.NSPid(cp); err != nil {
			return fmt.Errorf("copy of %d: %w", part.As, err)
		}
		part.Dir = filepath.Join(work, "copy-"+strconv.Itoa(part.As))
		if err := os.Mkdir(part.Dir, 0o700); err != nil {
			return err
		}
		// Held by the tracer until now: a copy in a ptrace stop does not
		// run on a SIGCONT from the sandbox. Let go, it stops at once
		// (the SIGSTOP queued at its birth; pid1's stopped itself).
		was := copyState(cp)
		if err := tc.tracer.Detach(cp); err != nil {
			return err
		}
		if _, err := tool.Dump(ctx, criu.DumpOptions{
			Pid: cp, ImagesDir: part.Dir, ShellJob: true, External: []string{ext},
			FileLocks: true, CgroupMode: "ignore", NetworkLock: NetworkLock, Namespaces: nss, LogLevel: t.LogLevel,
		}); err != nil {
			// What the copy was and is, for a copy gone before CRIU
			// took it (docs/testing.md, Known flaky).
			oom, oerr := t.Cgroup.OOMKills()
			if oerr != nil {
				oom = -1
			}
			return fmt.Errorf("dump the copy of %d (before the dump: %s; now: %s; OOM kills in the sandbox: %d): %w", part.As, was, copyState(cp), oom, err)
		}
		// CRIU killed the copy; close waits for pid1 to reap it, so that
		// the next capture finds no zombie in the tree.
	}
	if err := criu.Merge(staging, tc.parts, criu.MergeOptions{Shared: shared, EmptyPipes: true}); err != nil {
		return err
	}
	return checkMappings(staging, tc)
}

// checkMappings checks that every merged process maps what its
// original mapped at the instant: a fork leaves out a mapping marked
// MADV_DONTFORK, which templateObstacle looked for before the freeze but
// a process could have marked since.
func checkMappings(images string, tc *treeCopy) error {
	for i, p := range tc.parts {
		starts, err := criu.MappingStarts(images, p.As)
		if err != nil {
			return err
		}
		if !slices.Equal(starts, tc.maps[i]) {
			return fmt.Errorf("the copy of %d maps %d areas, the original %d at the instant", p.As, len(starts), len(tc.maps[i]))
		}
	}
	return nil
}

// Traced says which process of init's tree is traced ("" if
// none): CRIU seizes every process with ptrace, which a traced one
// refuses, so no capture path can take the tree (the tracer, a
// debugger say, must let go first).
func Traced(init int) string {
	tree, err := procTree(init)
	if err != nil {
		return ""
	}
	for _, pid := range tree {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "TracerPid:"); ok {
				// The daemon's own tracer lets go of what it held for
				// an earlier capture (a copy on its way out) by itself.
				if v = strings.TrimSpace(v); v != "0" && v != strconv.Itoa(os.Getpid()) {
					return fmt.Sprintf("pid %d is traced by pid %s (ptrace): a full checkpoint cannot seize it", pid, v)
				}
			}
		}
	}
	return ""
}

// copyState describes pid for an error: its state and the signals
// pending, blocked and ignored, from /proc/PID/status.
func copyState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "gone"
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		switch k {
		case "State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "TracerPid":
			if ok {
				out = append(out, k+" "+strings.TrimSpace(v))
			}
		}
	}
	return strings.Join(out, ", ")
}
