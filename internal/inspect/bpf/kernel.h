/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * Minimal declarations of the kernel types the inspector reads.
 *
 * Every struct is marked preserve_access_index, so field offsets are CO-RE
 * relocations resolved against the running kernel's BTF
 * (/sys/kernel/btf/vmlinux) at load time: only the field names (and, where
 * noted, the nesting of anonymous members) have to match the kernel, not the
 * layout. Keep this file small; do not replace it with a generated vmlinux.h.
 */
#ifndef MOLT_INSPECT_KERNEL_H
#define MOLT_INSPECT_KERNEL_H

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;
typedef _Bool bool;
#define true 1
#define false 0

#define CORE __attribute__((preserve_access_index))

struct pt_regs {
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
} CORE;

struct thread_info {
	u32 status;
} CORE;

struct qstr {
	const unsigned char *name;
} CORE;

struct hlist_bl_node {
	struct hlist_bl_node *next, **pprev;
} CORE;

struct super_block {
	unsigned long s_magic;
} CORE;

struct inode {
	unsigned short i_mode;
	struct super_block *i_sb;
	unsigned long i_ino;
} CORE;

struct dentry {
	struct hlist_bl_node d_hash;
	struct dentry *d_parent;
	struct qstr d_name;
	struct inode *d_inode;
	struct super_block *d_sb;
} CORE;

struct vfsmount {
	struct dentry *mnt_root;
	struct super_block *mnt_sb;
} CORE;

struct mnt_namespace;

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
	struct mnt_namespace *mnt_ns;
} CORE;

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} CORE;

struct file {
	struct path f_path;
	struct inode *f_inode;
	void *private_data;
} CORE;

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} CORE;

struct files_struct {
	struct fdtable *fdt;
} CORE;

struct fs_struct {
	struct path root;
	struct path pwd;
} CORE;

struct ns_common {
	unsigned int inum;
} CORE;

struct pid_namespace {
	unsigned int level;
	struct pid_namespace *parent;
	struct ns_common ns;
} CORE;

struct upid {
	int nr;
	struct pid_namespace *ns;
} CORE;

struct pid {
	unsigned int level;
	struct upid numbers[1];
} CORE;

typedef struct {
	int counter;
} atomic_t;

struct signal_struct {
	atomic_t live;
} CORE;

struct task_struct {
	struct thread_info thread_info;
	int exit_code;
	int pid;
	int tgid;
	struct task_struct *real_parent;
	struct task_struct *group_leader;
	struct pid *thread_pid;
	char comm[16];
	struct fs_struct *fs;
	struct files_struct *files;
	struct signal_struct *signal;
} CORE;

struct linux_binprm {
	struct file *file;
	const char *filename;
} CORE;

struct in6_addr {
	u8 s6_addr[16];
};

/* skc_daddr/skc_rcv_saddr and skc_dport/skc_num sit in anonymous structs
 * inside anonymous unions in the kernel; CO-RE resolves members of anonymous
 * members by name. */
struct sock_common {
	u32 skc_rcv_saddr;
	u32 skc_daddr;
	u16 skc_dport;
	u16 skc_num;
	unsigned short skc_family;
	struct in6_addr skc_v6_daddr;
	struct in6_addr skc_v6_rcv_saddr;
} CORE;

struct sock {
	struct sock_common __sk_common;
} CORE;

struct socket {
	struct sock *sk;
} CORE;

struct sockaddr_un {
	unsigned short sun_family;
	char sun_path[108];
};

struct unix_address {
	int len;
	struct sockaddr_un name[0];
} CORE;

struct unix_sock {
	struct sock sk;
	struct unix_address *addr;
} CORE;

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	struct file *vm_file;
} CORE;

struct open_how {
	u64 flags;
	u64 mode;
	u64 resolve;
};

#endif
