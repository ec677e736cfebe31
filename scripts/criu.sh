#!/usr/bin/env bash
# Installs CRIU >= 4.2 for molt and prints the path of the command to run.
#
# The system criu is used when it is at least 4.2 and `criu check` passes.
# Otherwise the newest criu >= 4.2 of Debian's testing suite (forky, then
# sid) is fetched with its shared libraries (forky's libc6 included) by
# `apt-get download` through a private apt configuration (own sources
# list, lists, cache and an empty status file; the system's apt setup is
# untouched), unpacked with `dpkg-deb -x` into a private prefix, and run
# through that prefix's dynamic loader by a wrapper script:
#
#   $PREFIX/bin/criu  ->  $PREFIX/root/lib64/ld-linux-x86-64.so.2 --library-path ... criu
#
# Idempotent: a working install is kept. Needs root.
# Env: MOLT_CRIU_PREFIX (default /opt/molt/criu), MOLT_CRIU_MIRROR.
set -euo pipefail

PREFIX=${MOLT_CRIU_PREFIX:-/opt/molt/criu}
MIRROR=${MOLT_CRIU_MIRROR:-http://deb.debian.org/debian}
WRAPPER=$PREFIX/bin/criu
MIN=4.2
PKGS="criu libc6 libgcc-s1 libbsd0 libmd0 libgnutls30t64 libp11-kit0 libffi8 libidn2-0 libunistring5 libtasn1-6 libnettle8t64 libhogweed6t64 libgmp10 libnet9 libnftables1 libnftnl11 libmnl0 libxtables12 libjansson4 libnl-3-200 libprotobuf-c1 libuuid1"

log() { echo "criu.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# version_ok CMD...: the command's version is >= MIN.
version_ok() {
	local v
	v=$("$@" --version 2>/dev/null | sed -n 's/^Version: *//p' | head -1)
	[[ -n $v ]] && dpkg --compare-versions "$v" ge "$MIN"
}

# works CMD...: version >= MIN and `criu check` passes (within a minute).
works() {
	version_ok "$@" && timeout 60 "$@" check >/dev/null 2>&1
}

if [[ -x $WRAPPER ]] && works "$WRAPPER"; then
	echo "$WRAPPER"
	exit 0
fi
if command -v criu >/dev/null 2>&1 && works criu; then
	mkdir -p "$PREFIX/bin"
	printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v criu)" >"$WRAPPER.tmp"
	chmod 755 "$WRAPPER.tmp" && mv "$WRAPPER.tmp" "$WRAPPER"
	log "using the system criu ($(criu --version | sed -n 's/^Version: *//p'))"
	echo "$WRAPPER"
	exit 0
fi
[[ $EUID -eq 0 ]] || die "need root to install criu into $PREFIX"
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || die "apt-get and dpkg-deb are needed (Debian or a derivative)"

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
if ! dpkg --compare-versions "$(dpkg-query -W -f='${Version}' debian-archive-keyring 2>/dev/null || echo 0)" ge 2023.3+deb12u2; then
	log "updating debian-archive-keyring for the testing suite's keys"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debian-archive-keyring >/dev/null
fi

apt=$PREFIX/apt
rm -rf "$apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" "$apt/debs"
: >"$apt/status"
aptopts=(
	-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=-"
	-o "Dir::Etc::Preferences=$apt/etc/preferences" -o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
	-o "Dir::State::Lists=$apt/lists" -o "Dir::State::Status=$apt/status"
	-o "Dir::Cache=$apt/cache" -o "APT::Architecture=amd64" -o "APT::Architectures::=amd64"
	-o "Debug::NoLocking=1" -q
)
chosen=""
for suite in forky sid; do
	echo "deb [signed-by=$keyring] $MIRROR $suite main" >"$apt/sources.list"
	if ! apt-get "${aptopts[@]}" update >/dev/null 2>"$apt/update.log"; then
		log "apt update of $suite failed: $(tail -1 "$apt/update.log")"
		continue
	fi
	v=$(apt-cache "${aptopts[@]}" show criu 2>/dev/null | sed -n 's/^Version: //p' | sort -V | tail -1)
	if [[ -n $v ]] && dpkg --compare-versions "$v" ge "$MIN"; then
		chosen=$suite
		log "$suite serves criu $v"
		break
	fi
	log "$suite serves criu ${v:-none}, need >= $MIN"
done
[[ -n $chosen ]] || die "no criu >= $MIN in Debian's testing suites; install criu >= $MIN and put it on PATH"

(cd "$apt/debs" && apt-get "${aptopts[@]}" download $PKGS >/dev/null 2>"$apt/download.log") ||
	die "apt-get download failed: $(tail -3 "$apt/download.log")"
stage=$PREFIX/root.new
rm -rf "$stage"
mkdir -p "$stage"
for deb in "$apt"/debs/*.deb; do
	dpkg-deb -x "$deb" "$stage"
done
loader=$stage/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
[[ -e $loader ]] || loader=$stage/lib64/ld-linux-x86-64.so.2
[[ -e $loader && -x $stage/usr/sbin/criu ]] || die "unpacked packages lack the loader or criu"
rm -rf "$PREFIX/root"
mv "$stage" "$PREFIX/root"
root=$PREFIX/root
mkdir -p "$PREFIX/bin"
cat >"$WRAPPER.tmp" <<WRAP
#!/bin/sh
# criu from Debian $chosen, run with its own libraries (installed by molt's scripts/criu.sh).
exec $root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 --library-path $root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu $root/usr/sbin/criu "\$@"
WRAP
chmod 755 "$WRAPPER.tmp"
mv "$WRAPPER.tmp" "$WRAPPER"
rm -rf "$apt/lists" "$apt/cache"
works "$WRAPPER" || die "installed criu does not pass 'criu check': $(timeout 60 "$WRAPPER" check 2>&1 | tail -3)"
log "installed criu $("$WRAPPER" --version | sed -n 's/^Version: *//p') from $chosen into $PREFIX"
echo "$WRAPPER"
