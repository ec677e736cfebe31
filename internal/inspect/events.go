package inspect

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path"
	"sort"
	"strings"
	"unsafe"
)

// Effects is what the watched sandbox did during one turn.
//
// Files has one entry per path (ops merged), sorted by path. Paths are
// absolute within the sandbox root (the task's root). A path of "?" means
// some change could not be attributed to a path: treat the whole tree as
// possibly changed. A path of "?/some/path" is a change to a file outside
// the task's root (e.g. an fd inherited from the host, or opened before a
// chroot), given relative to its mount namespace root. Paths given to
// path-based syscalls (unlink, rename, ...)
// are joined lexically with the directory they are relative to; a symlink in
// an intermediate component is not followed.
//
// Unknown lists conservative flags: something happened whose effect on the
// OS cannot be described (e.g. "mount", "ptrace_write", "io_uring",
// "compat_syscall", "coredump"). Lost counts events that were dropped (ring
// buffer full, or a program run the kernel skipped); if it is non-zero the
// effects are incomplete.
type Effects struct {
	Files     []FileEffect `json:"files,omitempty"`
	Processes []ProcEffect `json:"processes,omitempty"`
	Sockets   []SockEffect `json:"sockets,omitempty"`
	Unknown   []string     `json:"unknown,omitempty"`
	Lost      uint64       `json:"lost,omitempty"`
}

// FileEffect is the set of changes made to one path.
type FileEffect struct {
	Path string `json:"path"`
	// Ops, in this order: create write truncate delete rename_from
	// rename_to link symlink mkdir rmdir mknod chmod chown utimes xattr
	// mmap_write.
	Ops []string `json:"ops"`
	// FS is the filesystem type ("btrfs", "tmpfs", "proc", ...) when known.
	FS string `json:"fs,omitempty"`
}

// ProcEffect is a process lifecycle event, in the order observed.
type ProcEffect struct {
	Op   string `json:"op"`  // spawn exec exit
	Pid  int    `json:"pid"` // host tgid
	PPid int    `json:"ppid,omitempty"`
	Comm string `json:"comm"`
	Path string `json:"path,omitempty"` // exec: the executable (resolved; the interpreter for #! scripts)
	// File is the file name given to execve when it names something else
	// than Path (a script, a relative name, a symlink).
	File string `json:"file,omitempty"`
	// Code is the raw exit status for exit (wait(2) encoding).
	Code int `json:"code,omitempty"`
}

// SockEffect is a socket operation.
type SockEffect struct {
	Op     string `json:"op"` // bind listen connect accept
	Pid    int    `json:"pid"`
	Family string `json:"family"`         // inet inet6 unix ...
	Addr   string `json:"addr,omitempty"` // local for bind/listen/accept, remote for connect
	Peer   string `json:"peer,omitempty"` // accept: the remote address
}

// Event kinds, ops and flags: keep in sync with bpf/inspect.h.
const (
	evFD      = 1
	evPath    = 2
	evSpawn   = 3
	evExec    = 4
	evExit    = 5
	evSock    = 6
	evUnknown = 7

	segOK      = 1 << 0
	segOutside = 1 << 2

	opMmapWrite = 1 << 15

	flagIOUring = 10
)

var opNames = []string{
	"create", "write", "truncate", "delete", "rename_from", "rename_to", "link", "symlink",
	"mkdir", "rmdir", "mknod", "chmod", "chown", "utimes", "xattr", "mmap_write",
}

var opMknod = opBit("mknod")

func opBit(name string) uint32 {
	for i, n := range opNames {
		if n == name {
			return 1 << i
		}
	}
	panic("unknown op " + name)
}

var sockOps = map[uint32]string{1: "bind", 2: "listen", 3: "connect", 4: "accept"}

var flagNames = map[uint32]string{ // +checklocksignore: only read
	1:  "mount",
	2:  "umount",
	3:  "pivot_root",
	4:  "move_mount",
	5:  "fsmount",
	6:  "open_tree",
	7:  "mount_setattr",
	8:  "ptrace_write",
	9:  "process_vm_writev",
	10: "io_uring",
	11: "aio",
	12: "compat_syscall",
	13: "mprotect_shared_write",
	14: "madvise_remove",
	15: "btrfs_ioctl",
	16: "fspick",
	17: "swap",
	18: "acct",
	19: "bpf",
}

// fsNames maps superblock magics to filesystem names.
var fsNames = map[uint32]string{
	0x9123683e: "btrfs",
	0x01021994: "tmpfs",
	0x858458f6: "ramfs",
	0x9fa0:     "proc",
	0x62656572: "sysfs",
	0xef53:     "ext4",
	0x58465342: "xfs",
	0x794c7630: "overlay",
	0x63677270: "cgroup2",
	0x27e0eb:   "cgroup",
	0x1cd1:     "devpts",
	0x64626720: "debugfs",
	0x74726163: "tracefs",
	0x6969:     "nfs",
	0x65735546: "fuse",
	0x73717368: "squashfs",
	0x4d44:     "vfat",
	0xcafe4a11: "bpf",
	0x19800202: "mqueue",
	0x958458f6: "hugetlbfs",
	0x73636673: "securityfs",
	0x6165676c: "pstore",
	0x62656570: "configfs",
	0xf2f52010: "f2fs",
	0x2fc12fc1: "zfs",
	0x01021997: "9p",
	0x42465331: "bcachefs",
	0xca451a4e: "bcachefs",
	0x5346544e: "ntfs",
	0x9660:     "iso9660",
}

func fsName(magic uint32) string {
	if magic == 0 {
		return ""
	}
	if n, ok := fsNames[magic]; ok {
		return n
	}
	return fmt.Sprintf("0x%x", magic)
}

type event struct {
	inspectEvHdr
	gen  uint32
	cgid uint64
	segs [4][]byte
}

var hdrSize = int(unsafe.Sizeof(inspectEvHdr{}))

func parseEvent(raw []byte) (*event, error) {
	if len(raw) < hdrSize {
		return nil, errors.New("short event")
	}
	ev := &event{}
	if _, err := binary.Decode(raw[:hdrSize], binary.NativeEndian, &ev.inspectEvHdr); err != nil {
		return nil, err
	}
	ev.gen = ev.Gen
	ev.cgid = ev.Cgid
	data := raw[hdrSize:]
	off := 0
	for i := range ev.segs {
		n := int(ev.Seglen[i])
		if off+n > len(data) {
			return nil, errors.New("truncated event")
		}
		ev.segs[i] = data[off : off+n]
		off += n
	}
	return ev, nil
}

func (ev *event) comm() string {
	b := make([]byte, 0, len(ev.Comm))
	for _, c := range ev.Comm {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// kpath turns a kernel-resolved segment (component names leaf first, each
// NUL terminated) into an absolute path. If the segment is unusable it
// returns false and the conservative stand-in: "?" or, for a file outside
// the task's root, "?" followed by its path from the mount namespace root.
func (ev *event) kpath(i int) (string, bool) {
	fl := ev.Segfl[i]
	if fl != segOK && fl != segOutside {
		return "?", false
	}
	parts := bytes.Split(bytes.TrimSuffix(ev.segs[i], []byte{0}), []byte{0})
	var b strings.Builder
	for j := len(parts) - 1; j >= 0; j-- {
		if len(parts[j]) == 0 {
			continue
		}
		b.WriteByte('/')
		b.Write(parts[j])
	}
	p := b.String()
	if p == "" {
		p = "/"
	}
	if fl == segOutside {
		return "?" + p, false
	}
	return p, true
}

// ustr returns a user string segment.
func (ev *event) ustr(i int) (string, bool) {
	if ev.Segfl[i] != segOK {
		return "", false
	}
	return string(bytes.TrimSuffix(ev.segs[i], []byte{0})), true
}

// join resolves the path of a path-based call: user string seg us relative
// to directory seg ds (magic of the directory). Returns "?" if unresolvable.
func (ev *event) join(us, ds int, magic uint32) (string, string) {
	s, ok := ev.ustr(us)
	if !ok {
		return "?", ""
	}
	if strings.HasPrefix(s, "/") {
		return path.Clean(s), ""
	}
	dir, ok := ev.kpath(ds)
	if !ok {
		if dir == "?" {
			return "?", ""
		}
		return "?" + path.Clean(dir[1:]+"/"+s), ""
	}
	fs := ""
	if !strings.Contains(s, "/") && s != ".." {
		fs = fsName(magic) // the entry is in dir itself
	}
	if s == "" {
		return dir, fs
	}
	return path.Clean(dir + "/" + s), fs
}

// +checklocks:w.mu
func (ev *event) account(t *turn, w *Watch) {
	switch ev.Kind {
	case evFD:
		p, ok := ev.kpath(0)
		t.file(p, ev.Op1, fsName(ev.Magic1))
		if ev.Op1&opMmapWrite != 0 && ok {
			m := w.maps[int(ev.Pid)]
			if m == nil {
				m = make(map[string]string)
				w.maps[int(ev.Pid)] = m
			}
			m[p] = fsName(ev.Magic1)
		}
	case evPath:
		if ev.Op1 != 0 {
			p, fs := ev.join(0, 1, ev.Magic1)
			t.file(p, ev.Op1, fs)
		}
		if ev.Op2 != 0 {
			p, fs := ev.join(2, 3, ev.Magic2)
			t.file(p, ev.Op2, fs)
		}
	case evSpawn:
		t.procs = append(t.procs, ProcEffect{Op: "spawn", Pid: int(ev.Pid), PPid: int(ev.Ppid), Comm: ev.comm()})
		if m := w.maps[int(ev.Ppid)]; len(m) > 0 {
			c := make(map[string]string, len(m))
			for k, v := range m {
				c[k] = v
			}
			w.maps[int(ev.Pid)] = c // MAP_SHARED mappings survive fork
		}
		if w.uring[int(ev.Ppid)] {
			w.uring[int(ev.Pid)] = true // so do io_uring fds
		}
	case evExec:
		fn, _ := ev.ustr(1)
		p, ok := ev.kpath(0)
		if !ok && fn != "" {
			p, fn = fn, ""
		}
		if fn == p {
			fn = ""
		}
		t.procs = append(t.procs, ProcEffect{Op: "exec", Pid: int(ev.Pid), Comm: ev.comm(), Path: p, File: fn})
		delete(w.maps, int(ev.Pid))
		delete(w.uring, int(ev.Pid)) // io_uring fds are always O_CLOEXEC
	case evExit:
		t.procs = append(t.procs, ProcEffect{Op: "exit", Pid: int(ev.Pid), Comm: ev.comm(), Code: int(ev.Aux)})
		delete(w.maps, int(ev.Pid))
		delete(w.uring, int(ev.Pid))
		if ev.Aux&0x80 != 0 {
			t.unknown["coredump"] = true
		}
	case evSock:
		ev.accountSock(t)
	case evUnknown:
		if ev.Op1 == flagIOUring {
			w.uring[int(ev.Pid)] = true
		}
		name := flagNames[ev.Op1]
		if name == "" {
			name = fmt.Sprintf("flag_%d", ev.Op1)
		}
		t.unknown[name] = true
	}
}

func (ev *event) accountSock(t *turn) {
	op := sockOps[ev.Op1]
	sa := ev.segs[0]
	if len(sa) < 2 {
		return
	}
	fam := binary.NativeEndian.Uint16(sa)
	se := SockEffect{Op: op, Pid: int(ev.Pid)}
	switch fam {
	case 0: // AF_UNSPEC: connect() dissolving an association
		return
	case 16: // AF_NETLINK: kernel interfaces, not a network effect
		return
	case 1:
		se.Family = "unix"
		se.Addr = unixAddr(sa[2:])
		if op == "bind" && se.Addr != "" && !strings.HasPrefix(se.Addr, "@") {
			// A filesystem socket: bind created an inode.
			p := se.Addr
			fs := ""
			if !strings.HasPrefix(p, "/") {
				dir, ok := ev.kpath(1)
				switch {
				case ok:
					p = path.Clean(dir + "/" + p)
					if !strings.Contains(se.Addr, "/") {
						fs = fsName(ev.Magic1)
					}
				case dir == "?":
					p = "?"
				default:
					p = "?" + path.Clean(dir[1:]+"/"+p)
				}
			} else {
				p = path.Clean(p)
			}
			t.file(p, opMknod, fs)
		}
	case 2:
		se.Family = "inet"
		se.Addr = inetAddr(sa, false)
		if len(ev.segs[1]) >= 8 {
			se.Peer = inetAddr(ev.segs[1], false)
		}
	case 10:
		se.Family = "inet6"
		se.Addr = inetAddr(sa, true)
		if len(ev.segs[1]) >= 24 {
			se.Peer = inetAddr(ev.segs[1], true)
		}
	default:
		se.Family = fmt.Sprintf("af%d", fam)
	}
	t.socks = append(t.socks, se)
}

func unixAddr(p []byte) string {
	if len(p) == 0 {
		return ""
	}
	if p[0] == 0 {
		return "@" + string(bytes.TrimRight(p[1:], "\x00"))
	}
	if i := bytes.IndexByte(p, 0); i >= 0 {
		p = p[:i]
	}
	return string(p)
}

func inetAddr(sa []byte, v6 bool) string {
	if len(sa) < 4 {
		return ""
	}
	port := binary.BigEndian.Uint16(sa[2:4])
	if v6 {
		if len(sa) < 24 {
			return ""
		}
		var a [16]byte
		copy(a[:], sa[8:24])
		return netip.AddrPortFrom(netip.AddrFrom16(a), port).String()
	}
	if len(sa) < 8 {
		return ""
	}
	var a [4]byte
	copy(a[:], sa[4:8])
	return netip.AddrPortFrom(netip.AddrFrom4(a), port).String()
}

// turn accumulates the effects of one generation.
type turn struct {
	files   map[string]*fileAcc
	procs   []ProcEffect
	socks   []SockEffect
	unknown map[string]bool
}

type fileAcc struct {
	ops uint32
	fs  string
}

func newTurn() *turn {
	return &turn{files: make(map[string]*fileAcc), unknown: make(map[string]bool)}
}

func (t *turn) file(p string, ops uint32, fs string) {
	if ops == 0 {
		return
	}
	f := t.files[p]
	if f == nil {
		f = &fileAcc{}
		t.files[p] = f
	}
	f.ops |= ops
	if f.fs == "" {
		f.fs = fs
	}
}

func (t *turn) merge(o *turn) {
	for p, f := range o.files {
		t.file(p, f.ops, f.fs)
	}
	t.procs = append(t.procs, o.procs...)
	t.socks = append(t.socks, o.socks...)
	for u := range o.unknown {
		t.unknown[u] = true
	}
}

func (t *turn) effects() Effects {
	var e Effects
	for p, f := range t.files {
		fe := FileEffect{Path: p, FS: f.fs}
		for i, n := range opNames {
			if f.ops&(1<<i) != 0 {
				fe.Ops = append(fe.Ops, n)
			}
		}
		e.Files = append(e.Files, fe)
	}
	sort.Slice(e.Files, func(i, j int) bool { return e.Files[i].Path < e.Files[j].Path })
	e.Processes = t.procs
	e.Sockets = t.socks
	for u := range t.unknown {
		e.Unknown = append(e.Unknown, u)
	}
	sort.Strings(e.Unknown)
	return e
}
