/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * ABI shared between inspect.bpf.c and the Go reader (events.go). Any change
 * here must be mirrored in the Go constants and parser.
 */
#ifndef MOLT_INSPECT_H
#define MOLT_INSPECT_H

/* Event kinds. */
#define EV_FD 1      /* seg0 = resolved path of an open file */
#define EV_PATH 2    /* seg0/1 = user string + dir of pair 1, seg2/3 = pair 2 */
#define EV_SPAWN 3   /* pid = new tgid, ppid = parent tgid */
#define EV_EXEC 4    /* seg0 = resolved path of the executable, seg1 = filename */
#define EV_EXIT 5    /* aux = exit_code */
#define EV_SOCK 6    /* op1 = SOCK_*, seg0 = sockaddr, seg1 = cwd (AF_UNIX bind) */
#define EV_UNKNOWN 7 /* op1 = FLAG_* */

/* File operation bits (op1/op2 of EV_FD and EV_PATH). */
#define OP_CREATE (1u << 0)
#define OP_WRITE (1u << 1)
#define OP_TRUNCATE (1u << 2)
#define OP_DELETE (1u << 3)
#define OP_RENAME_FROM (1u << 4)
#define OP_RENAME_TO (1u << 5)
#define OP_LINK (1u << 6)
#define OP_SYMLINK (1u << 7)
#define OP_MKDIR (1u << 8)
#define OP_RMDIR (1u << 9)
#define OP_MKNOD (1u << 10)
#define OP_CHMOD (1u << 11)
#define OP_CHOWN (1u << 12)
#define OP_UTIMES (1u << 13)
#define OP_XATTR (1u << 14)
#define OP_MMAP_WRITE (1u << 15)

/* Socket operations (op1 of EV_SOCK). */
#define SOCK_BIND 1
#define SOCK_LISTEN 2
#define SOCK_CONNECT 3
#define SOCK_ACCEPT 4

/* Conservative "cannot know" flags (op1 of EV_UNKNOWN). */
#define FLAG_MOUNT 1
#define FLAG_UMOUNT 2
#define FLAG_PIVOT_ROOT 3
#define FLAG_MOVE_MOUNT 4
#define FLAG_FSMOUNT 5
#define FLAG_OPEN_TREE 6
#define FLAG_MOUNT_SETATTR 7
#define FLAG_PTRACE 8
#define FLAG_PROCESS_VM_WRITEV 9
#define FLAG_IO_URING 10
#define FLAG_AIO 11
#define FLAG_COMPAT 12
#define FLAG_MPROTECT_SHARED 13
#define FLAG_MADVISE_REMOVE 14
#define FLAG_BTRFS_IOCTL 15
#define FLAG_FSPICK 16
#define FLAG_SWAP 17
#define FLAG_ACCT 18
#define FLAG_BPF 19

/* Segment flags. A path segment is usable only if SEG_OK is set and no other
 * bit is. */
#define SEG_OK (1u << 0)
#define SEG_TRUNC (1u << 1)   /* too deep / too long */
#define SEG_OUTSIDE (1u << 2) /* not below the task's root */
#define SEG_ANON (1u << 3)    /* pseudo / disconnected dentry (memfd, ...) */
#define SEG_DELETED (1u << 4) /* unlinked dentry */
#define SEG_ERR (1u << 5)     /* a read failed */

#define NSEG 4

struct ev_hdr {
	__u64 cgid;
	__s64 ret;
	__u32 gen;
	__u32 kind;
	__u32 pid;  /* tgid (host) */
	__u32 tid;  /* thread id (host) */
	__u32 ppid; /* EV_SPAWN: parent tgid */
	__u32 nr;   /* syscall number, if any */
	__u32 op1;
	__u32 op2;
	__u32 magic1;
	__u32 magic2;
	__u32 aux;
	__u16 seglen[NSEG];
	__u8 segfl[NSEG];
	char comm[16];
};

struct watch_val {
	__u64 pidns; /* inode number of the live pid namespace */
	__u32 gen;   /* current turn */
	__u32 _pad;
};

#endif
