#!/usr/bin/env bash
# Builds the control plane of molt's Kubernetes tests, idempotently, and
# prints the directory of its binaries: kube-apiserver and etcd, built
# from the Go module proxy by the pinned module in tools/kube (its
# go.mod pins k8s.io/kubernetes and its staging modules to the same
# release; its go.sum, checked against the checksum database, fixes
# every dependency) into a cache directory kept across runs:
#
#   $MOLT_KUBE_CACHE/$KUBE_VERSION/bin/{kube-apiserver,etcd}
#
# controller-runtime's envtest starts them (KUBEBUILDER_ASSETS) for
# internal/kube's tests (docs/kubernetes.md, "Tests"). Binaries already
# there that report the versions are kept. The first build takes
# 15-30 minutes on two cores.
# Env: MOLT_KUBE_CACHE (default /var/cache/molt/kube), GO (default go).
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE_VERSION=v1.37.2
ETCD_VERSION=v3.7.0
CACHE=${MOLT_KUBE_CACHE:-/var/cache/molt/kube}
GO=${GO:-go}
DIR=$CACHE/$KUBE_VERSION
BIN=$DIR/bin

log() { echo "kube-assets.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# The outputs are read whole first (grep -q would end the pipe early;
# under pipefail the writer's SIGPIPE is a failure).
ok() {
	local a e
	[[ -x $BIN/kube-apiserver && -x $BIN/etcd ]] || return 1
	a=$(timeout 60 "$BIN/kube-apiserver" --version 2>/dev/null) || return 1
	e=$(timeout 60 "$BIN/etcd" --version 2>/dev/null) || return 1
	[[ $a == "Kubernetes $KUBE_VERSION" ]] && grep -q "^etcd Version: ${ETCD_VERSION#v}\$" <<<"$e"
}

if ok; then
	echo "$BIN"
	exit 0
fi
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go
command -v "$GO" >/dev/null 2>&1 || die "go is needed to build kube-apiserver (scripts/deps.sh says where to get it)"
grep -q "k8s.io/kubernetes $KUBE_VERSION" tools/kube/go.mod || die "tools/kube/go.mod does not pin k8s.io/kubernetes $KUBE_VERSION"
grep -q "go.etcd.io/etcd/server/v3 $ETCD_VERSION" tools/kube/go.mod || die "tools/kube/go.mod does not pin etcd $ETCD_VERSION"
mkdir -p "$DIR"
stage=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$stage"' EXIT
start=$SECONDS
log "building kube-apiserver $KUBE_VERSION and etcd $ETCD_VERSION into $DIR (15-30 minutes, once)"
v=k8s.io/component-base/version
minor=${KUBE_VERSION#v1.}
minor=${minor%%.*}
build() { # OUT PACKAGE LDFLAGS
	local attempt
	# A download from the proxy can stall: each attempt is bounded,
	# and the module and build caches keep what an attempt got.
	for attempt in 1 2 3; do
		if (cd tools/kube && GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
			timeout 3600 "$GO" build -trimpath -ldflags "-s -w $3" -o "$stage/$1" "$2") 2>"$stage/build.log"; then
			return 0
		fi
		log "$1: attempt $attempt failed: $(tail -3 "$stage/build.log")"
		sleep 5
	done
	die "could not build $2"
}
build etcd go.etcd.io/etcd/server/v3 ""
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
	"-X $v.gitVersion=$KUBE_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
mkdir -p "$BIN"
for f in etcd kube-apiserver; do
	mv -f "$stage/$f" "$BIN/$f.tmp"
	mv -f "$BIN/$f.tmp" "$BIN/$f"
done
ok || die "the built binaries do not report $KUBE_VERSION and etcd $ETCD_VERSION"
log "built in $((SECONDS - start)) s"
echo "$BIN"
