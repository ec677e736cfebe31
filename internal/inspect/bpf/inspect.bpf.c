// SPDX-License-Identifier: (MIT OR GPL-2.0)
/*
 * molt inspector: records what the processes of watched sandboxes do to the
 * OS. See ../doc.go for the design; inspect.h for the event ABI.
 *
 * All programs are BTF-enabled raw tracepoints (tp_btf): no tracefs, typed
 * arguments, lowest overhead. Kernel struct offsets are CO-RE relocations
 * (kernel.h).
 */
#include <linux/bpf.h>
#include "kernel.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>
#include "inspect.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* x86_64 syscall numbers. */
#define NR_write 1
#define NR_open 2
#define NR_mmap 9
#define NR_mprotect 10
#define NR_ioctl 16
#define NR_pwrite64 18
#define NR_writev 20
#define NR_madvise 28
#define NR_sendfile 40
#define NR_connect 42
#define NR_accept 43
#define NR_bind 49
#define NR_listen 50
#define NR_truncate 76
#define NR_ftruncate 77
#define NR_rename 82
#define NR_mkdir 83
#define NR_rmdir 84
#define NR_creat 85
#define NR_link 86
#define NR_unlink 87
#define NR_symlink 88
#define NR_chmod 90
#define NR_fchmod 91
#define NR_chown 92
#define NR_fchown 93
#define NR_lchown 94
#define NR_ptrace 101
#define NR_utime 132
#define NR_mknod 133
#define NR_pivot_root 155
#define NR_acct 163
#define NR_mount 165
#define NR_umount2 166
#define NR_swapon 167
#define NR_swapoff 168
#define NR_setxattr 188
#define NR_lsetxattr 189
#define NR_fsetxattr 190
#define NR_removexattr 197
#define NR_lremovexattr 198
#define NR_fremovexattr 199
#define NR_io_submit 209
#define NR_utimes 235
#define NR_openat 257
#define NR_mkdirat 258
#define NR_mknodat 259
#define NR_fchownat 260
#define NR_futimesat 261
#define NR_unlinkat 263
#define NR_renameat 264
#define NR_linkat 265
#define NR_symlinkat 266
#define NR_fchmodat 268
#define NR_splice 275
#define NR_utimensat 280
#define NR_fallocate 285
#define NR_accept4 288
#define NR_pwritev 296
#define NR_process_vm_writev 311
#define NR_renameat2 316
#define NR_bpf 321
#define NR_copy_file_range 326
#define NR_pwritev2 328
#define NR_io_uring_setup 425
#define NR_io_uring_enter 426
#define NR_io_uring_register 427
#define NR_open_tree 428
#define NR_move_mount 429
#define NR_fsmount 432
#define NR_fspick 433
#define NR_openat2 437
#define NR_mount_setattr 442
#define NR_fchmodat2 452
#define NR_setxattrat 463
#define NR_removexattrat 466
#define NR_open_tree_attr 467
#define NR_file_setattr 469

#define X32_SYSCALL_BIT 0x40000000
#define TS_COMPAT 0x0002

#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200
#define O_CREAT 0100
#define O_WRONLY 01
#define O_TRUNC 01000
#define RENAME_EXCHANGE (1 << 1)
#define PROT_WRITE 0x2
#define MAP_TYPE 0x0f
#define MAP_SHARED 0x01
#define MAP_SHARED_VALIDATE 0x03
#define MADV_REMOVE 9
#define VM_SHARED 0x00000008
#define OPEN_TREE_CLONE 1
#define EINPROGRESS 115

#define S_IFMT 00170000
#define S_IFSOCK 0140000
#define S_IFREG 0100000

#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10

/* ptrace requests that modify the tracee. */
#define PTRACE_POKETEXT 4
#define PTRACE_POKEDATA 5
#define PTRACE_POKEUSR 6
#define PTRACE_SETREGS 13
#define PTRACE_SETFPREGS 15
#define PTRACE_SETFPXREGS 19
#define PTRACE_SETSIGINFO 0x4203
#define PTRACE_SETREGSET 0x4205

/* ioctls that modify the file they are issued on. */
#define FICLONE 0x40049409u
#define FICLONERANGE 0x4020940du
#define FS_IOC_SETFLAGS 0x40086602u
#define FS_IOC32_SETFLAGS 0x40046602u
#define FS_IOC_FSSETXATTR 0x401c5820u
#define BTRFS_IOCTL_MAGIC 0x94

/* Buffer geometry: up to NSEG segments, each at most SEG_MAX bytes, packed
 * into data[]. Writes go to data[off & DATA_MASK] with at most SEG_MAX bytes,
 * so data[] has SEG_MAX bytes of slack past DATA_SZ. */
#define DATA_SZ 16384
#define DATA_MASK (DATA_SZ - 1)
#define SEG_MAX 4096
#define NAME_B 256
#define WALK_MAX 96
#define SOCKADDR_MAX 128

struct walk_state {
	__u64 dentry;
	__u64 vmnt;
	__u64 root_d;
	__u64 root_m;
	__u64 mnt_off;
	__u32 off;
	__u32 start;
	__u32 fl;
	__u32 _pad;
};

struct event {
	struct ev_hdr h;
	char data[DATA_SZ + SEG_MAX];
	struct walk_state ws; /* not sent */
};

/* ---- maps ---- */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* overridden by Options.RingBytes */
} events SEC(".maps");

/* cgroup2 id -> watch. Written only by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct watch_val);
} watched SEC(".maps");

/* [0] = bitmask of cgroup levels at which some watched cgroup sits, so that
 * tasks in descendant cgroups are attributed to the watched ancestor. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} levels SEC(".maps");

/* cgroup2 id -> events that could not be put on the ring. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} drops SEC(".maps");

struct scratch {
	__u64 cgid;
	__u64 p1, p2; /* user pointers */
	__u64 a, b;   /* misc */
	__s32 fd1, fd2;
	__u32 nr;
	__u32 cls;
	__u32 op1, op2;
};

/* pid_tgid -> syscall state carried from sys_enter to sys_exit. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct scratch);
} inflight SEC(".maps");

struct dedup_key {
	__u64 cgid;
	__u64 file;
	__u64 dentry;
	__u64 ino;
	__u32 op;
	__u32 _pad;
};

/* Write-like events already reported in the current turn. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, struct dedup_key);
	__type(value, __u32);
} dedup SEC(".maps");

struct unk_key {
	__u64 cgid;
	__u64 flag;
};

/* Unknown flags already reported in the current turn. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct unk_key);
	__type(value, __u32);
} unkseen SEC(".maps");

/* One event buffer per program and CPU (a program does not re-enter on the
 * same CPU; different programs may interleave, so they do not share). */
struct evbuf {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event);
};
struct evbuf buf_exit SEC(".maps");
struct evbuf buf_exec SEC(".maps");

/* ---- filtering ---- */

static __always_inline struct watch_val *lookup_watch(__u64 *cgid)
{
	__u64 id = bpf_get_current_cgroup_id();
	struct watch_val *w = bpf_map_lookup_elem(&watched, &id);
	if (w) {
		*cgid = id;
		return w;
	}
	__u32 zero = 0;
	__u64 *lv = bpf_map_lookup_elem(&levels, &zero);
	if (!lv)
		return 0;
	__u64 mask = *lv;
	if (!mask)
		return 0;
	for (int l = 1; l < 24; l++) {
		if (!(mask & (1ULL << l)))
			continue;
		__u64 a = bpf_get_current_ancestor_cgroup_id(l);
		if (!a)
			break; /* deeper than the task's cgroup */
		if (a == id)
			break; /* that is the task's own cgroup: not watched */
		w = bpf_map_lookup_elem(&watched, &a);
		if (w) {
			*cgid = a;
			return w;
		}
	}
	return 0;
}

/* Is task t in pid namespace inum or one of its descendants? */
static __always_inline bool in_tree(struct task_struct *t, __u64 inum)
{
	struct pid *pid = BPF_CORE_READ(t, thread_pid);
	if (!pid)
		return false;
	unsigned int level = BPF_CORE_READ(pid, level);
	if (level > 32)
		return false;
	struct upid *up = (void *)pid + bpf_core_field_offset(struct pid, numbers) +
			  (__u64)level * bpf_core_type_size(struct upid);
	struct pid_namespace *ns = BPF_CORE_READ(up, ns);
	for (int i = 0; i < 33; i++) {
		if (!ns)
			return false;
		if (BPF_CORE_READ(ns, ns.inum) == inum)
			return true;
		if (BPF_CORE_READ(ns, level) == 0)
			return false;
		ns = BPF_CORE_READ(ns, parent);
	}
	return false;
}

static __always_inline struct watch_val *filter(struct task_struct *t, __u64 *cgid)
{
	struct watch_val *w = lookup_watch(cgid);
	if (!w)
		return 0;
	if (!in_tree(t, w->pidns))
		return 0;
	return w;
}

/* ---- helpers ---- */

static __always_inline void count_drop(__u64 cgid)
{
	__u64 *c = bpf_map_lookup_elem(&drops, &cgid);
	if (c) {
		__sync_fetch_and_add(c, 1);
		return;
	}
	__u64 one = 1;
	if (bpf_map_update_elem(&drops, &cgid, &one, BPF_NOEXIST)) {
		c = bpf_map_lookup_elem(&drops, &cgid);
		if (c)
			__sync_fetch_and_add(c, 1);
	}
}

static __always_inline void hdr_init(struct ev_hdr *h, __u32 kind, __u64 cgid, __u32 gen)
{
	__u64 pt = bpf_get_current_pid_tgid();
	h->cgid = cgid;
	h->ret = 0;
	h->gen = gen;
	h->kind = kind;
	h->pid = pt >> 32;
	h->tid = (__u32)pt;
	h->ppid = 0;
	h->nr = 0;
	h->op1 = 0;
	h->op2 = 0;
	h->magic1 = 0;
	h->magic2 = 0;
	h->aux = 0;
	for (int i = 0; i < NSEG; i++) {
		h->seglen[i] = 0;
		h->segfl[i] = 0;
	}
	bpf_get_current_comm(h->comm, sizeof(h->comm));
}

static __always_inline int send(struct event *e, __u32 off)
{
	__u64 sz = off;
	if (sz > DATA_SZ + SEG_MAX)
		sz = DATA_SZ + SEG_MAX;
	asm volatile("" : "+r"(sz)); /* keep the clamped value for the verifier */
	if (bpf_ringbuf_output(&events, e, sizeof(struct ev_hdr) + sz, 0)) {
		count_drop(e->h.cgid);
		return -1;
	}
	return 0;
}

static __always_inline int send_hdr(struct ev_hdr *h)
{
	if (bpf_ringbuf_output(&events, h, sizeof(*h), 0)) {
		count_drop(h->cgid);
		return -1;
	}
	return 0;
}

static __always_inline void emit_unknown(__u64 cgid, struct watch_val *w, __u32 flag)
{
	__u32 gen = w->gen;
	struct unk_key k = {.cgid = cgid, .flag = flag};
	/* io_uring keeps working without syscalls (SQPOLL, io-wq threads):
	 * user space needs to know every process that set one up. */
	if (flag == FLAG_IO_URING)
		k.flag |= bpf_get_current_pid_tgid() & 0xffffffff00000000ULL;
	__u32 *seen = bpf_map_lookup_elem(&unkseen, &k);
	if (seen && *seen == gen)
		return;
	struct ev_hdr h;
	hdr_init(&h, EV_UNKNOWN, cgid, gen);
	h.op1 = flag;
	if (send_hdr(&h) == 0)
		bpf_map_update_elem(&unkseen, &k, &gen, BPF_ANY);
}

static __always_inline struct file *fd_file(struct task_struct *t, int fd)
{
	if (fd < 0)
		return 0;
	struct files_struct *files = BPF_CORE_READ(t, files);
	if (!files)
		return 0;
	struct fdtable *fdt = BPF_CORE_READ(files, fdt);
	if (!fdt)
		return 0;
	if ((unsigned int)fd >= BPF_CORE_READ(fdt, max_fds))
		return 0;
	struct file **arr = BPF_CORE_READ(fdt, fd);
	struct file *f = 0;
	bpf_probe_read_kernel(&f, sizeof(f), &arr[fd]);
	return f;
}

static __always_inline unsigned short file_mode(struct file *f)
{
	return BPF_CORE_READ(f, f_inode, i_mode) & S_IFMT;
}

static __always_inline bool dentry_unlinked(struct dentry *d)
{
	struct hlist_bl_node **pprev = BPF_CORE_READ(d, d_hash.pprev);
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	return !pprev && parent != d;
}

/* ---- path resolution ---- */

/* bpf_loop callback context. The walk cursor lives in the map value (struct
 * walk_state), not on the stack: map contents are unknown scalars to the
 * verifier, so the callback's states converge instead of being explored once
 * per possible offset. */
struct walk_ctx {
	struct event *e;
};

/* One step of the d_path-like walk from a dentry up to the task's root,
 * writing component names leaf first, each NUL terminated. */
static long walk_step(__u64 idx, struct walk_ctx *c)
{
	struct event *e = c->e;
	struct walk_state *ws = &e->ws;
	struct dentry *d = (void *)ws->dentry;
	struct vfsmount *vm = (void *)ws->vmnt;
	if (!d || !vm) {
		ws->fl |= SEG_ERR;
		return 1;
	}
	if ((__u64)d == ws->root_d && (__u64)vm == ws->root_m) {
		ws->fl |= SEG_OK;
		return 1;
	}
	struct dentry *mroot = BPF_CORE_READ(vm, mnt_root);
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	if (d == mroot || d == parent) {
		struct mount *m = (void *)vm - ws->mnt_off;
		if (d != mroot) {
			/* A dentry not connected to its mount's tree. On a
			 * kernel-internal mount (memfd, shm, pipes: mnt_ns is
			 * not a real namespace) it is anonymous and nothing
			 * visible changes; elsewhere (open_by_handle_at) it is
			 * a real file we cannot name. */
			__u64 ns = (__u64)BPF_CORE_READ(m, mnt_ns);
			if (ns < 4096 || ns >= (__u64)-4095)
				ws->fl |= SEG_ANON;
			else
				ws->fl |= SEG_ERR;
			return 1;
		}
		struct mount *mp = BPF_CORE_READ(m, mnt_parent);
		if (!mp || mp == m) {
			ws->fl |= SEG_OUTSIDE;
			return 1;
		}
		ws->dentry = (__u64)BPF_CORE_READ(m, mnt_mountpoint);
		ws->vmnt = (__u64)mp + ws->mnt_off;
		return 0;
	}
	__u32 off = ws->off;
	if (off - ws->start > SEG_MAX - NAME_B || off > DATA_SZ - NAME_B) {
		ws->fl |= SEG_TRUNC;
		return 1;
	}
	const unsigned char *name = BPF_CORE_READ(d, d_name.name);
	long n = bpf_probe_read_kernel_str(&e->data[off & DATA_MASK], NAME_B, name);
	if (n <= 0) {
		ws->fl |= SEG_ERR;
		return 1;
	}
	ws->off = off + (__u32)n;
	ws->dentry = (__u64)parent;
	return 0;
}

/* Appends path {vmnt, dentry} as segment seg. Returns the new offset. */
static __always_inline __u32 put_path(struct event *e, __u32 off, int seg, struct task_struct *t,
				      struct vfsmount *vmnt, struct dentry *dentry)
{
	struct walk_state *ws = &e->ws;
	ws->dentry = (__u64)dentry;
	ws->vmnt = (__u64)vmnt;
	ws->root_d = (__u64)BPF_CORE_READ(t, fs, root.dentry);
	ws->root_m = (__u64)BPF_CORE_READ(t, fs, root.mnt);
	ws->mnt_off = bpf_core_field_offset(struct mount, mnt);
	ws->off = off;
	ws->start = off;
	ws->fl = 0;
	struct walk_ctx c = {.e = e};
	long n = bpf_loop(WALK_MAX, walk_step, &c, 0);
	__u32 fl = ws->fl;
	if (n < 0)
		fl |= SEG_ERR;
	else if (fl == 0)
		fl = SEG_TRUNC; /* loop budget exhausted */
	if (dentry && dentry_unlinked(dentry))
		fl |= SEG_DELETED;
	__u32 end = ws->off;
	if (end < off || end - off > SEG_MAX) {
		fl |= SEG_ERR;
		end = off;
	}
	if (seg >= 0 && seg < NSEG) {
		e->h.seglen[seg] = end - off;
		e->h.segfl[seg] = fl;
	}
	return end;
}

static __always_inline __u32 put_file(struct event *e, __u32 off, int seg, struct task_struct *t,
				      struct file *f)
{
	struct vfsmount *m = BPF_CORE_READ(f, f_path.mnt);
	struct dentry *d = BPF_CORE_READ(f, f_path.dentry);
	return put_path(e, off, seg, t, m, d);
}

/* User string as segment seg. */
static __always_inline __u32 put_ustr(struct event *e, __u32 off, int seg, const char *p)
{
	__u8 fl = SEG_OK;
	__u32 len = 0;
	if (p) {
		if (off >= DATA_SZ) {
			fl = SEG_TRUNC;
		} else {
			long n = bpf_probe_read_user_str(&e->data[off & DATA_MASK], SEG_MAX, p);
			if (n <= 0) {
				fl = SEG_ERR;
			} else {
				len = n;
				if (n >= SEG_MAX)
					fl = SEG_TRUNC;
			}
		}
	}
	if (seg >= 0 && seg < NSEG) {
		e->h.seglen[seg] = len;
		e->h.segfl[seg] = fl;
	}
	return off + len;
}

/* Directory a *at() call resolves relative names against. */
static __always_inline __u32 put_dir(struct event *e, __u32 off, int seg, struct task_struct *t,
				     int dfd, __u32 *magic)
{
	struct vfsmount *m;
	struct dentry *d;
	if (dfd == AT_FDCWD) {
		m = BPF_CORE_READ(t, fs, pwd.mnt);
		d = BPF_CORE_READ(t, fs, pwd.dentry);
	} else {
		struct file *f = fd_file(t, dfd);
		if (!f) {
			if (seg >= 0 && seg < NSEG)
				e->h.segfl[seg] = SEG_ERR;
			return off;
		}
		m = BPF_CORE_READ(f, f_path.mnt);
		d = BPF_CORE_READ(f, f_path.dentry);
	}
	*magic = BPF_CORE_READ(d, d_sb, s_magic);
	return put_path(e, off, seg, t, m, d);
}

/* ---- sys_enter ---- */

enum {
	C_NONE,
	C_FD,       /* fd1: an fd that is written / changed (op1) */
	C_OPEN,     /* open*: a = flags */
	C_PATH,     /* (fd1, p1, op1) and (fd2, p2, op2) */
	C_MMAP,     /* fd1 */
	C_MPROTECT, /* a = addr, b = len */
	C_SOCK,     /* op1 = SOCK_*, fd1, p1 = sockaddr, b = len */
	C_IOCTL,    /* fd1, op1 */
};

static __always_inline bool btrfs_ioctl_readonly(__u32 cmd)
{
	__u32 nr = cmd & 0xff;
	__u32 dir = cmd >> 30;
	if (dir == 2) /* _IOC_READ only */
		return true;
	switch (nr) {
	case 17: /* TREE_SEARCH(_V2) */
	case 18: /* INO_LOOKUP */
	case 35: /* INO_PATHS */
	case 36: /* LOGICAL_INO */
	case 54: /* FIDEDUPERANGE: content unchanged */
	case 59: /* LOGICAL_INO_V2 */
	case 61: /* GET_SUBVOL_ROOTREF */
	case 62: /* INO_LOOKUP_USER */
		return true;
	}
	return false;
}

SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter, struct pt_regs *regs, long id)
{
	struct task_struct *bt = bpf_get_current_task_btf();
	struct task_struct *t = bt;
	__u64 cgid = 0;
	struct watch_val *w;

	/* Direct (BTF) load: cheaper than a probe read on every syscall. */
	if ((id & X32_SYSCALL_BIT) || (bt->thread_info.status & TS_COMPAT)) {
		w = filter(t, &cgid);
		if (w)
			emit_unknown(cgid, w, FLAG_COMPAT);
		return 0;
	}

	struct scratch s = {};
	__u32 flag = 0;
	switch (id) {
	case NR_write:
	case NR_pwrite64:
	case NR_writev:
	case NR_pwritev:
	case NR_pwritev2:
	case NR_fallocate:
	case NR_sendfile:
		s.cls = C_FD;
		s.op1 = OP_WRITE;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_copy_file_range:
	case NR_splice:
		s.cls = C_FD;
		s.op1 = OP_WRITE;
		s.fd1 = BPF_CORE_READ(regs, dx);
		break;
	case NR_ftruncate:
		s.cls = C_FD;
		s.op1 = OP_TRUNCATE;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_fchmod:
		s.cls = C_FD;
		s.op1 = OP_CHMOD;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_fchown:
		s.cls = C_FD;
		s.op1 = OP_CHOWN;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_fsetxattr:
	case NR_fremovexattr:
		s.cls = C_FD;
		s.op1 = OP_XATTR;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_open:
		s.cls = C_OPEN;
		s.a = BPF_CORE_READ(regs, si);
		break;
	case NR_creat:
		s.cls = C_OPEN;
		s.a = O_CREAT | O_WRONLY | O_TRUNC;
		break;
	case NR_openat:
		s.cls = C_OPEN;
		s.a = BPF_CORE_READ(regs, dx);
		break;
	case NR_openat2: {
		struct open_how *how = (void *)BPF_CORE_READ(regs, dx);
		__u64 fl = 0;
		if (bpf_probe_read_user(&fl, sizeof(fl), &how->flags))
			fl = O_CREAT | O_TRUNC; /* cannot tell: assume the worst */
		s.cls = C_OPEN;
		s.a = fl;
		break;
	}
	/* path-based, relative to cwd */
	case NR_truncate:
	case NR_unlink:
	case NR_rmdir:
	case NR_mkdir:
	case NR_mknod:
	case NR_chmod:
	case NR_chown:
	case NR_lchown:
	case NR_utime:
	case NR_utimes:
	case NR_setxattr:
	case NR_lsetxattr:
	case NR_removexattr:
	case NR_lremovexattr:
		s.cls = C_PATH;
		s.fd1 = AT_FDCWD;
		s.p1 = BPF_CORE_READ(regs, di);
		switch (id) {
		case NR_truncate: s.op1 = OP_TRUNCATE; break;
		case NR_unlink: s.op1 = OP_DELETE; break;
		case NR_rmdir: s.op1 = OP_RMDIR; break;
		case NR_mkdir: s.op1 = OP_MKDIR; break;
		case NR_mknod: s.op1 = OP_MKNOD; break;
		case NR_chmod: s.op1 = OP_CHMOD; break;
		case NR_chown:
		case NR_lchown: s.op1 = OP_CHOWN; break;
		case NR_utime:
		case NR_utimes: s.op1 = OP_UTIMES; break;
		default: s.op1 = OP_XATTR; break;
		}
		break;
	/* path-based, (dirfd, path, ...) */
	case NR_unlinkat:
	case NR_mkdirat:
	case NR_mknodat:
	case NR_fchmodat:
	case NR_fchmodat2:
	case NR_fchownat:
	case NR_utimensat:
	case NR_futimesat:
	case NR_setxattrat:
	case NR_removexattrat:
	case NR_file_setattr:
		s.cls = C_PATH;
		s.fd1 = BPF_CORE_READ(regs, di);
		s.p1 = BPF_CORE_READ(regs, si); /* NULL (utimensat) = the fd itself */
		switch (id) {
		case NR_unlinkat:
			s.op1 = (BPF_CORE_READ(regs, dx) & AT_REMOVEDIR) ? OP_RMDIR : OP_DELETE;
			break;
		case NR_mkdirat: s.op1 = OP_MKDIR; break;
		case NR_mknodat: s.op1 = OP_MKNOD; break;
		case NR_fchmodat:
		case NR_fchmodat2: s.op1 = OP_CHMOD; break;
		case NR_fchownat: s.op1 = OP_CHOWN; break;
		case NR_utimensat:
		case NR_futimesat: s.op1 = OP_UTIMES; break;
		default: s.op1 = OP_XATTR; break;
		}
		break;
	case NR_symlink:
		s.cls = C_PATH;
		s.fd1 = AT_FDCWD;
		s.p1 = BPF_CORE_READ(regs, si);
		s.op1 = OP_SYMLINK;
		break;
	case NR_symlinkat:
		s.cls = C_PATH;
		s.fd1 = BPF_CORE_READ(regs, si);
		s.p1 = BPF_CORE_READ(regs, dx);
		s.op1 = OP_SYMLINK;
		break;
	case NR_link:
		s.cls = C_PATH;
		s.fd2 = AT_FDCWD;
		s.p2 = BPF_CORE_READ(regs, si);
		s.op2 = OP_LINK;
		break;
	case NR_linkat:
		s.cls = C_PATH;
		s.fd2 = BPF_CORE_READ(regs, dx);
		s.p2 = BPF_CORE_READ(regs, r10);
		s.op2 = OP_LINK;
		break;
	case NR_rename:
		s.cls = C_PATH;
		s.fd1 = AT_FDCWD;
		s.p1 = BPF_CORE_READ(regs, di);
		s.fd2 = AT_FDCWD;
		s.p2 = BPF_CORE_READ(regs, si);
		s.op1 = OP_RENAME_FROM;
		s.op2 = OP_RENAME_TO;
		break;
	case NR_renameat:
	case NR_renameat2:
		s.cls = C_PATH;
		s.fd1 = BPF_CORE_READ(regs, di);
		s.p1 = BPF_CORE_READ(regs, si);
		s.fd2 = BPF_CORE_READ(regs, dx);
		s.p2 = BPF_CORE_READ(regs, r10);
		s.op1 = OP_RENAME_FROM;
		s.op2 = OP_RENAME_TO;
		if (id == NR_renameat2 && (BPF_CORE_READ(regs, r8) & RENAME_EXCHANGE)) {
			s.op1 |= OP_RENAME_TO;
			s.op2 |= OP_RENAME_FROM;
		}
		break;
	case NR_mmap: {
		unsigned long prot = BPF_CORE_READ(regs, dx);
		unsigned long fl = BPF_CORE_READ(regs, r10) & MAP_TYPE;
		if (!(prot & PROT_WRITE) || (fl != MAP_SHARED && fl != MAP_SHARED_VALIDATE))
			return 0;
		s.cls = C_MMAP;
		s.op1 = OP_MMAP_WRITE;
		s.fd1 = BPF_CORE_READ(regs, r8);
		break;
	}
	case NR_mprotect:
		if (!(BPF_CORE_READ(regs, dx) & PROT_WRITE))
			return 0;
		s.cls = C_MPROTECT;
		s.a = BPF_CORE_READ(regs, di);
		s.b = BPF_CORE_READ(regs, si);
		break;
	case NR_bind:
	case NR_connect:
		s.cls = C_SOCK;
		s.op1 = id == NR_bind ? SOCK_BIND : SOCK_CONNECT;
		s.fd1 = BPF_CORE_READ(regs, di);
		s.p1 = BPF_CORE_READ(regs, si);
		s.b = BPF_CORE_READ(regs, dx);
		break;
	case NR_listen:
		s.cls = C_SOCK;
		s.op1 = SOCK_LISTEN;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_accept:
	case NR_accept4:
		s.cls = C_SOCK;
		s.op1 = SOCK_ACCEPT;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	case NR_ioctl: {
		__u32 cmd = BPF_CORE_READ(regs, si);
		if (cmd == FICLONE || cmd == FICLONERANGE) {
			s.op1 = OP_WRITE;
		} else if (cmd == FS_IOC_SETFLAGS || cmd == FS_IOC32_SETFLAGS ||
			   cmd == FS_IOC_FSSETXATTR) {
			s.op1 = OP_XATTR;
		} else if (((cmd >> 8) & 0xff) == BTRFS_IOCTL_MAGIC && !btrfs_ioctl_readonly(cmd)) {
			flag = FLAG_BTRFS_IOCTL;
			break;
		} else {
			return 0;
		}
		s.cls = C_IOCTL;
		s.fd1 = BPF_CORE_READ(regs, di);
		break;
	}
	/* conservative flags */
	case NR_mount: flag = FLAG_MOUNT; break;
	case NR_umount2: flag = FLAG_UMOUNT; break;
	case NR_pivot_root: flag = FLAG_PIVOT_ROOT; break;
	case NR_move_mount: flag = FLAG_MOVE_MOUNT; break;
	case NR_fsmount: flag = FLAG_FSMOUNT; break;
	case NR_fspick: flag = FLAG_FSPICK; break;
	case NR_mount_setattr: flag = FLAG_MOUNT_SETATTR; break;
	case NR_open_tree:
	case NR_open_tree_attr:
		if (!(BPF_CORE_READ(regs, dx) & OPEN_TREE_CLONE))
			return 0;
		flag = FLAG_OPEN_TREE;
		break;
	case NR_ptrace:
		switch (BPF_CORE_READ(regs, di)) {
		case PTRACE_POKETEXT:
		case PTRACE_POKEDATA:
		case PTRACE_POKEUSR:
		case PTRACE_SETREGS:
		case PTRACE_SETFPREGS:
		case PTRACE_SETFPXREGS:
		case PTRACE_SETSIGINFO:
		case PTRACE_SETREGSET:
			flag = FLAG_PTRACE;
			break;
		default:
			return 0;
		}
		break;
	case NR_process_vm_writev: flag = FLAG_PROCESS_VM_WRITEV; break;
	case NR_io_uring_setup:
	case NR_io_uring_enter:
	case NR_io_uring_register: flag = FLAG_IO_URING; break;
	case NR_io_submit: flag = FLAG_AIO; break;
	case NR_madvise:
		if (BPF_CORE_READ(regs, dx) != MADV_REMOVE)
			return 0;
		flag = FLAG_MADVISE_REMOVE;
		break;
	case NR_swapon:
	case NR_swapoff: flag = FLAG_SWAP; break;
	case NR_acct: flag = FLAG_ACCT; break;
	case NR_bpf: flag = FLAG_BPF; break;
	default:
		return 0;
	}

	w = filter(t, &cgid);
	if (!w)
		return 0;
	if (flag) {
		emit_unknown(cgid, w, flag);
		return 0;
	}
	if (s.cls == C_OPEN && !(s.a & (O_CREAT | O_TRUNC)))
		return 0;
	if (s.cls == C_FD) {
		/* Cheap early outs for the hottest calls: writes to pipes,
		 * sockets, ttys, and files already reported this turn. */
		struct file *f = fd_file(t, s.fd1);
		if (!f || file_mode(f) != S_IFREG)
			return 0;
		struct dedup_key k = {
			.cgid = cgid,
			.file = (__u64)f,
			.dentry = (__u64)BPF_CORE_READ(f, f_path.dentry),
			.ino = BPF_CORE_READ(f, f_inode, i_ino),
			.op = s.op1,
		};
		__u32 *g = bpf_map_lookup_elem(&dedup, &k);
		if (g && *g == w->gen)
			return 0;
	}
	s.cgid = cgid;
	s.nr = id;
	__u64 key = bpf_get_current_pid_tgid();
	bpf_map_update_elem(&inflight, &key, &s, BPF_ANY);
	return 0;
}

/* ---- sys_exit ---- */

struct vma_ctx {
	__u64 file;
	__u64 flags;
	__u64 end;
};

static long vma_cb(struct task_struct *task, struct vm_area_struct *vma, struct vma_ctx *c)
{
	c->file = (__u64)BPF_CORE_READ(vma, vm_file);
	c->flags = BPF_CORE_READ(vma, vm_flags);
	c->end = BPF_CORE_READ(vma, vm_end);
	return 0;
}

/* Event for a change made through an open file. */
static __always_inline void emit_file(struct event *e, struct task_struct *t, struct scratch *s,
				      struct watch_val *w, struct file *f, __u32 op, bool dedupe, long ret)
{
	if (!f || file_mode(f) != S_IFREG)
		return;
	struct dentry *d = BPF_CORE_READ(f, f_path.dentry);
	if (dentry_unlinked(d))
		return; /* anonymous temp file: no visible change (linkat is traced) */
	__u32 gen = w->gen;
	hdr_init(&e->h, EV_FD, s->cgid, gen);
	e->h.nr = s->nr;
	e->h.ret = ret;
	e->h.op1 = op;
	e->h.magic1 = BPF_CORE_READ(f, f_inode, i_sb, s_magic);
	__u32 off = put_file(e, 0, 0, t, f);
	if (e->h.segfl[0] & SEG_ANON)
		return; /* memfd, shm and other internal files */
	if (send(e, off) == 0 && dedupe) {
		struct dedup_key k = {
			.cgid = s->cgid,
			.file = (__u64)f,
			.dentry = (__u64)d,
			.ino = BPF_CORE_READ(f, f_inode, i_ino),
			.op = op,
		};
		bpf_map_update_elem(&dedup, &k, &gen, BPF_ANY);
	}
}

static __always_inline __u32 put_sock(struct event *e, __u32 off, int seg, struct file *f, bool peer)
{
	__u8 sa[SOCKADDR_MAX] = {};
	__u32 len = 0;
	struct socket *so = BPF_CORE_READ(f, private_data);
	struct sock *sk = BPF_CORE_READ(so, sk);
	unsigned short fam = BPF_CORE_READ(sk, __sk_common.skc_family);
	*(__u16 *)&sa[0] = fam;
	len = 2;
	if (fam == AF_INET) {
		__u16 port;
		__u32 addr;
		if (peer) {
			port = BPF_CORE_READ(sk, __sk_common.skc_dport);
			addr = BPF_CORE_READ(sk, __sk_common.skc_daddr);
		} else {
			port = bpf_htons(BPF_CORE_READ(sk, __sk_common.skc_num));
			addr = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		}
		*(__u16 *)&sa[2] = port;
		*(__u32 *)&sa[4] = addr;
		len = 16;
	} else if (fam == AF_INET6) {
		__u16 port;
		if (peer) {
			port = BPF_CORE_READ(sk, __sk_common.skc_dport);
			BPF_CORE_READ_INTO(&sa[8], sk, __sk_common.skc_v6_daddr);
		} else {
			port = bpf_htons(BPF_CORE_READ(sk, __sk_common.skc_num));
			BPF_CORE_READ_INTO(&sa[8], sk, __sk_common.skc_v6_rcv_saddr);
		}
		*(__u16 *)&sa[2] = port;
		len = 28;
	} else if (fam == AF_UNIX && !peer) {
		struct unix_address *ua = BPF_CORE_READ((struct unix_sock *)sk, addr);
		if (ua) {
			int n = BPF_CORE_READ(ua, len);
			if (n > 110)
				n = 110;
			asm volatile("" : "+r"(n));
			if (n > 0) {
				bpf_probe_read_kernel(sa, n & 0x7f, (void *)ua + bpf_core_field_offset(struct unix_address, name));
				len = n;
			}
		}
	}
	if (off >= DATA_SZ)
		return off;
	__builtin_memcpy(&e->data[off & DATA_MASK], sa, SOCKADDR_MAX);
	if (seg >= 0 && seg < NSEG) {
		e->h.seglen[seg] = len;
		e->h.segfl[seg] = SEG_OK;
	}
	return off + len;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit, struct pt_regs *regs, long ret)
{
	__u64 key = bpf_get_current_pid_tgid();
	struct scratch *sp = bpf_map_lookup_elem(&inflight, &key);
	if (!sp)
		return 0;
	struct scratch s = *sp;
	bpf_map_delete_elem(&inflight, &key);

	struct watch_val *w = bpf_map_lookup_elem(&watched, &s.cgid);
	if (!w)
		return 0;
	struct task_struct *t = (void *)bpf_get_current_task();
	__u32 zero = 0;
	struct event *e = bpf_map_lookup_elem(&buf_exit, &zero);
	if (!e)
		return 0;

	switch (s.cls) {
	case C_FD:
	case C_IOCTL:
		if (ret < 0)
			return 0;
		emit_file(e, t, &s, w, fd_file(t, s.fd1), s.op1, s.cls == C_FD, ret);
		return 0;
	case C_MMAP:
		if ((unsigned long)ret >= (unsigned long)-4095L)
			return 0;
		/* not deduplicated: user space tracks live mappings per process */
		emit_file(e, t, &s, w, fd_file(t, s.fd1), s.op1, false, 0);
		return 0;
	case C_OPEN: {
		if (ret < 0)
			return 0;
		__u32 op = 0;
		if (s.a & O_CREAT)
			op |= OP_CREATE;
		if (s.a & O_TRUNC)
			op |= OP_TRUNCATE;
		emit_file(e, t, &s, w, fd_file(t, ret), op, false, ret);
		return 0;
	}
	case C_MPROTECT: {
		if (ret < 0)
			return 0;
		struct vma_ctx vc = {};
		struct task_struct *bt = bpf_get_current_task_btf();
		long r = bpf_find_vma(bt, s.a, vma_cb, &vc, 0);
		if (r) {
			emit_unknown(s.cgid, w, FLAG_MPROTECT_SHARED);
			return 0;
		}
		if (vc.end < s.a + s.b)
			emit_unknown(s.cgid, w, FLAG_MPROTECT_SHARED); /* spans several mappings */
		if (vc.file && (vc.flags & VM_SHARED))
			emit_file(e, t, &s, w, (struct file *)vc.file, OP_MMAP_WRITE, false, 0);
		return 0;
	}
	case C_PATH: {
		if (ret < 0)
			return 0;
		hdr_init(&e->h, EV_PATH, s.cgid, w->gen);
		e->h.nr = s.nr;
		e->h.ret = ret;
		e->h.op1 = s.op1;
		e->h.op2 = s.op2;
		__u32 off = 0;
		__u32 m1 = 0, m2 = 0;
		if (s.op1) {
			__u32 start = off;
			off = put_ustr(e, off, 0, (const char *)s.p1);
			char c0 = e->data[start & DATA_MASK];
			if (!(e->h.seglen[0] > 1 && c0 == '/'))
				off = put_dir(e, off, 1, t, s.fd1, &m1);
			else
				e->h.segfl[1] = SEG_OK;
		}
		if (s.op2) {
			__u32 start = off;
			off = put_ustr(e, off, 2, (const char *)s.p2);
			char c0 = e->data[start & DATA_MASK];
			if (!(e->h.seglen[2] > 1 && c0 == '/'))
				off = put_dir(e, off, 3, t, s.fd2, &m2);
			else
				e->h.segfl[3] = SEG_OK;
		}
		e->h.magic1 = m1;
		e->h.magic2 = m2;
		send(e, off);
		return 0;
	}
	case C_SOCK: {
		bool ok = ret >= 0 || (s.op1 == SOCK_CONNECT && ret == -EINPROGRESS);
		if (!ok)
			return 0;
		hdr_init(&e->h, EV_SOCK, s.cgid, w->gen);
		e->h.nr = s.nr;
		e->h.ret = ret;
		e->h.op1 = s.op1;
		__u32 off = 0;
		if (s.op1 == SOCK_BIND || s.op1 == SOCK_CONNECT) {
			__u32 n = s.b;
			if (n > SOCKADDR_MAX)
				n = SOCKADDR_MAX;
			asm volatile("" : "+r"(n));
			if (n < 2)
				return 0;
			if (bpf_probe_read_user(&e->data[0], n & 0xff, (void *)s.p1))
				return 0;
			e->h.seglen[0] = n;
			e->h.segfl[0] = SEG_OK;
			off = n;
			__u16 fam = *(__u16 *)&e->data[0];
			if (s.op1 == SOCK_BIND && fam == AF_UNIX && n > 2 && e->data[2] != 0 &&
			    e->data[2] != '/') {
				__u32 m = 0;
				off = put_dir(e, off & 0xff, 1, t, AT_FDCWD, &m);
				e->h.magic1 = m;
			}
		} else {
			struct file *f = fd_file(t, s.op1 == SOCK_ACCEPT ? (int)ret : s.fd1);
			if (!f || file_mode(f) != S_IFSOCK)
				return 0;
			off = put_sock(e, 0, 0, f, false);
			if (s.op1 == SOCK_ACCEPT)
				off = put_sock(e, off & 0xff, 1, f, true);
		}
		send(e, off);
		return 0;
	}
	}
	return 0;
}

/* ---- processes ---- */

SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	int pid = BPF_CORE_READ(child, pid);
	int tgid = BPF_CORE_READ(child, tgid);
	if (pid != tgid)
		return 0; /* a new thread, not a new process */
	struct task_struct *t = (void *)bpf_get_current_task();
	__u64 cgid = 0;
	struct watch_val *w = filter(t, &cgid);
	if (!w)
		return 0;
	struct ev_hdr h;
	hdr_init(&h, EV_SPAWN, cgid, w->gen);
	h.pid = tgid;
	h.ppid = BPF_CORE_READ(parent, tgid);
	send_hdr(&h);
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(sched_process_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	__u64 cgid = 0;
	struct watch_val *w = filter(t, &cgid);
	if (!w)
		return 0;
	__u32 zero = 0;
	struct event *e = bpf_map_lookup_elem(&buf_exec, &zero);
	if (!e)
		return 0;
	hdr_init(&e->h, EV_EXEC, cgid, w->gen);
	e->h.aux = old_pid;
	struct file *f = BPF_CORE_READ(bprm, file);
	__u32 off = 0;
	if (f)
		off = put_file(e, off, 0, t, f);
	const char *fn = BPF_CORE_READ(bprm, filename);
	if (off < DATA_SZ) {
		long n = bpf_probe_read_kernel_str(&e->data[off & DATA_MASK], SEG_MAX, fn);
		if (n > 0) {
			e->h.seglen[1] = n;
			e->h.segfl[1] = SEG_OK;
			off += n;
		}
	}
	send(e, off);
	return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(sched_process_exit, struct task_struct *p, bool group_dead)
{
	__u64 key = bpf_get_current_pid_tgid();
	bpf_map_delete_elem(&inflight, &key);
	if (!group_dead)
		return 0;
	struct task_struct *t = (void *)bpf_get_current_task();
	__u64 cgid = 0;
	struct watch_val *w = filter(t, &cgid);
	if (!w)
		return 0;
	struct ev_hdr h;
	hdr_init(&h, EV_EXIT, cgid, w->gen);
	h.aux = BPF_CORE_READ(p, exit_code);
	h.pid = BPF_CORE_READ(p, tgid);
	send_hdr(&h);
	return 0;
}
