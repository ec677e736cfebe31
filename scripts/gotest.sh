#!/usr/bin/env bash
# Runs `go test` with the given arguments and, when it fails, repeats at
# the end what tells the failure apart: the failed tests, a timeout's
# list of running tests, and the goroutines that were inside test code.
# A package that times out prints thousands of goroutine lines after its
# header, and a CI log that keeps only its tail would lose the header.
set -uo pipefail
log=$(mktemp /tmp/molt-gotest.XXXXXX)
trap 'rm -f "$log"' EXIT
"${GO:-go}" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
	exit 0
fi
{
	echo
	echo "==== go test failed (exit $rc): summary"
	grep -E '^(--- FAIL|FAIL|panic:)' "$log" | head -60
	# A timeout names the tests that were running.
	awk '/^panic: test timed out/{p=1} p&&/^$/{exit} p' "$log" | head -40
	echo "==== goroutines in test code (first 20)"
	awk 'BEGIN{RS=""} /_test\.go:/{print; print ""; if (++n >= 20) exit}' "$log" | head -400
	echo "==== end of summary"
} >&2
exit "$rc"
