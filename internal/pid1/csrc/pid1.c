// pid1: a sandbox's PID 1 that CRIU dumps in about a millisecond.
//
// One thread, a few pages, no libraries beyond a static libc. It reaps
// every process of its PID namespace and, on request from outside the
// namespace, starts processes with the descriptors it is handed, keeps
// descriptors it is asked to keep (so that a dump of the tree holds
// both ends of a session's pipes, and whoever talks to the sandbox next
// can take them back), reports exit statuses and sends signals. The
// protocol is described in proto.go; the Go client is client.go.
//
// Requests arrive on a listening SOCK_SEQPACKET unix socket with an
// abstract name (argv[1]), one request per connection. Only peers
// outside the PID namespace are served: their PID reads 0 here.
//
// Build: see the go:generate line in pid1.go (static, with musl).

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION 1

enum { OP_INFO = 1, OP_SPAWN = 2, OP_TABLE = 3, OP_DROP = 4, OP_SIGNAL = 5, OP_STATUS = 6 };
enum { F_SETSID = 1, F_CTTY = 2, F_WATCH = 4 };
enum { SIG_GROUP = 1, SIG_TREE = 2 };
enum { ST_RUNNING = 1, ST_EXITED = 2, ST_UNKNOWN = 3 };

#define MAX_MSG (256 * 1024)
#define MAX_FDS 64        // descriptors in one request
#define MAX_TABLE_FDS 192 // kept descriptors in all
// A table response carries those and a pidfd per entry: at most 240, in
// one SCM_RIGHTS message (the kernel takes up to 253).
#define MAX_ENTRIES 48
#define MAX_EXITED 1024
#define TAG_MAX 128

// The fixed part of every request and response: little-endian fields.
struct req {
	uint32_t op, flags, uid, gid;
	uint32_t ngroups, nfds, nkeep, argc;
	uint32_t envc, len;
	int32_t pid, sig;
};

struct resp {
	int32_t err;   // 0 or an errno
	uint32_t stage; // spawn: where it failed (1 fork, 2 setup, 3 chdir, 4 exec)
	int32_t pid;
	uint32_t status; // STATUS: ST_*; TABLE: entries
	int32_t wstatus;
	uint32_t version, len, nfds;
};

struct entry {
	char tag[TAG_MAX];
	int pid;
	int nfds;
	int fds[MAX_FDS];
};

static struct entry table[MAX_ENTRIES];
static int nentries;

// Exit statuses of watched children, until asked for.
struct exited {
	int pid, wstatus;
};
static struct exited exits[MAX_EXITED];
static int nexits;
static int watched[MAX_EXITED];
static int nwatched;

static char msg[MAX_MSG];
static char out[MAX_MSG];

static int table_fds(void) {
	int n = 0;
	for (int i = 0; i < nentries; i++)
		n += table[i].nfds;
	return n;
}

static void drop_entry(int i) {
	for (int j = 0; j < table[i].nfds; j++)
		close(table[i].fds[j]);
	table[i] = table[--nentries];
}

static int is_watched(int pid, int remove) {
	for (int i = 0; i < nwatched; i++) {
		if (watched[i] == pid) {
			if (remove)
				watched[i] = watched[--nwatched];
			return 1;
		}
	}
	return 0;
}

static void record_exit(int pid, int ws) {
	if (!is_watched(pid, 1))
		return;
	if (nexits == MAX_EXITED) {
		memmove(exits, exits + 1, sizeof(exits[0]) * (MAX_EXITED - 1));
		nexits--;
	}
	exits[nexits].pid = pid;
	exits[nexits].wstatus = ws;
	nexits++;
}

static void reap(void) {
	for (;;) {
		int ws;
		int pid = waitpid(-1, &ws, WNOHANG);
		if (pid <= 0)
			return;
		record_exit(pid, ws);
		for (int i = 0; i < nentries; i++) {
			if (table[i].pid == pid) {
				drop_entry(i);
				i--;
			}
		}
	}
}

static int send_resp(int c, struct resp *r, const char *data, const int *fds, int nfds) {
	struct iovec iov[2] = {{r, sizeof(*r)}, {(void *)data, r->len}};
	struct msghdr mh = {0};
	char cbuf[CMSG_SPACE(sizeof(int) * (MAX_TABLE_FDS + MAX_ENTRIES))];
	mh.msg_iov = iov;
	mh.msg_iovlen = r->len ? 2 : 1;
	if (nfds > 0) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
	}
	r->nfds = nfds;
	r->version = VERSION;
	return sendmsg(c, &mh, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

static void fail(int c, int err, int stage) {
	struct resp r = {0};
	r.err = err;
	r.stage = stage;
	send_resp(c, &r, NULL, NULL, 0);
}

// next returns the NUL-terminated string at *p, or NULL past end.
static const char *next(const char **p, const char *end) {
	const char *s = *p;
	if (s >= end)
		return NULL;
	const char *z = memchr(s, 0, end - s);
	if (!z)
		return NULL;
	*p = z + 1;
	return s;
}

// exec_path runs file like execvp, searching the PATH of envp.
static void exec_path(const char *file, char **argv, char **envp) {
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		return;
	}
	const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
	for (char **e = envp; *e; e++)
		if (!strncmp(*e, "PATH=", 5))
			path = *e + 5;
	int seen_eacces = 0;
	char buf[4096];
	for (const char *p = path;; p++) {
		const char *z = strchrnul(p, ':');
		size_t dl = z - p, fl = strlen(file);
		if (dl + fl + 2 <= sizeof(buf)) {
			if (dl) {
				memcpy(buf, p, dl);
				buf[dl] = '/';
				memcpy(buf + dl + 1, file, fl + 1);
			} else {
				memcpy(buf, file, fl + 1);
			}
			execve(buf, argv, envp);
			if (errno == EACCES)
				seen_eacces = 1;
			else if (errno != ENOENT && errno != ENOTDIR)
				return;
		}
		if (!*z)
			break;
		p = z;
	}
	errno = seen_eacces ? EACCES : ENOENT;
}

static void child_fail(int ep, int stage) {
	int v[2] = {errno, stage};
	(void)!write(ep, v, sizeof(v));
	_exit(127);
}

// spawn: the child's descriptors 0..nfds-1 are the request's descriptors
// in order, except those whose bit is set in sig (the null mask), which
// are /dev/null; the request's remaining descriptors are kept.
static void spawn(int c, struct req *q, const char *data, int *fds, int nfds) {
	const char *p = data, *end = data + q->len;
	uint32_t null = q->nfds > 32 ? 0 : (uint32_t)q->sig & (q->nfds == 32 ? ~0U : (1U << q->nfds) - 1);
	uint32_t given = q->nfds - __builtin_popcount(null);
	if ((size_t)q->ngroups * 4 > q->len || q->nfds > MAX_FDS || given + q->nkeep != (uint32_t)nfds || q->argc == 0) {
		fail(c, EINVAL, 0);
		return;
	}
	gid_t groups[256];
	if (q->ngroups > 256) {
		fail(c, EINVAL, 0);
		return;
	}
	memcpy(groups, p, q->ngroups * 4);
	p += q->ngroups * 4;
	const char *tag = next(&p, end), *file = next(&p, end), *cwd = next(&p, end);
	if (!tag || !file || !cwd || strlen(tag) >= TAG_MAX || q->argc > 65536 || q->envc > 65536) {
		fail(c, EINVAL, 0);
		return;
	}
	char **argv = calloc(q->argc + 1, sizeof(char *)), **envp = calloc(q->envc + 1, sizeof(char *));
	if (!argv || !envp) {
		free(argv);
		free(envp);
		fail(c, ENOMEM, 0);
		return;
	}
	int bad = 0;
	for (uint32_t i = 0; i < q->argc && !bad; i++)
		bad = !(argv[i] = (char *)next(&p, end));
	for (uint32_t i = 0; i < q->envc && !bad; i++)
		bad = !(envp[i] = (char *)next(&p, end));
	if (bad || (q->nkeep && (nentries == MAX_ENTRIES || table_fds() + (int)q->nkeep > MAX_TABLE_FDS)) ||
	    ((q->flags & F_WATCH) && nwatched == MAX_EXITED)) {
		free(argv);
		free(envp);
		fail(c, bad ? EINVAL : ENOSPC, 0);
		return;
	}

	int ep[2];
	if (pipe2(ep, O_CLOEXEC) < 0) {
		free(argv);
		free(envp);
		fail(c, errno, 1);
		return;
	}
	int pid = fork();
	if (pid == 0) {
		sigset_t all;
		sigemptyset(&all);
		sigprocmask(SIG_SETMASK, &all, NULL);
		for (int s = 1; s < NSIG; s++)
			signal(s, SIG_DFL);
		if ((q->flags & F_SETSID) && setsid() < 0)
			child_fail(ep[1], 2);
		// Move everything out of the way of 0..n-1, then into place.
		int e = fcntl(ep[1], F_DUPFD_CLOEXEC, 100);
		if (e < 0)
			child_fail(ep[1], 2);
		int moved[MAX_FDS];
		for (uint32_t i = 0, k = 0; i < q->nfds; i++) {
			if (null & (1U << i))
				moved[i] = open("/dev/null", O_RDWR | O_CLOEXEC);
			else
				moved[i] = fcntl(fds[k++], F_DUPFD_CLOEXEC, 100);
			if (moved[i] < 0)
				child_fail(e, 2);
		}
		for (uint32_t i = 0; i < q->nfds; i++)
			if (dup2(moved[i], i) < 0)
				child_fail(e, 2);
		// Everything else closes at exec (the error pipe included).
		if (syscall(SYS_close_range, q->nfds, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */) < 0)
			child_fail(e, 2);
		if ((q->flags & F_CTTY) && ioctl(0, TIOCSCTTY, 0) < 0)
			child_fail(e, 2);
		if (setgroups(q->ngroups, groups) < 0 || setresgid(q->gid, q->gid, q->gid) < 0 ||
		    setresuid(q->uid, q->uid, q->uid) < 0)
			child_fail(e, 2);
		if (chdir(cwd) < 0)
			child_fail(e, 3);
		exec_path(file, argv, envp);
		child_fail(e, 4);
	}
	free(argv);
	free(envp);
	close(ep[1]);
	if (pid < 0) {
		close(ep[0]);
		fail(c, errno, 1);
		return;
	}
	int v[2] = {0, 0};
	ssize_t n;
	do
		n = read(ep[0], v, sizeof(v));
	while (n < 0 && errno == EINTR);
	close(ep[0]);
	if (n == sizeof(v)) {
		// The child failed before exec and exits: it is reaped with the
		// others, unwatched.
		fail(c, v[0], v[1]);
		return;
	}
	if (q->flags & F_WATCH) {
		// A status nobody took, of an earlier process with this PID,
		// is not this one's.
		for (int i = 0; i < nexits; i++)
			if (exits[i].pid == pid)
				exits[i--] = exits[--nexits];
		watched[nwatched++] = pid;
	}
	if (q->nkeep) {
		struct entry *en = &table[nentries++];
		strcpy(en->tag, tag);
		en->pid = pid;
		en->nfds = q->nkeep;
		for (uint32_t i = 0; i < q->nkeep; i++) {
			en->fds[i] = fds[given + i];
			fds[given + i] = -1; // kept, not closed below
		}
	}
	struct resp r = {0};
	r.pid = pid;
	int pfd = syscall(SYS_pidfd_open, pid, 0);
	send_resp(c, &r, NULL, pfd >= 0 ? &pfd : NULL, pfd >= 0 ? 1 : 0);
	if (pfd >= 0)
		close(pfd);
}

// send_table sends, per entry, its tag, PID and descriptor count, and as
// descriptors a pidfd of the process followed by the kept ones.
static void send_table(int c) {
	struct resp r = {0};
	int fds[MAX_TABLE_FDS + MAX_ENTRIES], nfds = 0;
	int pidfds[MAX_ENTRIES], npidfds = 0;
	size_t len = 0;
	reap();
	for (int i = 0; i < nentries; i++) {
		struct entry *en = &table[i];
		int pfd = syscall(SYS_pidfd_open, en->pid, 0);
		int n = snprintf(out + len, sizeof(out) - len, "%s%c%d%c%d%c", en->tag, 0, en->pid, 0, en->nfds + 1, 0);
		if (pfd < 0 || n < 0 || (size_t)n >= sizeof(out) - len) {
			if (pfd >= 0)
				close(pfd);
			for (int j = 0; j < npidfds; j++)
				close(pidfds[j]);
			fail(c, pfd < 0 ? errno : ENOSPC, 0);
			return;
		}
		len += n;
		pidfds[npidfds++] = pfd;
		fds[nfds++] = pfd;
		for (int j = 0; j < en->nfds; j++)
			fds[nfds++] = en->fds[j];
	}
	r.status = nentries;
	r.len = len;
	send_resp(c, &r, out, fds, nfds);
	for (int j = 0; j < npidfds; j++)
		close(pidfds[j]);
}

static void drop(int c, const char *tag, size_t len) {
	if (!len || tag[len - 1] != 0) {
		fail(c, EINVAL, 0);
		return;
	}
	int found = 0;
	for (int i = 0; i < nentries; i++) {
		if (!strcmp(table[i].tag, tag)) {
			drop_entry(i);
			i--;
			found = 1;
		}
	}
	fail(c, found ? 0 : ENOENT, 0);
}

#define MAX_TREE 4096
static int tree[MAX_TREE];
static int ntree;

// collect_tree lists pid, then its descendants, each after its parent.
static void collect_tree(int pid, int depth) {
	if (depth > 64 || ntree == MAX_TREE)
		return;
	tree[ntree++] = pid;
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	DIR *d = opendir(path);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char cpath[320];
		snprintf(cpath, sizeof(cpath), "/proc/%d/task/%s/children", pid, de->d_name);
		FILE *f = fopen(cpath, "re");
		if (!f)
			continue;
		int child;
		while (fscanf(f, "%d", &child) == 1)
			collect_tree(child, depth + 1);
		fclose(f);
	}
	closedir(d);
}

// kill_tree signals pid and its descendants, parents first. The tree is
// read before any signal: a process whose parent is gone (reparented to
// pid1) is still signalled, and pid dies of the signal, not of its
// children's deaths (a shell in `wait` would exit 0 first).
static void kill_tree(int pid, int sig) {
	ntree = 0;
	collect_tree(pid, 0);
	for (int i = 0; i < ntree; i++)
		kill(tree[i], sig);
}

static void do_signal(int c, struct req *q) {
	if (q->pid <= 1 || q->sig < 0 || q->sig >= NSIG) {
		fail(c, EINVAL, 0);
		return;
	}
	int err = 0;
	if (q->flags & SIG_TREE)
		kill_tree(q->pid, q->sig);
	else if (kill((q->flags & SIG_GROUP) ? -q->pid : q->pid, q->sig) < 0)
		err = errno;
	fail(c, err, 0);
}

static void status(int c, struct req *q) {
	reap();
	struct resp r = {0};
	r.pid = q->pid;
	r.status = ST_UNKNOWN;
	for (int i = 0; i < nexits; i++) {
		if (exits[i].pid == q->pid) {
			r.status = ST_EXITED;
			r.wstatus = exits[i].wstatus;
			exits[i] = exits[--nexits];
			break;
		}
	}
	if (r.status == ST_UNKNOWN && is_watched(q->pid, 0))
		r.status = ST_RUNNING;
	send_resp(c, &r, NULL, NULL, 0);
}

static void serve(int c) {
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	// A peer outside this PID namespace has no PID here.
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.pid != 0)
		return;
	// A client that stops talking cannot hold PID 1 for long.
	struct timeval tv = {5, 0};
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	struct iovec iov = {msg, sizeof(msg)};
	char cbuf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
	struct msghdr mh = {0};
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cbuf;
	mh.msg_controllen = sizeof(cbuf);
	ssize_t n = recvmsg(c, &mh, MSG_CMSG_CLOEXEC);
	int fds[MAX_FDS], nfds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			int k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (int i = 0; i < k && nfds < MAX_FDS; i++)
				memcpy(&fds[nfds++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
		}
	}
	struct req q;
	if (n < (ssize_t)sizeof(q) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		fail(c, EINVAL, 0);
		goto out;
	}
	memcpy(&q, msg, sizeof(q));
	if (q.len != n - sizeof(q)) {
		fail(c, EINVAL, 0);
		goto out;
	}
	const char *data = msg + sizeof(q);
	switch (q.op) {
	case OP_INFO: {
		struct resp r = {0};
		r.pid = getpid();
		r.status = nentries;
		send_resp(c, &r, NULL, NULL, 0);
		break;
	}
	case OP_SPAWN:
		spawn(c, &q, data, fds, nfds);
		break;
	case OP_TABLE:
		send_table(c);
		break;
	case OP_DROP:
		drop(c, data, q.len);
		break;
	case OP_SIGNAL:
		do_signal(c, &q);
		break;
	case OP_STATUS:
		status(c, &q);
		break;
	default:
		fail(c, EINVAL, 0);
	}
out:
	for (int i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

// copy_self makes a copy of this process for a checkpoint (the
// template capture, docs/templates.md), on SIGUSR2 from outside the PID
// namespace: sent with kill (si_code SI_USER) by a sender the namespace
// cannot name (si_pid 0). A kill from inside reads as its sender's PID;
// rt_sigqueueinfo lets a process inside write si_pid 0 itself, but only
// with a negative si_code. The copy
// stops at once; the checkpoint dumps it and kills it, and the copy's
// dump, restored as PID 1, is the sandbox's PID 1: it goes on from here
// with the state this process had, serving the loop below.
//
// Raw system calls, not fork() and raise(): musl's fork stores the
// child's thread id in the thread descriptor, where raise and the
// pthread functions take it from, and the restored process's is 1. With
// a bare clone the copy keeps this process's descriptor, as a copy made
// by ptrace does.
//
// The copy waits for its dump whatever reaches it meanwhile: it blocks
// every signal it can (a broadcast kill from the sandbox, the SIGHUP the
// kernel sends with SIGCONT to an orphaned process group), and a copy
// continued before its dump is not PID 1, so it stops again rather than
// serve as a second one or end, which would lose the checkpoint. Restored
// as PID 1, it leaves the loop and takes its mask back.
static void copy_self(void) {
	if (syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0) != 0)
		return;
	uint64_t all = ~(uint64_t)0, old = 0;
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof(all));
	do
		syscall(SYS_kill, syscall(SYS_getpid), SIGSTOP);
	while (syscall(SYS_getpid) != 1);
	syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, 0, sizeof(old));
}

int main(int argc, char **argv) {
	if (argc < 2 || !argv[1][0] || strlen(argv[1]) >= sizeof(((struct sockaddr_un *)0)->sun_path) - 1) {
		fprintf(stderr, "usage: %s SOCKET-NAME\n", argv[0]);
		return 2;
	}
	// Not dumpable: the sandbox's processes run as root with the same
	// capabilities as this one, and could otherwise ptrace it or read
	// its /proc files (descriptors, memory). CRIU, host root with
	// CAP_SYS_PTRACE, dumps it all the same and restores the flag. A
	// child is dumpable again once it executes its program.
	//
	// In a sandbox with a user namespace of its own (argv[2]
	// "dumpable") it stays dumpable: CRIU cannot dump a non-dumpable
	// task there (it is refused the task's namespace files), and root
	// inside is an unprivileged host uid.
	int dumpable = argc > 2 && strcmp(argv[2], "dumpable") == 0;
	if (!dumpable && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
		perror("pid1: PR_SET_DUMPABLE");
		return 1;
	}
	sigset_t mask;
	sigemptyset(&mask);
	sigaddset(&mask, SIGCHLD);
	sigaddset(&mask, SIGUSR2);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t nl = strlen(argv[1]);
	memcpy(sa.sun_path + 1, argv[1], nl); // abstract: leading NUL
	if (sfd < 0 || ls < 0 || bind(ls, (struct sockaddr *)&sa, offsetof(struct sockaddr_un, sun_path) + 1 + nl) < 0 ||
	    listen(ls, 64) < 0) {
		perror("pid1: listen");
		return 1;
	}
	// Tell whoever started us that requests can come (fd 3, if open).
	if (fcntl(3, F_GETFD) >= 0) {
		(void)!write(3, "ok\n", 3);
		close(3);
	}
	struct pollfd pf[2] = {{sfd, POLLIN, 0}, {ls, POLLIN, 0}};
	for (;;) {
		if (poll(pf, 2, -1) < 0)
			continue;
		if (pf[0].revents) {
			struct signalfd_siginfo si;
			int copy = 0;
			while (read(sfd, &si, sizeof(si)) > 0)
				copy |= si.ssi_signo == SIGUSR2 && si.ssi_code == SI_USER && si.ssi_pid == 0;
			reap();
			if (copy)
				copy_self();
		}
		if (pf[1].revents) {
			int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0) {
				reap();
				serve(c);
				close(c);
			}
		}
	}
}
