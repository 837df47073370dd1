#!/usr/bin/env bash
# run-tests.sh VARIANT BIN... — run CMocka test executables, show their output, and print one
# closing line counting individual tests: "tests: N passed, M failed" (a binary that dies
# without a CMocka summary counts as one failed test). Exit 1 if anything failed. A binary's
# scratch directory ($TD_TEST_TMP/t<pid>, tests/test_common.h) is removed when it passes and
# kept (and named) when it fails.
set -u
variant=$1; shift
logdir=${TD_TEST_TMP:-/tmp}/logs
mkdir -p "$logdir"
pass=0; fail=0; broken=""
for t in "$@"; do
  name=$(basename "$t")
  log="$logdir/$name.log"
  "$t" >"$log" 2>&1 &
  pid=$!
  wait "$pid"
  rc=$?
  cat "$log"
  scratch=${TD_TEST_TMP:-/tmp}/t$pid
  if [ -d "$scratch" ]; then
    if [ "$rc" -eq 0 ]; then rm -rf "$scratch"; else echo "(scratch files of $name kept in $scratch)"; fi
  fi
  p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | awk '{s+=$NF} END {print s+0}')
  f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log" | awk '{s+=$3} END {print s+0}')
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  pass=$((pass + p)); fail=$((fail + f))
  [ "$rc" -ne 0 ] && broken="$broken $name(exit $rc)"
done
echo
echo "== $variant: $# test binaries${broken:+; failing:$broken}"
echo "tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ -z "$broken" ]
