package criu

import (
	"regexp"

	"github.com/checkpoint-restore/go-criu/v7/crit/images/cgroup"
	criu_core "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fdinfo"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fh"
	file_lock "github.com/checkpoint-restore/go-criu/v7/crit/images/file-lock"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/fs"
	ghost_file "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	ipc_msg "github.com/checkpoint-restore/go-criu/v7/crit/images/ipc-msg"
	ipc_sem "github.com/checkpoint-restore/go-criu/v7/crit/images/ipc-sem"
	ipc_shm "github.com/checkpoint-restore/go-criu/v7/crit/images/ipc-shm"
	ipc_var "github.com/checkpoint-restore/go-criu/v7/crit/images/ipc-var"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/memfd"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mnt"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/netdev"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pidns"
	pipe_data "github.com/checkpoint-restore/go-criu/v7/crit/images/pipe-data"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	remap_file_path "github.com/checkpoint-restore/go-criu/v7/crit/images/remap-file-path"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/seccomp"
	sk_packet "github.com/checkpoint-restore/go-criu/v7/crit/images/sk-packet"
	tcp_stream "github.com/checkpoint-restore/go-criu/v7/crit/images/tcp-stream"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/timens"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/tty"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/utsns"
	"google.golang.org/protobuf/proto"
)

// msgOf makes entries of one message type.
func msgOf[T any, P interface {
	*T
	proto.Message
}]() func(int) proto.Message {
	return func(int) proto.Message { return P(new(T)) }
}

// validKinds are the image kinds of molt's dumps (a sandbox's tree and
// what its files, sockets, pipes, terminals and namespaces leave in the
// images, as criu/image-desc.c names them). Anything else is refused:
// CRIU would act on it.
var validKinds = []imageKind{
	{kind: "INVENTORY", name: regexp.MustCompile(`^inventory\.img$`), msg: msgOf[inventory.InventoryEntry](), one: true},
	{kind: "PSTREE", name: regexp.MustCompile(`^pstree\.img$`), msg: msgOf[pstree.PstreeEntry]()},
	{kind: "CORE", name: regexp.MustCompile(`^core-(\d+)\.img$`), msg: msgOf[criu_core.CoreEntry](), one: true},
	{kind: "IDS", name: regexp.MustCompile(`^ids-(\d+)\.img$`), msg: msgOf[criu_core.TaskKobjIdsEntry](), one: true},
	{kind: "MM", name: regexp.MustCompile(`^mm-(\d+)\.img$`), msg: msgOf[mm.MmEntry](), one: true},
	{kind: "FS", name: regexp.MustCompile(`^fs-(\d+)\.img$`), msg: msgOf[fs.FsEntry](), one: true},
	{kind: "PAGEMAP", name: regexp.MustCompile(`^pagemap-(\d+)\.img$`), msg: pagemapMsg},
	{kind: "PAGEMAP", name: regexp.MustCompile(`^pagemap-shmem-(\d+)\.img$`), msg: pagemapMsg},
	{kind: "FILES", name: regexp.MustCompile(`^files\.img$`), msg: msgOf[fdinfo.FileEntry]()},
	{kind: "FDINFO", name: regexp.MustCompile(`^fdinfo-(\d+)\.img$`), msg: msgOf[fdinfo.FdinfoEntry]()},
	{kind: "MNTS", name: regexp.MustCompile(`^mountpoints-(\d+)\.img$`), msg: msgOf[mnt.MntEntry]()},
	{kind: "CGROUP", name: regexp.MustCompile(`^cgroup\.img$`), msg: msgOf[cgroup.CgroupEntry](), one: true},
	{kind: "SECCOMP", name: regexp.MustCompile(`^seccomp\.img$`), msg: msgOf[seccomp.SeccompEntry](), one: true},
	{kind: "TIMENS", name: regexp.MustCompile(`^timens-(\d+)\.img$`), msg: msgOf[timens.TimensEntry](), one: true},
	{kind: "PIPES_DATA", name: regexp.MustCompile(`^pipes-data\.img$`), msg: msgOf[pipe_data.PipeDataEntry](), extra: pipeBytes},
	{kind: "FIFO_DATA", name: regexp.MustCompile(`^fifo-data\.img$`), msg: msgOf[pipe_data.PipeDataEntry](), extra: pipeBytes},
	{kind: "SK_QUEUES", name: regexp.MustCompile(`^sk-queues\.img$`), msg: msgOf[sk_packet.SkPacketEntry](),
		extra: func(m proto.Message) int { return int(m.(*sk_packet.SkPacketEntry).GetLength()) }},
	{kind: "TCP_STREAM", name: regexp.MustCompile(`^tcp-stream-([0-9a-f]+)\.img$`), hex: true, msg: msgOf[tcp_stream.TcpStreamEntry](), one: true,
		extra: func(m proto.Message) int {
			e := m.(*tcp_stream.TcpStreamEntry)
			return int(e.GetInqLen()) + int(e.GetOutqLen())
		}},
	{kind: "GHOST_FILE", name: regexp.MustCompile(`^ghost-file-([0-9a-f]+)\.img$`), hex: true, msg: msgOf[ghost_file.GhostFileEntry]()},
	{kind: "REMAP_FPATH", name: regexp.MustCompile(`^remap-fpath\.img$`), msg: msgOf[remap_file_path.RemapFilePathEntry]()},
	{kind: "FILE_LOCKS", name: regexp.MustCompile(`^filelocks\.img$`), msg: msgOf[file_lock.FileLockEntry]()},
	{kind: "TTY_INFO", name: regexp.MustCompile(`^tty-info\.img$`), msg: msgOf[tty.TtyInfoEntry]()},
	{kind: "TTY_DATA", name: regexp.MustCompile(`^tty-data\.img$`), msg: msgOf[tty.TtyDataEntry]()},
	{kind: "UTSNS", name: regexp.MustCompile(`^utsns-(\d+)\.img$`), msg: msgOf[utsns.UtsnsEntry](), one: true},
	{kind: "IPC_VAR", name: regexp.MustCompile(`^ipcns-var-(\d+)\.img$`), msg: msgOf[ipc_var.IpcVarEntry](), one: true},
	// System V IPC objects of the sandbox's IPC namespace: shared
	// memory segments (their pages in pagemap-shmem images), semaphore
	// sets (each followed by its values) and message queues (each
	// followed by its messages: decodeKind).
	{kind: "IPCNS_SHM", name: regexp.MustCompile(`^ipcns-shm-(\d+)\.img$`), msg: msgOf[ipc_shm.IpcShmEntry](), extra: shmBytes},
	{kind: "IPCNS_SEM", name: regexp.MustCompile(`^ipcns-sem-(\d+)\.img$`), msg: msgOf[ipc_sem.IpcSemEntry](), extra: semBytes},
	{kind: "IPCNS_MSG", name: regexp.MustCompile(`^ipcns-msg-(\d+)\.img$`)},
	{kind: "NETNS", name: regexp.MustCompile(`^netns-(\d+)\.img$`), msg: msgOf[netdev.NetnsEntry](), one: true},
	{kind: "NETDEV", name: regexp.MustCompile(`^netdev-(\d+)\.img$`), msg: msgOf[netdev.NetDeviceEntry]()},
	{kind: "USERNS", name: regexp.MustCompile(`^userns-(\d+)\.img$`), msg: msgOf[userns.UsernsEntry](), one: true},
	{kind: "PIDNS", name: regexp.MustCompile(`^pidns-(\d+)\.img$`), msg: msgOf[pidns.PidnsEntry]()},
	{kind: "MEMFD_INODE", name: regexp.MustCompile(`^memfd\.img$`), msg: msgOf[memfd.MemfdInodeEntry]()},
	{kind: "IRMAP_CACHE", name: regexp.MustCompile(`^irmap-cache\.img$`), msg: msgOf[fh.IrmapCacheEntry]()},
}

func pagemapMsg(i int) proto.Message {
	if i == 0 {
		return &pagemap.PagemapHead{}
	}
	return &pagemap.PagemapEntry{}
}

func pipeBytes(m proto.Message) int { return int(m.(*pipe_data.PipeDataEntry).GetBytes()) }

// shmBytes: a segment's pages are in a pagemap (in_pagemaps), never
// after its entry in the images CRIU 4 writes; anything else is refused.
func shmBytes(m proto.Message) int {
	if !m.(*ipc_shm.IpcShmEntry).GetInPagemaps() {
		return -1
	}
	return 0
}

// semBytes: a set's values, 16 bits each, rounded up to 8 bytes
// (criu/ipc_ns.c).
func semBytes(m proto.Message) int {
	return int((2*int64(m.(*ipc_sem.IpcSemEntry).GetNsems()) + 7) &^ 7)
}

// msgQueues returns the entry and data functions of an IPCNS_MSG image:
// each queue's entry is followed by its qnum messages, each an IpcMsg
// entry followed by its text rounded up to 8 bytes (criu/ipc_ns.c); done
// reports whether the last queue had all its messages.
func msgQueues() (next func(int) proto.Message, extra func(proto.Message) int, done func() bool) {
	left := 0 // messages of the current queue still to come
	next = func(int) proto.Message {
		if left > 0 {
			left--
			return &ipc_msg.IpcMsg{}
		}
		return &ipc_msg.IpcMsgEntry{}
	}
	extra = func(m proto.Message) int {
		switch e := m.(type) {
		case *ipc_msg.IpcMsgEntry:
			left = int(e.GetQnum())
			return 0
		case *ipc_msg.IpcMsg:
			return int((int64(e.GetMsize()) + 7) &^ 7)
		}
		return -1
	}
	return next, extra, func() bool { return left == 0 }
}

// checkGhost checks a ghost file's content after its entry: raw bytes
// to the end, or chunks (an entry of offset and length, then the bytes)
// in order within the file's size.
func checkGhost(im *image, lim Limits) error {
	g := im.entries[0].msg.(*ghost_file.GhostFileEntry)
	if !g.GetChunks() {
		if g.Size != nil && uint64(len(im.rest)) != g.GetSize() {
			return refuse(im.name, "%d bytes of content, its entry says %d", len(im.rest), g.GetSize())
		}
		return nil
	}
	chunks, _, err := decodeFrames(im.name, im.rest, 0, entryBounds{size: lim.EntryBytes, count: lim.Entries},
		msgOf[ghost_file.GhostChunkEntry](), func(m proto.Message) int {
			if n := m.(*ghost_file.GhostChunkEntry).GetLen(); n <= 1<<40 {
				return int(n)
			}
			return -1
		})
	if err != nil {
		return refuse(im.name, "chunks: %v", err)
	}
	var end uint64
	for i, c := range chunks {
		e := c.msg.(*ghost_file.GhostChunkEntry)
		if e.GetOff() < end || e.GetOff()+e.GetLen() < e.GetOff() || e.GetOff()+e.GetLen() > g.GetSize() {
			return refuse(im.name, "chunk %d (%d bytes at %d) out of order or beyond the file's %d bytes", i, e.GetLen(), e.GetOff(), g.GetSize())
		}
		end = e.GetOff() + e.GetLen()
	}
	return nil
}
