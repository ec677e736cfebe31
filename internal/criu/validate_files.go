package criu

import (
	"fmt"
	"path"
	"strings"

	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	ghost_file "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/netdev"
	remap_file_path "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
)

// unixPathMax is sun_path's size: a socket's name is at most that.
const unixPathMax = 108

// checkFiles checks files.img (paths, mounts) and what refers to it:
// fdinfo, fs, mm and remap images.
func (s *imageSet) checkFiles() error {
	files := map[uint32]*fdinfo.FileEntry{}
	mounts := map[int32]bool{}
	for _, im := range s.byKind["MNTS"] {
		for _, e := range im.entries {
			mounts[int32(e.msg.(*mnt.MntEntry).GetMntId())] = true
		}
	}
	if im := s.one("files.img"); im != nil {
		for i, e := range im.entries {
			f := e.msg.(*fdinfo.FileEntry)
			if files[f.GetId()] != nil {
				return refuse(im.name, "entry %d: file id %d appears twice", i, f.GetId())
			}
			files[f.GetId()] = f
			if err := s.checkFile(im.name, i, f, mounts); err != nil {
				return err
			}
		}
	}
	known := func(file string, i int, what string, id uint32) error {
		if files[id] == nil {
			return refuse(file, "entry %d: %s %d is not in files.img", i, what, id)
		}
		return nil
	}
	filesIDs := map[uint64]bool{}
	if err := s.checkIDs(filesIDs); err != nil {
		return err
	}
	for _, im := range s.byKind["FDINFO"] {
		if !filesIDs[im.num] {
			return refuse(im.name, "no task's ids image names files id %d", im.num)
		}
		fds := map[uint32]bool{}
		for i, e := range im.entries {
			fd := e.msg.(*fdinfo.FdinfoEntry)
			if fd.GetFd() >= 1<<20 || fds[fd.GetFd()] {
				return refuse(im.name, "entry %d: descriptor %d out of range or listed twice", i, fd.GetFd())
			}
			fds[fd.GetFd()] = true
			if err := known(im.name, i, "file", fd.GetId()); err != nil {
				return err
			}
		}
	}
	for _, im := range s.byKind["FS"] {
		f := im.entries[0].msg.(*fs.FsEntry)
		if err := known(im.name, 0, "cwd", f.GetCwdId()); err != nil {
			return err
		}
		if err := known(im.name, 0, "root", f.GetRootId()); err != nil {
			return err
		}
	}
	for _, im := range s.byKind["MM"] {
		m := im.entries[0].msg.(*mm.MmEntry)
		if err := known(im.name, 0, "exe file", m.GetExeFileId()); err != nil {
			return err
		}
		for j, v := range m.GetVmas() {
			if v.GetStatus()&(vmaFilePrivate|vmaFileShared) != 0 && files[uint32(v.GetShmid())] == nil {
				return refuse(im.name, "vma %d at %#x maps file %d, which is not in files.img", j, v.GetStart(), v.GetShmid())
			}
		}
	}
	return s.checkRemaps(files)
}

// checkIDs collects the tasks' files IDs, and checks that each task
// lives in the dump's root mount namespace (the inventory's root_ids)
// or in one the images hold, and that each mount namespace image is
// some task's.
func (s *imageSet) checkIDs(filesIDs map[uint64]bool) error {
	rootNS := uint32(0)
	if inv := s.one("inventory.img"); inv != nil {
		rootNS = inv.entries[0].msg.(*inventory.InventoryEntry).GetRootIds().GetMntNsId()
	}
	used := map[uint64]bool{}
	for _, im := range s.names("IDS") {
		ids := im.entries[0].msg.(*criu_core.TaskKobjIdsEntry)
		filesIDs[uint64(ids.GetFilesId())] = true
		ns := ids.GetMntNsId()
		if ns != rootNS && s.one(fmt.Sprintf("mountpoints-%d.img", ns)) == nil {
			return refuse(im.name, "mount namespace %d: neither the dump's root namespace (inventory) nor in the images", ns)
		}
		used[uint64(ns)] = true
	}
	for _, im := range s.byKind["MNTS"] {
		if !used[im.num] {
			return refuse(im.name, "no task's ids image names mount namespace %d", im.num)
		}
	}
	return nil
}

// checkFile checks one entry of files.img.
func (s *imageSet) checkFile(name string, i int, f *fdinfo.FileEntry, mounts map[int32]bool) error {
	if r := f.GetReg(); r != nil {
		if err := validName(name, fmt.Sprintf("entry %d (file %d)", i, f.GetId()), r.GetName(), s.lim); err != nil {
			return err
		}
		if len(mounts) > 0 && r.GetMntId() != -1 && !mounts[r.GetMntId()] {
			return refuse(name, "entry %d: file %q is on mount %d, which no mountpoints image holds", i, r.GetName(), r.GetMntId())
		}
	}
	if u := f.GetUsk(); u != nil {
		n := u.GetName()
		if len(n) > unixPathMax {
			return refuse(name, "entry %d: a %d-byte socket name", i, len(n))
		}
		if len(n) > 0 && n[0] != 0 {
			// A path name (not an abstract one): CRIU binds it.
			if strings.IndexByte(string(n), 0) >= 0 || hasDotDot(string(n)) {
				return refuse(name, "entry %d: socket name %q holds NUL or \"..\"", i, n)
			}
		}
		if d := u.GetNameDir(); d != "" {
			if err := validName(name, fmt.Sprintf("entry %d (socket's directory)", i), d, s.lim); err != nil {
				return err
			}
		}
	}
	if f.GetExt() != nil {
		return refuse(name, "entry %d: an external file, which molt never dumps", i)
	}
	return nil
}

func hasDotDot(p string) bool {
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return true
		}
	}
	return false
}

// checkRemaps: a remapped file is a regular file of files.img, remapped
// to another (linked) or to a ghost file image that exists; every ghost
// file image is some file's.
func (s *imageSet) checkRemaps(files map[uint32]*fdinfo.FileEntry) error {
	ghosts := map[uint64]bool{}
	if im := s.one("remap-fpath.img"); im != nil {
		for i, e := range im.entries {
			r := e.msg.(*remap_file_path.RemapFilePathEntry)
			if f := files[r.GetOrigId()]; f == nil || f.GetReg() == nil {
				return refuse(im.name, "entry %d: file %d is not a regular file of files.img", i, r.GetOrigId())
			}
			switch r.GetRemapType() {
			case remap_file_path.RemapType_LINKED:
				if f := files[r.GetRemapId()]; f == nil || f.GetReg() == nil {
					return refuse(im.name, "entry %d: linked to file %d, not a regular file of files.img", i, r.GetRemapId())
				}
			case remap_file_path.RemapType_GHOST:
				n := fmt.Sprintf("ghost-file-%x.img", r.GetRemapId())
				if s.one(n) == nil {
					return refuse(im.name, "entry %d: names %s, which is missing", i, n)
				}
				ghosts[uint64(r.GetRemapId())] = true
			case remap_file_path.RemapType_PROCFS:
			default:
				return refuse(im.name, "entry %d: unknown remap type %d", i, r.GetRemapType())
			}
		}
	}
	for _, im := range s.byKind["GHOST_FILE"] {
		if !ghosts[im.num] {
			return refuse(im.name, "no remap names it")
		}
		g := im.entries[0].msg.(*ghost_file.GhostFileEntry)
		if t := g.GetSymlnkTarget(); len(t) > s.lim.Path || strings.IndexByte(t, 0) >= 0 {
			return refuse(im.name, "symlink target of %d bytes or with NUL", len(t))
		}
	}
	return nil
}

// checkRaw: each raw image other than pages belongs to what names it: a
// tmpfs archive to a tmpfs mount of that device (CRIU names it by
// the superblock's device), a network dump to a network
// namespace image. Network devices are loopback only (a sandbox's
// namespace has nothing else when its images carry it; CRIU would make
// a veth's or a tunnel's other end on the host).
func (s *imageSet) checkRaw() error {
	tmpfs := map[uint64]bool{}
	for _, im := range s.byKind["MNTS"] {
		for _, e := range im.entries {
			if m := e.msg.(*mnt.MntEntry); m.GetFstype() == uint32(mnt.Fstype_TMPFS) {
				tmpfs[uint64(m.GetRootDev())] = true
			}
		}
	}
	for name := range s.raw {
		if m := rawKinds["tmpfs-dev"].FindStringSubmatch(name); m != nil {
			if n, err := parseNum(m[1]); err != nil || !tmpfs[n] {
				return refuse(name, "no tmpfs mount of device %s in the mountpoints images", m[1])
			}
		}
		if m := rawKinds["net"].FindStringSubmatch(name); m != nil {
			if s.one("netns-"+m[1]+".img") == nil {
				return refuse(name, "no netns-%s.img", m[1])
			}
		}
	}
	for _, im := range s.byKind["NETDEV"] {
		for i, e := range im.entries {
			if d := e.msg.(*netdev.NetDeviceEntry); d.GetType() != netdev.NdType_LOOPBACK {
				return refuse(im.name, "entry %d: a %v device %q; molt's sandboxes have loopback only in their images", i, d.GetType(), d.GetName())
			}
		}
	}
	return nil
}

func parseNum(s string) (uint64, error) {
	var n uint64
	_, err := fmt.Sscanf(s, "%d", &n)
	return n, err
}

// checkMounts checks every mount namespace's table (see mountAllowed).
func (s *imageSet) checkMounts() error {
	for _, im := range s.names("MNTS") {
		if len(im.entries) > s.lim.Mounts {
			return refuse(im.name, "%d mounts, over the limit of %d", len(im.entries), s.lim.Mounts)
		}
		ents := make([]*mnt.MntEntry, len(im.entries))
		for i, e := range im.entries {
			ents[i] = e.msg.(*mnt.MntEntry)
		}
		if err := s.checkMountTable(im.name, ents); err != nil {
			return err
		}
	}
	return nil
}

// checkMountTable checks one namespace's mounts: unique IDs, one root
// mount at "/", every other mount's parent in the table and no loop,
// clean paths, and each mount one molt makes (mountAllowed).
func (s *imageSet) checkMountTable(name string, ents []*mnt.MntEntry) error {
	byID := map[uint32]*mnt.MntEntry{}
	for i, e := range ents {
		if byID[e.GetMntId()] != nil {
			return refuse(name, "entry %d: mount id %d appears twice", i, e.GetMntId())
		}
		byID[e.GetMntId()] = e
		for what, p := range map[string]string{"mountpoint": cleanMP(e.GetMountpoint()), "root": e.GetRoot()} {
			if err := validName(name, fmt.Sprintf("mount %d's %s", e.GetMntId(), what), p, s.lim); err != nil {
				return err
			}
		}
		if strings.IndexByte(e.GetMountpoint(), 0) >= 0 || hasDotDot(e.GetMountpoint()) {
			return refuse(name, "mount %d: mountpoint %q holds NUL or \"..\"", e.GetMntId(), e.GetMountpoint())
		}
	}
	var top *mnt.MntEntry
	for _, e := range ents {
		if p := byID[e.GetParentMntId()]; p == nil || p == e {
			if top != nil {
				return refuse(name, "two root mounts (%d at %q, %d at %q)", top.GetMntId(), top.GetMountpoint(), e.GetMntId(), e.GetMountpoint())
			}
			top = e
		}
	}
	if top == nil {
		return refuse(name, "no root mount")
	}
	if cleanMP(top.GetMountpoint()) != "/" || top.GetFstype() != uint32(mnt.Fstype_UNSUPPORTED) {
		return refuse(name, "root mount %d: a %v mount at %q; molt's sandboxes have their root (a btrfs subvolume) there", top.GetMntId(), mnt.Fstype(top.GetFstype()), top.GetMountpoint())
	}
	for _, e := range ents {
		cur := e
		for steps := 0; cur != top; steps++ {
			if steps > len(ents) {
				return refuse(name, "mount %d: its parents form a loop", e.GetMntId())
			}
			cur = byID[cur.GetParentMntId()]
		}
		if err := mountAllowed(e, top); err != nil {
			return refuse(name, "mount %d (%v at %q, root %q): %v", e.GetMntId(), mnt.Fstype(e.GetFstype()), e.GetMountpoint(), e.GetRoot(), err)
		}
	}
	return nil
}

// mountAllowed reports why e is not a mount molt makes in a sandbox
// (internal/sbinit, stage1.go): the sandbox's root; proc at /proc, sysfs
// at /sys, a new devpts instance at /dev/pts; read-only binds of proc
// onto its own paths; masks under /proc and /sys (the sandbox's
// /dev/null bound on a file, an empty sysfs directory or tmpfs on a
// directory). All private. Nothing else, and no bind of a host path.
func mountAllowed(e, top *mnt.MntEntry) error {
	mp := cleanMP(e.GetMountpoint())
	root := path.Clean("/" + e.GetRoot())
	mask := strings.HasPrefix(mp, "/proc/") || strings.HasPrefix(mp, "/sys/")
	switch {
	case e == top:
		return nil
	case e.GetExtMount():
		return fmt.Errorf("an external mount, which molt never makes")
	case e.GetDeleted():
		return fmt.Errorf("a mount of a deleted path")
	case e.GetSharedId() != 0 || e.GetMasterId() != 0:
		return fmt.Errorf("a shared or slave mount; molt makes every mount private")
	}
	switch mnt.Fstype(e.GetFstype()) {
	case mnt.Fstype_PROC:
		if (mp == "/proc" && root == "/") || (strings.HasPrefix(mp, "/proc/") && root == strings.TrimPrefix(mp, "/proc")) {
			return nil
		}
	case mnt.Fstype_SYSFS:
		if (mp == "/sys" && root == "/") || (mask && root == "/fs/cgroup") {
			return nil
		}
	case mnt.Fstype_DEVPTS:
		if mp == "/dev/pts" && root == "/" && hasOption(e.GetOptions(), "newinstance") {
			return nil
		}
		return fmt.Errorf("devpts other than a new instance at /dev/pts (the host's terminals)")
	case mnt.Fstype_TMPFS:
		if mask && root == "/" {
			return nil
		}
	case mnt.Fstype_UNSUPPORTED:
		// A bind from the root's filesystem: only the sandbox's own
		// /dev/null, on a masked file.
		topRoot := path.Clean("/" + top.GetRoot())
		if e.GetRootDev() != top.GetRootDev() {
			return fmt.Errorf("a bind mount of a host filesystem")
		}
		if mask && root == path.Join(topRoot, "dev/null") {
			return nil
		}
		return fmt.Errorf("a bind mount of %q, not the sandbox's /dev/null on a masked path", root)
	default:
		return fmt.Errorf("a kind of mount molt never makes")
	}
	return fmt.Errorf("not where molt mounts it")
}

func hasOption(opts, o string) bool {
	for _, x := range strings.Split(opts, ",") {
		if x == o {
			return true
		}
	}
	return false
}
