#!/usr/bin/env bash
# Builds the S3-compatible server of molt's tests, idempotently, and
# prints the path of its binary: versitygw (Versity S3 Gateway,
# Apache-2.0) with its posix backend, built by `go install` from the Go
# module proxy into a cache directory kept across runs:
#
#   $MOLT_S3_CACHE/versitygw-$VERSION/bin/versitygw
#
# internal/objstore/s3test starts it on a loopback port for the tests
# (docs/storage.md, "The S3 server of the tests"). A binary already
# there that reports the version is kept. The build is static
# (CGO_ENABLED=0) and pinned: the module's go.sum, checked against the
# checksum database, fixes every dependency.
# Env: MOLT_S3_CACHE (default /var/cache/molt/s3), GO (default go).
set -euo pipefail

VERSION=v1.8.0
MODULE=github.com/versity/versitygw
CACHE=${MOLT_S3_CACHE:-/var/cache/molt/s3}
GO=${GO:-go}
DIR=$CACHE/versitygw-$VERSION
BIN=$DIR/bin/versitygw

log() { echo "s3server.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# ok BIN: the binary runs and reports the version it was built as.
# The output is read whole first: grep -q leaving a pipe at its first
# match would kill the writer with SIGPIPE, which pipefail reports as a
# failure whenever the binary had lines left to write.
ok() {
	local out
	[[ -x $1 ]] && out=$(timeout 30 "$1" --version 2>/dev/null) && grep -qx "Version *: *$VERSION" <<<"$out"
}

if ok "$BIN"; then
	echo "$BIN"
	exit 0
fi
command -v "$GO" >/dev/null 2>&1 || GO=/usr/local/go/bin/go
command -v "$GO" >/dev/null 2>&1 || die "go is needed to build versitygw (scripts/deps.sh says where to get it)"
mkdir -p "$DIR"
stage=$(mktemp -d "$DIR/build.XXXXXX")
trap 'rm -rf "$stage"' EXIT
start=$SECONDS
log "building $MODULE@$VERSION into $DIR (a few minutes, once)"
# A download from the proxy can stall: each attempt is bounded, and
# the module cache keeps what an attempt got.
for attempt in 1 2 3; do
	if GOBIN=$stage GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
		timeout 1200 "$GO" install -trimpath \
		-ldflags "-s -w -X=main.Version=$VERSION -X=main.Build=$VERSION -X=main.BuildTime=none" \
		"$MODULE/cmd/versitygw@$VERSION" 2>"$stage/build.log"; then
		break
	fi
	log "attempt $attempt failed: $(tail -3 "$stage/build.log")"
	((attempt < 3)) || die "could not build $MODULE@$VERSION"
	sleep 5
done
ok "$stage/versitygw" || die "the built versitygw does not report version $VERSION"
mkdir -p "$DIR/bin"
mv -f "$stage/versitygw" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
log "built $MODULE@$VERSION in $((SECONDS - start)) s"
echo "$BIN"
