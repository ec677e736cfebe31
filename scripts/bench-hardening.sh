#!/bin/sh
# The cost of the sandbox hardening (seccomp filter, default limits, disk
# quotas): molt bench cr and molt bench rollback with it on and off,
# alternating, from one build. Output: one file per run in $OUT (default
# /var/tmp/molt-bench-hardening), and the tables on stdout.
#
#   scripts/bench-hardening.sh [ROUNDS]      (as root, after make build)
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
OUT=${OUT:-/var/tmp/molt-bench-hardening}
mkdir -p "$OUT"
run() {
	name=$1
	shift
	echo "== $name: bin/molt bench $*"
	bin/molt bench "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
	cat "$OUT/$name.txt"
	sleep 10 # let writeback and the freed memory settle between runs
}
i=1
while [ "$i" -le "$ROUNDS" ]; do
	run "rollback-on-$i" --hardening=true rollback --iterations 30 --restarts 1 --fault-rounds 2
	run "rollback-off-$i" --hardening=false rollback --iterations 30 --restarts 1 --fault-rounds 2
	run "cr-off-$i" --hardening=false cr --iterations 5
	run "cr-on-$i" --hardening=true cr --iterations 5
	i=$((i + 1))
done
