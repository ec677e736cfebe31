#!/usr/bin/env bash
# Measures whether CRIU can checkpoint and restore a sandbox-like tree
# whose processes run in a user namespace mapped to an unprivileged host
# uid range, and what it costs (docs/architecture.md, "User namespaces").
# Needs root, btrfs-progs, CRIU (scripts/criu.sh) and the Debian image
# tarball molt caches in /var/cache/molt. Leaves nothing mounted.
#
#   scripts/userns-measure.sh [experiment...]   (default: all)
set -uo pipefail

CRIU=${CRIU:-/opt/molt/criu/bin/criu}
W=${UXP_DIR:-/var/tmp/uxp}
BASE=${UXP_BASE:-1000000}
TAR=$(ls /var/cache/molt/debootstrap/*.tar | head -1)
HERE=$(cd "$(dirname "$0")/.." && pwd)
UXP=$W/uxp

now() { date +%s%N; }
ms() { echo "scale=1; ($2 - $1) / 1000000" | bc; }
log() { echo "== $*"; }

setup() {
	mkdir -p "$W"
	(cd "$HERE" && go build -o "$UXP" ./scripts/userns-measure) || exit 1
	if ! mountpoint -q "$W/pool"; then
		truncate -s 4G "$W/pool.img"
		mkfs.btrfs -q -f "$W/pool.img"
		mkdir -p "$W/pool"
		mount -o loop,noatime "$W/pool.img" "$W/pool"
	fi
	P=$W/pool
	if [[ ! -d $P/image ]]; then
		btrfs -q subvolume create "$P/image"
		tar -xf "$TAR" -C "$P/image"
		for n in "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0"; do
			set -- $n
			mknod -m 666 "$P/image/dev/$1" c "$2" "$3"
		done
		mkdir -p "$P/image/dev/pts" "$P/image/proc" "$P/image/sys"
		sync
	fi
}

# The tree: a shell (PID 1) with a python child holding an open file and
# a listening TCP socket and 20 MiB of heap; with NONROOT=1 also a sleep
# running as uid 1000.
script() {
	local s='python3 -c "
import socket, time
f = open(\"/tmp/data\", \"w\"); f.write(\"x\" * 100000); f.flush()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((\"127.0.0.1\", 8080)); s.listen()
b = bytearray(20 << 20)
while True: time.sleep(1)
" &'
	if [[ ${NONROOT:-0} == 1 ]]; then
		s+=' setpriv --reuid=1000 --regid=1000 --clear-groups sleep 100000 &'
	fi
	s+=' while :; do sleep 1; done'
	echo "$s"
}

snap() { btrfs -q subvolume snapshot "$1" "$2" >/dev/null; }
delsv() { [[ -d $1 ]] && btrfs -q subvolume delete "$1" >/dev/null; }

# shift_owner DIR: every file's owner and group moved up by BASE.
shift_owner() {
	"$UXP" shift "$1" "$BASE"
}

# listening PID: a connection to 127.0.0.1:8080 in PID's network namespace.
listening() {
	nsenter -t "$1" -n bash -c 'exec 3<>/dev/tcp/127.0.0.1/8080' 2>/dev/null && echo "listener answers" || echo "listener does NOT answer"
}

# run NAME MODE: MODE is plain (no userns), chown or idmap.
run() {
	local name=$1 mode=$2 root mnt base=-1 pid t0 t1
	local d=$W/$name
	rm -rf "$d"; mkdir -p "$d/img"
	delsv "$P/$name"; delsv "$P/$name-r"
	t0=$(now); snap "$P/image" "$P/$name"; t1=$(now); echo "snapshot: $(ms $t0 $t1) ms"
	root=$P/$name
	case $mode in
	chown)
		base=$BASE
		t0=$(now); shift_owner "$root"; sync -f "$root"; t1=$(now)
		echo "chown of the image: $(ms $t0 $t1) ms"
		;;
	idmap)
		base=$BASE
		mkdir -p "$d/root"
		"$UXP" idmap "$root" "$d/root" "$BASE" || return 1
		root=$d/root
		;;
	esac
	out=$("$UXP" start "$root" "$base" "$(script)") || return 1
	pid=${out%% *}
	echo "started pid $pid in ${out#* } ms"
	nsenter -t "$pid" -n ip link set lo up
	sleep 2
	ps -o pid,uid,user,comm --ppid "$pid" | cat
	grep -E '^(Uid|Gid)' /proc/"$(pgrep -P "$pid" python3)"/status
	listening "$pid"
	t0=$(now)
	"$CRIU" dump -t "$pid" -D "$d/img" -o dump.log -v4 --network-lock skip --skip-in-flight ${DUMPOPTS:-} >/dev/null 2>&1
	rc=$?; t1=$(now)
	echo "dump rc=$rc $(ms $t0 $t1) ms"
	if [[ $rc != 0 ]]; then
		grep -E 'Error|error' "$d/img/dump.log" | grep -v RLIMIT_NOFILE | head -5
		kill -9 "$pid"; return 1
	fi
	snap "$P/$name" "$P/$name-r"
	root=$P/$name-r
	if [[ $mode == idmap ]]; then
		umount "$d/root"
		"$UXP" idmap "$root" "$d/root" "$BASE" || return 1
		root=$d/root
	fi
	t0=$(now)
	"$CRIU" restore -D "$d/img" -o restore.log -v4 --root "$root" --restore-detached --pidfile "$d/pid" --network-lock skip ${RESTOPTS:-} >/dev/null 2>&1
	rc=$?; t1=$(now)
	echo "restore rc=$rc $(ms $t0 $t1) ms"
	if [[ $rc != 0 ]]; then
		grep -E 'Error|error' "$d/img/restore.log" | grep -v RLIMIT_NOFILE | head -5
		return 1
	fi
	pid=$(cat "$d/pid")
	ps -o pid,uid,user,comm --ppid "$pid" | cat
	listening "$pid"
	grep -E '^[0-9]+ [0-9]+ [^ ]+ / / ' /proc/"$pid"/mountinfo | cut -d' ' -f5-7,9-
	nsenter -t "$pid" -U -m -p -r -w sh -c 'stat -c "inside: /etc/passwd %u:%g" /etc/passwd; touch /root/after-restore && stat -c "inside: new file %u" /root/after-restore'
	kill -9 "$pid"
	sleep 0.2
	[[ $mode == idmap ]] && umount "$d/root"
	return 0
}

# molt NAME MODE: the options and the order of molt's own paths: the
# dump runs in the tree's network, UTS and IPC namespaces, the cgroup
# frozen first (--freeze-cgroup), the tree left running; a copy of the
# python process made by ptrace injection (the template capture) is
# dumped alone, its PID namespace external; the restore runs in fresh
# network, UTS and IPC namespaces, inside the sandbox's cgroup, leaving
# the tree stopped (a standby) until SIGCONT.
molt() {
	local name=$1 mode=$2 root base=-1 pid py cp t0 t1 rc
	local d=$W/$name cg=/sys/fs/cgroup/unified/uxp-$name
	rm -rf "$d"; mkdir -p "$d/img" "$d/copy"
	delsv "$P/$name"; delsv "$P/$name-r"
	[[ -d $cg ]] && { echo 1 >"$cg/cgroup.kill"; sleep 0.2; rmdir "$cg"; }
	mkdir "$cg"
	snap "$P/image" "$P/$name"
	root=$P/$name
	if [[ $mode == idmap ]]; then
		base=$BASE; mkdir -p "$d/root"
		"$UXP" idmap "$root" "$d/root" "$BASE" >/dev/null || return 1
		root=$d/root
	fi
	out=$(echo $BASHPID >"$cg/cgroup.procs" && UXP_NOSYS=${UXP_NOSYS:-0} exec "$UXP" start "$root" "$base" "$(script)") || return 1
	pid=${out%% *}
	nsenter -t "$pid" -n ip link set lo up
	sleep 2
	py=$(pgrep -P "$pid" python3)
	listening "$pid"
	local common=(--manage-cgroups=ignore --tcp-established --file-locks --network-lock skip -v${UXP_V:-2})
	local dumpx=(--skip-in-flight)
	for i in 1 2 3; do
		rm -rf "$d/img"; mkdir "$d/img"
		t0=$(now)
		echo 1 >"$cg/cgroup.freeze"
		nsenter -t "$pid" -n -u -i "$CRIU" dump -t "$pid" -D "$d/img" -o dump.log --leave-running --freeze-cgroup "$cg" "${common[@]}" "${dumpx[@]}" >/dev/null 2>&1
		rc=$?
		echo 0 >"$cg/cgroup.freeze"
		t1=$(now)
		echo "molt-style dump $i rc=$rc $(ms $t0 $t1) ms"
		[[ $rc == 0 ]] || { grep -E 'Error' "$d/img/dump.log" | grep -v RLIMIT_NOFILE | head -5; break; }
	done
	out=$("$UXP" copy "$py")
	if [[ $? == 0 ]]; then
		cp=${out%% *}
		echo "copy of python $py: pid $cp, injection ${out#* } ms"
		local pidns
		pidns=$(stat -L -c %i /proc/"$pid"/ns/pid)
		t0=$(now)
		nsenter -t "$pid" -n -u -i "$CRIU" dump -t "$cp" -D "$d/copy" -o dump.log --shell-job --external "pid[$pidns]:molt-pidns" "${common[@]}" "${dumpx[@]}" >/dev/null 2>&1
		rc=$?; t1=$(now)
		echo "dump of the copy rc=$rc $(ms $t0 $t1) ms"
		[[ $rc == 0 ]] || { grep -E 'Error' "$d/copy/dump.log" | grep -v RLIMIT_NOFILE | head -5; kill -9 "$cp"; }
	fi
	echo 1 >"$cg/cgroup.kill"; sleep 0.3
	snap "$P/$name" "$P/$name-r"
	root=$P/$name-r
	if [[ $mode == idmap ]]; then
		umount "$d/root"
		"$UXP" idmap "$root" "$d/root" "$BASE" >/dev/null || return 1
		root=$d/root
	fi
	t0=$(now)
	if [[ $mode == idmap && ${UXP_JOIN:-0} == 1 ]]; then
		# The tree joins a user namespace with its block that owns new
		# network, UTS and IPC namespaces: a user namespace may mount
		# sysfs only for a network namespace it owns.
		local h
		h=$("$UXP" hold "$BASE")
		nsenter -t "$h" -n ip link set lo up
		# CRIU opens these from the task it restores, already in a
		# user namespace of its own, which may not open another
		# namespace's /proc links: bound onto files they open as any file.
		mkdir -p "$d/ns"
		for n in net uts ipc user; do
			touch "$d/ns/$n"; mount --bind /proc/$h/ns/$n "$d/ns/$n"
		done
		(echo $BASHPID >"$cg/cgroup.procs" && exec "$CRIU" restore -D "$d/img" -o restore.log --root "$root" --restore-detached --restore-sibling --leave-stopped --pidfile "$d/pid" "${common[@]}" \
			--join-ns user:$d/ns/user --join-ns net:$d/ns/net --join-ns uts:$d/ns/uts --join-ns ipc:$d/ns/ipc) >/dev/null 2>&1
		rc=$?
		kill "$h"
		for n in net uts ipc user; do umount "$d/ns/$n"; done
	else
		(echo $BASHPID >"$cg/cgroup.procs" && exec unshare -n -u -i sh -c 'ip link set lo up && exec "$@"' - \
			"$CRIU" restore -D "$d/img" -o restore.log --root "$root" --restore-detached --restore-sibling --leave-stopped --pidfile "$d/pid" "${common[@]}") >/dev/null 2>&1
		rc=$?
	fi
	t1=$(now)
	echo "molt-style restore (stopped, into the cgroup) rc=$rc $(ms $t0 $t1) ms"
	[[ $rc == 0 ]] || { grep -E 'Error' "$d/img/restore.log" | grep -v RLIMIT_NOFILE | head -5; return 1; }
	pid=$(cat "$d/pid")
	ps -o pid,stat,uid,comm --ppid "$pid" | cat
	for p in $(cat "$cg/cgroup.procs"); do kill -CONT "$p"; done
	sleep 0.3
	ps -o pid,stat,uid,comm --ppid "$pid" | cat
	grep -E '^Uid' /proc/"$(pgrep -P "$pid" python3)"/status
	cat /proc/"$pid"/uid_map 2>/dev/null
	listening "$pid"
	echo 1 >"$cg/cgroup.kill"; sleep 0.3; rmdir "$cg"
	[[ $mode == idmap ]] && umount "$d/root"
	return 0
}

cleanup() {
	for d in "$W"/*/root; do mountpoint -q "$d" && umount "$d"; done
}

setup
trap cleanup EXIT
[[ $# -gt 0 ]] || set -- plain chown idmap
for e in "$@"; do
	log "$e"
	case $e in
	plain) run plain plain ;;
	chown) run chown chown ;;
	idmap) run idmap idmap ;;
	nonroot-plain) NONROOT=1 run nrp plain ;;
	nonroot-userns) NONROOT=1 run nru chown ;;
	nonroot-idmap) NONROOT=1 run nri idmap ;;
	molt-plain) molt mp plain ;;
	molt-idmap) molt mi idmap ;;
	molt-idmap-join) UXP_JOIN=1 molt mi idmap ;;
	molt-idmap-nosys) UXP_NOSYS=1 molt mi idmap ;;
	*) echo "unknown experiment $e" ;;
	esac
done
