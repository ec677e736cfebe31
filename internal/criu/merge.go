package criu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	pipe_data "github.com/checkpoint-restore/go-criu/v7/crit/images/pipe-data"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/proto"

	"github.com/molt-sh/molt/internal/errdefs"
)

// MergePart is one process of a tree, dumped by CRIU on its own from a
// copy of it (internal/template) taken at the tree's instant, with the
// tree's PID namespace declared external and --shell-job.
type MergePart struct {
	Dir    string // the copy's images; Merge moves its page images out
	Pid    int    // the copy's PID in its images (its number in the tree's PID namespace)
	As     int    // the original's PID there: the merged images' name for the process
	Parent int    // the original's parent (the As of an earlier part); 0 for the root
	// Flags are the original's task flags at the instant (the ninth
	// field of /proc/PID/stat): the copy's differ (PF_FORKNOEXEC). 0
	// keeps the copy's.
	Flags uint32
	// Files are the original's open files with a path at the instant,
	// by descriptor (OpenFiles): a copy shares its open file
	// descriptions with the original, which moved their offsets on after
	// the copy was made, and the files may have grown since.
	Files map[int]FileAt
}

// FileAt is an open file's offset and size at an instant.
type FileAt struct{ Pos, Size int64 }

// MergeOptions tune Merge.
type MergeOptions struct {
	// Shared are the open file descriptions several parts share (each
	// group one description), as SharedFiles finds them.
	Shared [][]FileRef
	// EmptyPipes says every pipe was empty at the instant (the caller
	// checked while the tree was frozen): the copies share their pipes
	// with the originals, which may have written to them before the
	// dumps, so what the dumps found queued is dropped.
	EmptyPipes bool
}

// FileRef names an open file of one part: its index in Merge's parts
// and its descriptor there.
type FileRef struct{ Part, Fd int }

// CRIU's values (criu/include/image.h, criu/include/pstree.h).
const (
	taskAlive   = 1
	taskStopped = 3

	vmaKernel      = 1<<2 | 1<<3 | 1<<12 // VMA_AREA_VSYSCALL, VDSO, VVAR
	vmaFilePrivate = 1 << 6
	vmaFileShared  = 1 << 7
	// Kinds of memory whose images name objects a merge does not
	// renumber: shared anonymous memory, System V segments, sockets,
	// AIO rings, memfd.
	vmaUnmerged = 1<<8 | 1<<10 | 1<<11 | 1<<13 | 1<<14
)

// imagesTakenOnce are images of what the processes share (mounts,
// namespaces, cgroups, seccomp filters): every part's dump must hold the
// same bytes, and the merge takes one. Time namespaces' images
// (clockImages) hold the clocks at each dump: the merge takes the first
// dump's, the nearest to the instant.
var (
	imagesTakenOnce = regexp.MustCompile(`^(cgroup\.img|seccomp\.img|mountpoints-\d+\.img|tmpfs-dev-\d+\.tar\.gz\.img|utsns-\d+\.img|ipcns-.*\.img|netns-\d+\.img|userns-\d+\.img)$`)
	clockImages     = regexp.MustCompile(`^timens-\d+\.img$`)
)

// Merge writes into dst (an empty directory) the images of the tree made
// of parts, as one CRIU dump of the originals at the instant of their
// copies would hold them: per-process images renamed to the originals'
// PIDs; ids that each dump numbered from one (open files, memory, page
// images, descriptor tables) renumbered across the dumps; the process
// tree rebuilt from the originals' parents; the copies' stopped state
// made running; open file descriptions that several processes share
// (o.Shared, found with kcmp(2) between the copies) one file; and what
// every dump holds alike (mounts, namespaces, cgroups) taken once.
//
// parts[0] is the tree's root, the init of its PID namespace (As 1),
// which the merged images own; each other part's Parent comes before it.
// Images the merge does not know how to combine (sockets' queues,
// terminals, deleted files, ...) make it fail with ErrNotSupported, as
// does memory shared between processes: the caller dumps such a tree the
// ordinary way.
func Merge(dst string, parts []MergePart, o MergeOptions) error {
	if err := checkParts(parts); err != nil {
		return err
	}
	m := &merger{dst: dst, parts: parts, at: make([]map[uint32]FileAt, len(parts))}
	for i := range parts {
		if err := m.load(i); err != nil {
			return err
		}
	}
	if err := m.checkShared(); err != nil {
		return err
	}
	if err := m.files(o.Shared); err != nil {
		return err
	}
	for i := range parts {
		if err := m.task(i); err != nil {
			return fmt.Errorf("merge %s: %w", parts[i].Dir, err)
		}
	}
	if err := m.pstree(); err != nil {
		return err
	}
	return m.pipesData(o.EmptyPipes)
}

func checkParts(parts []MergePart) error {
	if len(parts) == 0 {
		return fmt.Errorf("merge: no parts: %w", errdefs.ErrInvalidArgument)
	}
	if parts[0].As != 1 || parts[0].Parent != 0 {
		return fmt.Errorf("merge: the first part must be the namespace's init (PID 1, no parent), not %d: %w", parts[0].As, errdefs.ErrInvalidArgument)
	}
	seen := map[int]bool{}
	for i, p := range parts {
		if p.As <= 0 || p.Pid <= 0 || seen[p.As] {
			return fmt.Errorf("merge: part %d: PID %d as %d: %w", i, p.Pid, p.As, errdefs.ErrInvalidArgument)
		}
		if i > 0 && !seen[p.Parent] {
			return fmt.Errorf("merge: part %d (%d): parent %d is not an earlier part: %w", i, p.As, p.Parent, errdefs.ErrInvalidArgument)
		}
		seen[p.As] = true
	}
	return nil
}

// dump is what Merge reads of one part's images.
type dump struct {
	names  []string
	pstree *pstree.PstreeEntry
	ids    *criu_core.TaskKobjIdsEntry
	fds    []*fdinfo.FdinfoEntry // the process's descriptor table
	files  []*fdinfo.FileEntry
	newID  map[uint32]uint32 // file ids in the merged images
}

type merger struct {
	dst   string
	parts []MergePart
	dumps []*dump
	at    []map[uint32]FileAt // per part: open files at the instant by file id
}

var (
	perTask  = regexp.MustCompile(`^(core|ids|mm|pagemap|fs)-(\d+)\.img$`)
	perDump  = regexp.MustCompile(`^(fdinfo|pages)-(\d+)\.img$`)
	ignored  = regexp.MustCompile(`^(pidns-\d+\.img|stats-dump|.*\.log)$`)
	sharedIn = []string{"files.img", "pstree.img", "pipes-data.img", "inventory.img"}
)

func (m *merger) load(i int) error {
	p := m.parts[i]
	ents, err := os.ReadDir(p.Dir)
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	d := &dump{newID: map[uint32]uint32{}}
	for _, e := range ents {
		name := e.Name()
		d.names = append(d.names, name)
		if mt := perTask.FindStringSubmatch(name); mt != nil {
			if mt[2] != strconv.Itoa(p.Pid) {
				return fmt.Errorf("merge %s: %s is not the copy's (%d): the dump holds more than one process: %w", p.Dir, name, p.Pid, errdefs.ErrNotSupported)
			}
			continue
		}
		if perDump.MatchString(name) || ignored.MatchString(name) || imagesTakenOnce.MatchString(name) || clockImages.MatchString(name) || slices.Contains(sharedIn, name) {
			continue
		}
		return fmt.Errorf("merge %s: image %s cannot be merged: %w", p.Dir, name, errdefs.ErrNotSupported)
	}
	ps, err := readImage[*pstree.PstreeEntry](filepath.Join(p.Dir, "pstree.img"))
	if err != nil {
		return err
	}
	if len(ps) != 1 || ps[0].GetPid() != uint32(p.Pid) || !slices.Equal(ps[0].GetThreads(), []uint32{uint32(p.Pid)}) {
		return fmt.Errorf("merge %s: the dump is not the single-threaded process %d: %w", p.Dir, p.Pid, errdefs.ErrNotSupported)
	}
	d.pstree = ps[0]
	ids, err := readOne[*criu_core.TaskKobjIdsEntry](filepath.Join(p.Dir, fmt.Sprintf("ids-%d.img", p.Pid)))
	if err != nil {
		return err
	}
	d.ids = ids
	if d.fds, err = readImage[*fdinfo.FdinfoEntry](filepath.Join(p.Dir, fmt.Sprintf("fdinfo-%d.img", ids.GetFilesId()))); err != nil {
		return err
	}
	if d.files, err = readImage[*fdinfo.FileEntry](filepath.Join(p.Dir, "files.img")); err != nil {
		return err
	}
	m.at[i] = map[uint32]FileAt{}
	for fd, at := range p.Files {
		id, ok := fileOf(d, fd)
		if !ok {
			return fmt.Errorf("merge %s: no descriptor %d for its offset: %w", p.Dir, fd, errdefs.ErrInvalidArgument)
		}
		m.at[i][id] = at
	}
	m.dumps = append(m.dumps, d)
	return nil
}

func fileOf(d *dump, fd int) (uint32, bool) {
	for _, e := range d.fds {
		if int(e.GetFd()) == fd {
			return e.GetId(), true
		}
	}
	return 0, false
}

// checkShared checks that the parts were dumped in the same namespaces
// and copies the images of what they share.
func (m *merger) checkShared() error {
	first := m.dumps[0]
	for i, d := range m.dumps[1:] {
		a, b := first.ids, d.ids
		if a.GetPidNsId() != b.GetPidNsId() || a.GetNetNsId() != b.GetNetNsId() || a.GetIpcNsId() != b.GetIpcNsId() ||
			a.GetUtsNsId() != b.GetUtsNsId() || a.GetMntNsId() != b.GetMntNsId() || a.GetUserNsId() != b.GetUserNsId() ||
			a.GetCgroupNsId() != b.GetCgroupNsId() || a.GetTimeNsId() != b.GetTimeNsId() {
			return fmt.Errorf("merge %s: its namespaces differ from %s's: %w", m.parts[i+1].Dir, m.parts[0].Dir, errdefs.ErrNotSupported)
		}
	}
	for _, name := range first.names {
		clock := clockImages.MatchString(name)
		if !imagesTakenOnce.MatchString(name) && !clock {
			continue
		}
		want, err := os.ReadFile(filepath.Join(m.parts[0].Dir, name))
		if err != nil {
			return fmt.Errorf("merge: %w", err)
		}
		if !clock {
			for _, p := range m.parts[1:] {
				got, err := os.ReadFile(filepath.Join(p.Dir, name))
				if err != nil || !bytes.Equal(got, want) {
					return fmt.Errorf("merge: %s differs between %s and %s: %w", name, m.parts[0].Dir, p.Dir, errors.Join(err, errdefs.ErrNotSupported))
				}
			}
		}
		if err := os.WriteFile(filepath.Join(m.dst, name), want, 0o600); err != nil {
			return fmt.Errorf("merge: %w", err)
		}
	}
	for i, d := range m.dumps[1:] {
		if err := sameNames(first.names, d.names, imagesTakenOnce, clockImages); err != nil {
			return fmt.Errorf("merge %s: %w", m.parts[i+1].Dir, err)
		}
	}
	// The inventory: the first dump's, whose run id (a field go-criu's
	// types do not know) names a dump; the fields known must agree.
	var inv *inventory.InventoryEntry
	for i, p := range m.parts {
		got, err := readOne[*inventory.InventoryEntry](filepath.Join(p.Dir, "inventory.img"))
		if err != nil {
			return err
		}
		if i == 0 {
			inv = got
			continue
		}
		a, b := proto.Clone(inv), proto.Clone(got)
		a.ProtoReflect().SetUnknown(nil)
		b.ProtoReflect().SetUnknown(nil)
		if !proto.Equal(a, b) {
			return fmt.Errorf("merge: the inventories of %s and %s differ: %w", m.parts[0].Dir, p.Dir, errdefs.ErrNotSupported)
		}
	}
	if !inv.GetFdinfoPerId() || !inv.GetNsPerId() {
		return fmt.Errorf("merge: images of an older format (fdinfo or namespaces not per id): %w", errdefs.ErrNotSupported)
	}
	b, err := os.ReadFile(filepath.Join(m.parts[0].Dir, "inventory.img"))
	if err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	if err := os.WriteFile(filepath.Join(m.dst, "inventory.img"), b, 0o600); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	return nil
}

// sameNames checks that two dumps hold the same shared images.
func sameNames(a, b []string, res ...*regexp.Regexp) error {
	pick := func(names []string) []string {
		var out []string
		for _, n := range names {
			for _, re := range res {
				if re.MatchString(n) {
					out = append(out, n)
					break
				}
			}
		}
		return out
	}
	if pa, pb := pick(a), pick(b); !slices.Equal(pa, pb) {
		return fmt.Errorf("shared images %v against %v: %w", pb, pa, errdefs.ErrNotSupported)
	}
	return nil
}

// files renumbers the open files of all parts into one files.img: an
// open file description several parts share (shared) is one entry.
func (m *merger) files(shared [][]FileRef) error {
	// same[part][id] is the earlier part's file that is the same open
	// file description.
	same := make([]map[uint32]FileRef, len(m.parts))
	for i := range same {
		same[i] = map[uint32]FileRef{}
	}
	for _, group := range shared {
		if len(group) < 2 {
			continue
		}
		g := slices.Clone(group)
		slices.SortFunc(g, func(a, b FileRef) int { return a.Part - b.Part })
		for _, r := range g {
			if r.Part < 0 || r.Part >= len(m.parts) {
				return fmt.Errorf("merge: shared file of part %d: %w", r.Part, errdefs.ErrInvalidArgument)
			}
			if _, ok := fileOf(m.dumps[r.Part], r.Fd); !ok {
				return fmt.Errorf("merge: part %d has no descriptor %d: %w", r.Part, r.Fd, errdefs.ErrInvalidArgument)
			}
		}
		for _, r := range g[1:] {
			if r.Part == g[0].Part {
				continue // one process's descriptors: its dump says so already
			}
			id, _ := fileOf(m.dumps[r.Part], r.Fd)
			same[r.Part][id] = g[0]
		}
	}
	var out []proto.Message
	next := uint32(1)
	for i, d := range m.dumps {
		for _, f := range d.files {
			old := f.GetId()
			if ref, ok := same[i][old]; ok {
				id, _ := fileOf(m.dumps[ref.Part], ref.Fd)
				nid, ok := m.dumps[ref.Part].newID[id]
				if !ok {
					return fmt.Errorf("merge: shared file %d of part %d not renumbered", id, ref.Part)
				}
				d.newID[old] = nid
				continue
			}
			f = proto.Clone(f).(*fdinfo.FileEntry)
			if err := renumberFile(f, next); err != nil {
				return fmt.Errorf("merge %s: %w", m.parts[i].Dir, err)
			}
			if at, ok := m.at[i][old]; ok {
				if f.GetType() != fdinfo.FdTypes_REG {
					return fmt.Errorf("merge %s: an offset for a %v file: %w", m.parts[i].Dir, f.GetType(), errdefs.ErrInvalidArgument)
				}
				f.Reg.Pos = proto.Uint64(uint64(at.Pos))
				// CRIU checks a regular file's size on restore against
				// the file system, which is the instant's.
				if f.Reg.Size != nil {
					f.Reg.Size = proto.Uint64(uint64(at.Size))
				}
			}
			d.newID[old] = next
			next++
			out = append(out, f)
		}
	}
	return writeImage(filepath.Join(m.dst, "files.img"), "FILES", out)
}

// renumberFile gives f the id id, in the entry and in the object.
func renumberFile(f *fdinfo.FileEntry, id uint32) error {
	f.Id = proto.Uint32(id)
	switch f.GetType() {
	case fdinfo.FdTypes_REG:
		f.Reg.Id = f.Id
	case fdinfo.FdTypes_PIPE:
		f.Pipe.Id = f.Id
	case fdinfo.FdTypes_SIGNALFD:
		f.Sgfd.Id = f.Id
	case fdinfo.FdTypes_EVENTFD:
		f.Efd.Id = f.Id
	case fdinfo.FdTypes_TIMERFD:
		f.Tfd.Id = f.Id
	case fdinfo.FdTypes_EVENTPOLL:
		f.Epfd.Id = f.Id
		for _, t := range f.Epfd.Tfd {
			t.Id = f.Id
		}
	case fdinfo.FdTypes_UNIXSK:
		// A socket's queued data is in sk-queues.img, which load
		// refuses; its peer is named by inode.
		f.Usk.Id = f.Id
	default:
		return fmt.Errorf("open file of type %v cannot be merged: %w", f.GetType(), errdefs.ErrNotSupported)
	}
	return nil
}

func (m *merger) renumbered(i int, id uint32) (uint32, error) {
	nid, ok := m.dumps[i].newID[id]
	if !ok {
		return 0, fmt.Errorf("file %d is not in files.img: %w", id, errdefs.ErrInvalidArgument)
	}
	return nid, nil
}

// task writes part i's per-process images under the original's PID.
func (m *merger) task(i int) error {
	p, d := m.parts[i], m.dumps[i]
	in := func(kind string) string { return filepath.Join(p.Dir, fmt.Sprintf("%s-%d.img", kind, p.Pid)) }
	out := func(kind string, id int) string { return filepath.Join(m.dst, fmt.Sprintf("%s-%d.img", kind, id)) }
	// Each process has its own memory, descriptor table, fs and signal
	// handlers: number them as a dump of the tree does, from 2 (1 is
	// CRIU's own, in the inventory's root ids).
	own := proto.Uint32(uint32(i + 2))

	ids := proto.Clone(d.ids).(*criu_core.TaskKobjIdsEntry)
	ids.VmId, ids.FilesId, ids.FsId, ids.SighandId = own, own, own, own
	if err := writeImage(out("ids", p.As), "IDS", []proto.Message{ids}); err != nil {
		return err
	}

	var fds []proto.Message
	for _, e := range d.fds {
		e = proto.Clone(e).(*fdinfo.FdinfoEntry)
		id, err := m.renumbered(i, e.GetId())
		if err != nil {
			return err
		}
		e.Id = proto.Uint32(id)
		fds = append(fds, e)
	}
	if err := writeImage(out("fdinfo", int(*own)), "FDINFO", fds); err != nil {
		return err
	}

	core, err := readOne[*criu_core.CoreEntry](in("core"))
	if err != nil {
		return err
	}
	tc := core.GetTc()
	if tc == nil || core.GetThreadCore() == nil {
		return fmt.Errorf("core of %d has no task or thread part: %w", p.Pid, errdefs.ErrNotSupported)
	}
	// The copy waited stopped for its dump; the original ran.
	if tc.GetTaskState() != taskStopped {
		return fmt.Errorf("copy %d was dumped in state %d, not stopped: %w", p.Pid, tc.GetTaskState(), errdefs.ErrInvalidArgument)
	}
	tc.TaskState = proto.Uint32(taskAlive)
	tc.StopSigno = nil
	if p.Flags != 0 {
		tc.Flags = proto.Uint32(p.Flags)
	}
	// A copy starts with no signal pending; one there now came after the
	// instant.
	if len(tc.GetSignalsS().GetSignals()) != 0 || len(core.GetThreadCore().GetSignalsP().GetSignals()) != 0 {
		return fmt.Errorf("copy %d has signals pending: %w", p.Pid, errdefs.ErrNotSupported)
	}
	if err := writeImage(out("core", p.As), "CORE", []proto.Message{core}); err != nil {
		return err
	}

	mme, err := readOne[*mm.MmEntry](in("mm"))
	if err != nil {
		return err
	}
	if mme.ExeFileId != nil {
		id, err := m.renumbered(i, mme.GetExeFileId())
		if err != nil {
			return err
		}
		mme.ExeFileId = proto.Uint32(id)
	}
	if len(mme.GetAios()) != 0 {
		return fmt.Errorf("process %d has AIO rings: %w", p.Pid, errdefs.ErrNotSupported)
	}
	for _, v := range mme.GetVmas() {
		st := v.GetStatus()
		switch {
		case st&vmaUnmerged != 0:
			return fmt.Errorf("process %d maps memory of kind %#x at %#x (shared, System V, socket, AIO or memfd): %w", p.Pid, st, v.GetStart(), errdefs.ErrNotSupported)
		case st&(vmaFilePrivate|vmaFileShared) != 0:
			id, err := m.renumbered(i, uint32(v.GetShmid()))
			if err != nil {
				return err
			}
			v.Shmid = proto.Uint64(uint64(id))
		}
	}
	if err := writeImage(out("mm", p.As), "MM", []proto.Message{mme}); err != nil {
		return err
	}

	head, pm, err := readPagemap(in("pagemap"))
	if err != nil {
		return err
	}
	pages := filepath.Join(p.Dir, fmt.Sprintf("pages-%d.img", head.GetPagesId()))
	head.PagesId = proto.Uint32(uint32(i + 1))
	if err := writeEntries(out("pagemap", p.As), "PAGEMAP", pm); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	if err := moveFile(pages, out("pages", i+1)); err != nil {
		return err
	}

	fse, err := readOne[*fs.FsEntry](in("fs"))
	if err != nil {
		return err
	}
	cwd, err := m.renumbered(i, fse.GetCwdId())
	if err != nil {
		return err
	}
	root, err := m.renumbered(i, fse.GetRootId())
	if err != nil {
		return err
	}
	fse.CwdId, fse.RootId = proto.Uint32(cwd), proto.Uint32(root)
	return writeImage(out("fs", p.As), "FS", []proto.Message{fse})
}

// pstree writes the originals' tree: their PIDs and parents, and the
// process groups and sessions the copies kept.
func (m *merger) pstree() error {
	in := map[uint32]bool{}
	for _, p := range m.parts {
		in[uint32(p.As)] = true
	}
	var out []proto.Message
	for i, p := range m.parts {
		e := m.dumps[i].pstree
		if !in[e.GetPgid()] || !in[e.GetSid()] {
			return fmt.Errorf("merge: process %d's group %d or session %d is led from outside the tree: %w", p.As, e.GetPgid(), e.GetSid(), errdefs.ErrNotSupported)
		}
		out = append(out, &pstree.PstreeEntry{
			Pid: proto.Uint32(uint32(p.As)), Ppid: proto.Uint32(uint32(p.Parent)),
			Pgid: e.Pgid, Sid: e.Sid, Threads: []uint32{uint32(p.As)},
		})
	}
	return writeImage(filepath.Join(m.dst, "pstree.img"), "PSTREE", out)
}

// pipesData writes the queued data of every pipe once: the parts that
// hold an end of the same pipe each dumped its queue.
func (m *merger) pipesData(empty bool) error {
	var out []imageEntry
	seen := map[uint32]bool{}
	for _, p := range m.parts {
		path := filepath.Join(p.Dir, "pipes-data.img")
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		ents, err := readPipesData(path)
		if err != nil {
			return err
		}
		for _, e := range ents {
			d := e.msg.(*pipe_data.PipeDataEntry)
			if seen[d.GetPipeId()] {
				continue
			}
			seen[d.GetPipeId()] = true
			if empty {
				d = proto.Clone(d).(*pipe_data.PipeDataEntry)
				d.Bytes = proto.Uint32(0)
				e = imageEntry{msg: d}
			}
			out = append(out, e)
		}
	}
	if err := writeEntries(filepath.Join(m.dst, "pipes-data.img"), "PIPES_DATA", out); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	return nil
}
