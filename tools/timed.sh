#!/usr/bin/env bash
# Usage: tools/timed.sh PART COMMAND [ARG...]
#
# Runs COMMAND, then prints how long it took as "== PART: 12.3 s" (with its exit status
# when it failed), so that a CI log of `make test` shows where the time goes. Where
# TEST_TIMES names a file, the line is appended there too: `make test` prints them all
# together at its end. Exits with COMMAND's status.
set -u
part=$1
shift
start=$(date +%s%N)
"$@"
status=$?
ms=$((($(date +%s%N) - start) / 1000000))
line=$(printf '%-12s %6d.%d s' "$part:" $((ms / 1000)) $((ms % 1000 / 100)))
if [ "$status" -ne 0 ]; then
  line="$line (failed, exit $status)"
fi
echo "== $line"
if [ -n "${TEST_TIMES:-}" ]; then
  echo "$line" >> "$TEST_TIMES"
fi
exit "$status"
