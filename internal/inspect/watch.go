package inspect

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Watch records the effects of one sandbox, turn by turn.
type Watch struct {
	in    *Inspector
	cgid  uint64
	level int
	dir   string

	cutMu sync.Mutex // serialises Cut

	// Guarded by in.mu: what the kernel map holds.
	pidns  uint64
	gen    uint32 // generation of the open turn as the kernel sees it
	closed bool

	// Guarded by mu: what the reader accumulated.
	mu sync.Mutex
	// Oldest generation not yet returned by Cut.
	openGen uint32           // +checklocks:mu
	turns   map[uint32]*turn // +checklocks:mu
	// Tgid -> shared writable file mappings (path -> fs).
	maps map[int]map[string]string // +checklocks:mu
	// Tgids holding io_uring instances.
	uring map[int]bool // +checklocks:mu
	// State at the start of the open turn: Cut, which holds cutMu,
	// moves it on.
	// +checklocks:mu
	// +checklocks:cutMu
	mapsAtStart map[string]string
	// +checklocks:mu
	// +checklocks:cutMu
	uringAtStart bool
	// +checklocks:mu
	// +checklocks:cutMu
	lostSeen uint64
	// +checklocks:mu
	// +checklocks:cutMu
	missSeen uint64
}

// Watch starts recording for the sandbox whose cgroup2 directory is
// cgroupDir and whose live process tree is in the pid namespace of pid.
// Tasks in descendant cgroups of cgroupDir count too.
func (in *Inspector) Watch(cgroupDir string, pid int) (*Watch, error) {
	cgid, level, err := cgroupID(cgroupDir)
	if err != nil {
		return nil, err
	}
	ns, err := pidNS(pid)
	if err != nil {
		return nil, err
	}
	w := &Watch{
		in:    in,
		cgid:  cgid,
		level: level,
		dir:   cgroupDir,
		pidns: ns,
		turns: make(map[uint32]*turn),
		maps:  make(map[int]map[string]string),
		uring: make(map[int]bool),
	}

	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return nil, ErrClosed
	}
	if _, dup := in.watches[cgid]; dup {
		return nil, fmt.Errorf("inspect: cgroup %s is already watched", cgroupDir)
	}
	if err := in.attachLocked(); err != nil {
		return nil, err
	}
	// A watch that fails below leaves the programs detached if it was
	// the only one.
	defer func() {
		if len(in.watches) == 0 {
			in.detachLocked()
		}
	}()
	w.gen = in.nextGen
	in.nextGen++
	w.openGen = w.gen
	w.missSeen = in.recursionMisses()
	if err := in.objs.Drops.Update(cgid, uint64(0), ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("inspect: initialising drop counter: %w", err)
	}
	in.watches[cgid] = w
	if err := in.updateLevelsLocked(); err != nil {
		delete(in.watches, cgid)
		return nil, fmt.Errorf("inspect: updating cgroup levels: %w", err)
	}
	if err := w.pushLocked(); err != nil {
		delete(in.watches, cgid)
		in.updateLevelsLocked()
		return nil, err
	}
	return w, nil
}

// pushLocked writes the watch's state to the kernel. Caller holds in.mu.
func (w *Watch) pushLocked() error {
	v := inspectWatchVal{Pidns: w.pidns, Gen: w.gen}
	if err := w.in.objs.Watched.Update(w.cgid, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("inspect: updating watched map: %w", err)
	}
	return nil
}

// SetTree tells the watch that the sandbox's live process tree is now in
// the pid namespace of pid (after a rollback or restore). Processes in the
// previous namespace stop counting.
func (w *Watch) SetTree(pid int) error {
	ns, err := pidNS(pid)
	if err != nil {
		return err
	}
	w.in.mu.Lock()
	defer w.in.mu.Unlock()
	if w.closed || w.in.closed {
		return ErrClosed
	}
	w.pidns = ns
	return w.pushLocked()
}

// Cut returns the effects recorded since the previous Cut (or since Watch)
// and starts a new turn. Everything the sandbox committed before Cut was
// called is included; in particular all effects of a process that finished
// before the call.
func (w *Watch) Cut(ctx context.Context) (Effects, error) {
	w.cutMu.Lock()
	defer w.cutMu.Unlock()

	in := w.in
	in.mu.Lock()
	if w.closed {
		in.mu.Unlock()
		return Effects{}, ErrClosed
	}
	// New turn first: events emitted from now on carry the new
	// generation and are kept for the next Cut even if the reader sees
	// them before the barrier completes.
	closing := w.gen
	w.gen = in.nextGen
	in.nextGen++
	if err := w.pushLocked(); err != nil {
		w.gen = closing
		in.mu.Unlock()
		return Effects{}, err
	}
	ch, err := in.barrierLocked()
	in.mu.Unlock()
	if err != nil {
		return Effects{}, err
	}
	in.rd.Flush()

	select {
	case err := <-ch:
		if err != nil {
			return Effects{}, err
		}
	case <-ctx.Done():
		// The turn's events stay accumulated and go to the next Cut.
		return Effects{}, ctx.Err()
	}

	var lost uint64
	var total uint64
	if err := in.objs.Drops.Lookup(w.cgid, &total); err == nil {
		lost = total
	}
	misses := in.recursionMisses()

	w.mu.Lock()
	defer w.mu.Unlock()
	acc := newTurn()
	for g, t := range w.turns {
		if g <= closing {
			acc.merge(t)
			delete(w.turns, g)
		}
	}
	if closing+1 > w.openGen {
		w.openGen = closing + 1
	}
	// Shared writable mappings may be written at any time without a
	// syscall: report them in every turn during which they existed, i.e.
	// those live at the start of the turn (even if their process exited
	// since) and those live now.
	for p, fs := range w.mapsAtStart {
		acc.file(p, opMmapWrite, fs)
	}
	w.mapsAtStart = make(map[string]string)
	for _, m := range w.maps {
		for p, fs := range m {
			acc.file(p, opMmapWrite, fs)
			w.mapsAtStart[p] = fs
		}
	}
	// Likewise an io_uring instance does I/O without syscalls for as long
	// as it lives.
	if w.uringAtStart || len(w.uring) > 0 {
		acc.unknown[flagNames[flagIOUring]] = true
	}
	w.uringAtStart = len(w.uring) > 0
	eff := acc.effects()
	if lost >= w.lostSeen {
		eff.Lost += lost - w.lostSeen
		w.lostSeen = lost
	}
	if misses > w.missSeen {
		eff.Lost += misses - w.missSeen
		w.missSeen = misses
	}
	return eff, nil
}

// Close stops recording. Effects not yet returned by Cut are discarded.
func (w *Watch) Close() error {
	in := w.in
	in.mu.Lock()
	defer in.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	if in.watches[w.cgid] == w {
		delete(in.watches, w.cgid)
	}
	if in.closed {
		return nil
	}
	if len(in.watches) == 0 {
		in.detachLocked()
	}
	var errs []error
	if err := in.objs.Watched.Delete(w.cgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	if err := in.objs.Drops.Delete(w.cgid); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, err)
	}
	if err := in.updateLevelsLocked(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// apply accounts one event (reader goroutine).
func (w *Watch) apply(ev *event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := ev.gen
	if g < w.openGen {
		g = w.openGen // late: its turn was already returned
	}
	t := w.turns[g]
	if t == nil {
		t = newTurn()
		w.turns[g] = t
	}
	ev.account(t, w)
}

// cgroupID returns the cgroup2 id (the directory's inode number) and depth
// of the cgroup directory dir.
func cgroupID(dir string) (uint64, int, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return 0, 0, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(abs, &sfs); err != nil {
		return 0, 0, fmt.Errorf("inspect: cgroup dir: %w", err)
	}
	if sfs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, 0, fmt.Errorf("inspect: %s is not a cgroup2 directory", dir)
	}
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err != nil {
		return 0, 0, fmt.Errorf("inspect: cgroup dir: %w", err)
	}
	level, err := cgroupLevel(abs)
	if err != nil {
		return 0, 0, err
	}
	return st.Ino, level, nil
}

// cgroupLevel is the depth of a cgroup2 directory below the hierarchy root
// (the root cgroup is level 0), from /proc/self/mountinfo.
func cgroupLevel(abs string) (int, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	best, bestRoot := "", ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, s := range fields {
			if s == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 || fields[sep+1] != "cgroup2" {
			continue
		}
		root, mp := unescape(fields[3]), unescape(fields[4])
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(best) {
			best, bestRoot = mp, root
		}
	}
	if best == "" {
		return 0, fmt.Errorf("inspect: no cgroup2 mount contains %s", abs)
	}
	rel, err := filepath.Rel(best, abs)
	if err != nil {
		return 0, err
	}
	return depth(bestRoot) + depth(rel), nil
}

func depth(p string) int {
	n := 0
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			n++
		}
	}
	return n
}

// unescape undoes mountinfo's octal escapes (\040 for space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func pidNS(pid int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", pid), &st); err != nil {
		return 0, fmt.Errorf("inspect: pid namespace of %d: %w", pid, err)
	}
	return st.Ino, nil
}
