package criu

import (
	"fmt"
	"sort"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"google.golang.org/protobuf/encoding/protowire"
)

// imgVersion is the inventory's img_version of CRIU's current image
// format (CRTOOLS_IMAGES_V1_1).
const imgVersion = 2

// checkInventory: one inventory, of the current format, naming the
// root task's namespaces and with fdinfo images per files ID (the only
// layout the other checks know).
func (s *imageSet) checkInventory() error {
	im := s.one("inventory.img")
	if im == nil {
		return refuse("inventory.img", "missing")
	}
	inv := im.entries[0].msg.(*inventory.InventoryEntry)
	switch {
	case inv.GetImgVersion() != imgVersion:
		return refuse(im.name, "image version %d, want %d", inv.GetImgVersion(), imgVersion)
	case inv.GetRootIds() == nil:
		return refuse(im.name, "no root_ids")
	case !inv.GetFdinfoPerId():
		return refuse(im.name, "fdinfo images per task (fdinfo_per_id unset): not a layout CRIU 3.0 or later writes")
	case inv.GetPreDumpMode() != 0 || inv.GetDumpUptime() != 0:
		// Written by pre-dumps and --track-mem dumps, which molt never
		// makes: such images name pages in a parent's images.
		return refuse(im.name, "written by an incremental dump (pre_dump_mode or dump_uptime set)")
	}
	return nil
}

// task is one process of the tree.
type task struct {
	e       *pstree.PstreeEntry
	threads []uint32
}

// checkTree checks pstree.img and the per-task images against it.
func (s *imageSet) checkTree() error {
	const name = "pstree.img"
	im := s.one(name)
	if im == nil {
		return refuse(name, "missing")
	}
	if len(im.entries) == 0 {
		return refuse(name, "no tasks")
	}
	tasks := map[uint32]*task{}
	nthreads := 0
	var root *task
	for i, e := range im.entries {
		p := e.msg.(*pstree.PstreeEntry)
		pid := p.GetPid()
		switch {
		case pid == 0 || pid > 1<<22:
			return refuse(name, "entry %d: pid %d out of range", i, pid)
		case tasks[pid] != nil:
			return refuse(name, "entry %d: pid %d appears twice", i, pid)
		case p.GetPpid() == 0 && root != nil:
			return refuse(name, "entry %d: pid %d is a second root (pid %d is the first)", i, pid, root.e.GetPid())
		case p.GetPpid() == 0 && i != 0:
			return refuse(name, "entry %d: pid %d is a root after the first entry", i, pid)
		}
		t := &task{e: p, threads: p.GetThreads()}
		nthreads += max(len(t.threads), 1)
		if nthreads > s.lim.Tasks {
			return refuse(name, "more than %d tasks", s.lim.Tasks)
		}
		tasks[pid] = t
		if p.GetPpid() == 0 {
			root = t
		}
	}
	if root == nil {
		return refuse(name, "no root task (one whose ppid is 0)")
	}
	// Every task reaches the root through parents in the tree: none is
	// missing and there is no loop. Tasks found to reach it are marked,
	// so the walk is linear in the tree's size.
	reaches := map[*task]bool{root: true}
	for _, e := range im.entries {
		t := tasks[e.msg.(*pstree.PstreeEntry).GetPid()]
		var path []*task
		onPath := map[*task]bool{}
		for cur := t; !reaches[cur]; {
			if onPath[cur] {
				return refuse(name, "pid %d: its parents form a loop", cur.e.GetPid())
			}
			onPath[cur] = true
			path = append(path, cur)
			par := tasks[cur.e.GetPpid()]
			if par == nil {
				return refuse(name, "pid %d: parent %d is not in the tree", cur.e.GetPid(), cur.e.GetPpid())
			}
			cur = par
		}
		for _, x := range path {
			reaches[x] = true
		}
	}
	return s.checkTaskImages(tasks)
}

// checkTaskImages: each task has the images a restore reads for it, its
// threads are its own, and no per-task image names a task or thread the
// tree does not have. A dead task (a zombie) or a helper has no memory,
// files or threads (CRIU leaves its thread list unset).
func (s *imageSet) checkTaskImages(tasks map[uint32]*task) error {
	tids := map[uint32]bool{}
	for pid := range tasks {
		tids[pid] = true
	}
	pids := make([]uint32, 0, len(tasks))
	for pid := range tasks {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	for _, pid := range pids {
		core := s.one(fmt.Sprintf("core-%d.img", pid))
		if core == nil {
			return refuse(fmt.Sprintf("core-%d.img", pid), "missing: pid %d is in pstree.img", pid)
		}
		st := core.entries[0].msg.(*criu_core.CoreEntry).GetTc().GetTaskState()
		if st != taskAlive && st != taskStopped {
			continue
		}
		for _, k := range []string{"mm", "pagemap", "ids", "fs"} {
			if n := fmt.Sprintf("%s-%d.img", k, pid); s.one(n) == nil {
				return refuse(n, "missing: pid %d is in pstree.img", pid)
			}
		}
		th := tasks[pid].threads
		if len(th) == 0 || th[0] != pid {
			return refuse("pstree.img", "pid %d: its threads %.8v do not start with it", pid, th)
		}
		for _, tid := range th[1:] {
			if tid == 0 || tid > 1<<22 || tids[tid] {
				return refuse("pstree.img", "pid %d: thread %d out of range or listed twice", pid, tid)
			}
			tids[tid] = true
		}
		for _, tid := range th {
			if n := fmt.Sprintf("core-%d.img", tid); s.one(n) == nil {
				return refuse(n, "missing: thread %d of pid %d is in pstree.img", tid, pid)
			}
		}
	}
	for _, k := range []string{"CORE", "MM", "IDS", "FS"} {
		for _, im := range s.byKind[k] {
			if im.num > 1<<22 || !tids[uint32(im.num)] || (k != "CORE" && tasks[uint32(im.num)] == nil) {
				return refuse(im.name, "no task %d in pstree.img", im.num)
			}
		}
	}
	for _, im := range s.byKind["PAGEMAP"] {
		if im.kind.name.String() == `^pagemap-(\d+)\.img$` && (im.num > 1<<22 || tasks[uint32(im.num)] == nil) {
			return refuse(im.name, "no task %d in pstree.img", im.num)
		}
	}
	return nil
}

// Pagemap entry flags (criu/include/pagemap.h).
const (
	pageParent  = 1 << 0
	pageLazy    = 1 << 1
	pagePresent = 1 << 2
	pageSize    = 4096
	// userTop is above any user address of x86-64 (57-bit with 5-level
	// paging).
	userTop = 1 << 57
)

// checkPages: every pagemap names a pages image of its own; its entries
// are page-aligned, ascending and non-overlapping, none in a parent
// image; the pages they mark present fill the pages image exactly; and
// every pages image belongs to a pagemap.
func (s *imageSet) checkPages() error {
	owner := map[string]string{}
	var total int64
	for _, im := range s.names("PAGEMAP") {
		if len(im.entries) == 0 {
			return refuse(im.name, "no head")
		}
		head, ok := im.entries[0].msg.(*pagemap.PagemapHead)
		if !ok {
			return refuse(im.name, "no head")
		}
		pages := fmt.Sprintf("pages-%d.img", head.GetPagesId())
		size, ok := s.raw[pages]
		if !ok {
			return refuse(im.name, "names %s, which is missing", pages)
		}
		if o, dup := owner[pages]; dup {
			return refuse(im.name, "names %s, which %s names too", pages, o)
		}
		owner[pages] = im.name
		var end, present uint64
		for i, e := range im.entries[1:] {
			pe := e.msg.(*pagemap.PagemapEntry)
			n := nrPages(pe)
			va := pe.GetVaddr()
			switch {
			case va%pageSize != 0:
				return refuse(im.name, "entry %d: address %#x is not page-aligned", i+1, va)
			case n == 0 || n > userTop/pageSize || va >= userTop || n > (userTop-va)/pageSize:
				return refuse(im.name, "entry %d: %d pages at %#x are beyond user space", i+1, n, va)
			case va < end:
				return refuse(im.name, "entry %d: %#x overlaps or precedes the previous entry (ending at %#x)", i+1, va, end)
			case pe.GetFlags()&^(pageParent|pageLazy|pagePresent) != 0:
				return refuse(im.name, "entry %d: unknown flags %#x", i+1, pe.GetFlags())
			case pe.GetFlags()&pageParent != 0 || pe.GetInParent():
				return refuse(im.name, "entry %d: pages in a parent image, which molt's dumps never have", i+1)
			}
			end = va + n*pageSize
			if pe.GetFlags()&pagePresent != 0 || pe.Flags == nil {
				present += n
			}
		}
		if present*pageSize != uint64(size) {
			return refuse(pages, "%d bytes, but %s names %d present pages (%d bytes)", size, im.name, present, present*pageSize)
		}
		if total += size; total > s.lim.PagesBytes {
			return refuse(pages, "the pages images exceed %d bytes together", s.lim.PagesBytes)
		}
	}
	for name := range s.raw {
		if rawKinds["pages"].MatchString(name) && owner[name] == "" {
			return refuse(name, "no pagemap names it")
		}
	}
	return nil
}

// nrPages is a pagemap entry's page count: CRIU 4 writes it in field 5
// (nr_pages, 64 bits), which go-criu's older message does not know,
// and leaves field 2 (compat_nr_pages) 0.
func nrPages(pe *pagemap.PagemapEntry) uint64 {
	b := pe.ProtoReflect().GetUnknown()
	v, found := uint64(0), false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			break
		}
		if num == 5 && typ == protowire.VarintType {
			// The last occurrence counts, as in any protobuf decoder.
			v, _ = protowire.ConsumeVarint(b)
			found = true
		}
		b = b[m:]
	}
	if found {
		return v
	}
	return uint64(pe.GetNrPages())
}
