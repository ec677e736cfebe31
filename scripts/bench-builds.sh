#!/bin/sh
# Two builds of molt side by side: molt bench rollback, cr and fork from
# build A and build B, alternating (A B, then B A, ...), the system
# settled between runs. For a change that must not cost anything (a
# refactor), the difference between the columns is to be read against the
# spread between rounds of one build.
#
#   scripts/bench-builds.sh A_BINARY B_BINARY [ROUNDS]    (as root)
#
# Output: one file per run in $OUT (default /var/tmp/molt-bench-builds),
# and the tables on stdout.
set -eu
A=$1
B=$2
ROUNDS=${3:-2}
OUT=${OUT:-/var/tmp/molt-bench-builds}
mkdir -p "$OUT"
run() {
	name=$1
	bin=$2
	shift 2
	echo "== $name: $bin bench $*"
	"$bin" bench "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
	cat "$OUT/$name.txt"
	sleep 10 # let writeback and the freed memory settle between runs
}
i=1
while [ "$i" -le "$ROUNDS" ]; do
	if [ $((i % 2)) -eq 1 ]; then first=a second=b; else first=b second=a; fi
	for which in $first $second; do
		if [ "$which" = a ]; then bin=$A; else bin=$B; fi
		run "rollback-$which-$i" "$bin" rollback --iterations 30 --restarts 1 --fault-rounds 2
		run "cr-$which-$i" "$bin" cr --iterations 5
		run "fork-$which-$i" "$bin" fork --rounds 1
	done
	i=$((i + 1))
done
