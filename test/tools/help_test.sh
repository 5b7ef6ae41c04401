#!/usr/bin/env bash
# test/tools/help_test.sh — every script in tools/ answers --help at once: exit status 0, a first
# line that starts with "usage:", nothing built, installed or started (a bounded run: a script
# that begins real work instead runs past the limit and fails).
#
#   bash test/tools/help_test.sh SOURCE_ROOT
set -uo pipefail
root=${1:?usage: help_test.sh SOURCE_ROOT}
failed=0
for tool in run-tests run-bench fuzz sanitize tsan-rxe python-wheel rxe-vm gpu-check; do
  out=$(cd / && timeout 10 bash "$root/tools/$tool" --help 2>&1)
  rc=$?
  first=$(head -n 1 <<< "$out")
  if ((rc != 0)) || [[ $first != usage:* ]]; then
    echo "FAIL tools/$tool --help: exit status $rc, first line '$first'"
    failed=1
  else
    echo "ok   tools/$tool --help: $first"
  fi
done
exit $failed
