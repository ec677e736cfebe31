#!/bin/sh
# The cost of encryption at rest: molt bench encryption (full checkpoints
# and every rollback tier on two daemons, without and with a KEK, in
# alternating order, one process), then molt bench turns without and
# with --encrypt, alternating, from one build. Output: one file per run
# in $OUT (default /var/tmp/molt-bench-encryption), and the tables on
# stdout.
#
#   scripts/bench-encryption.sh [ROUNDS]      (as root, after make build)
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
OUT=${OUT:-/var/tmp/molt-bench-encryption}
mkdir -p "$OUT"
run() {
	name=$1
	shift
	echo "== $name: bin/molt bench $*"
	bin/molt bench "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
	cat "$OUT/$name.txt"
	sleep 10 # let writeback and the freed memory settle between runs
}
run "encryption" encryption --rounds 10 --heap 100
TURNS="turns --modes none,auto --runs 12 --max-turns 15 --parallel 0"
i=1
while [ "$i" -le "$ROUNDS" ]; do
	# shellcheck disable=SC2086 # TURNS is a list of arguments
	run "turns-off-$i" --encrypt=false $TURNS
	# shellcheck disable=SC2086
	run "turns-on-$i" --encrypt=true $TURNS
	# shellcheck disable=SC2086
	run "turns-on-$i-b" --encrypt=true $TURNS
	# shellcheck disable=SC2086
	run "turns-off-$i-b" --encrypt=false $TURNS
	i=$((i + 1))
done
