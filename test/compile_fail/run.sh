#!/bin/sh
# Compile-time checks of the policy layer:
#  1. every case here must FAIL to compile, and its diagnostic must contain
#     the text of each of its "// expect:" lines (the static_assert that tells the
#     user what to change);
#  2. every policy header must compile on its own (self-contained).
# The compiles run $(nproc) at a time (they are the unit suite's longest test); the
# results print in a fixed order.
# Usage: run.sh SOURCE_ROOT CXX [CXX ARGS...]
set -u
root=$1; shift
here="$root/test/compile_fail"
flags="-std=c++20 -fsyntax-only -I$root/include -I$root/policies"
# Plain ASCII quotes in diagnostics, whatever the caller's locale.
export LC_ALL=C
out_dir=$(mktemp -d)
trap 'rm -rf "$out_dir"' EXIT
jobs=$(nproc 2> /dev/null || echo 2)

# check_case FILE CXX...: FILE must fail to compile, every "// expect:" text in its diagnostics.
check_case() {
  f=$1; shift
  want=$(sed -n 's|^// expect: ||p' "$f" | head -n 1)
  # shellcheck disable=SC2086  # flags are words
  if out=$("$@" $flags "$f" 2>&1); then
    echo "FAIL $(basename "$f"): compiled, expected an error containing: $want"
    return
  fi
  missing=$(sed -n 's|^// expect: ||p' "$f" | while IFS= read -r w; do
    printf '%s' "$out" | grep -F -q -- "$w" || printf '%s\n' "$w"
  done)
  if [ -z "$missing" ]; then
    echo "ok   $(basename "$f")"
  else
    echo "FAIL $(basename "$f"): the error does not say: $missing"
    printf '%s\n' "$out" | grep -m 5 'error' | sed 's/^/     /'
  fi
}

# check_header HEADER CXX...: HEADER compiles on its own and included twice, warning-free.
check_header() {
  rel=${1#"$root"/}; shift
  inc=${rel#include/}; inc=${inc#policies/}
  # shellcheck disable=SC2086
  if printf '#include <%s>\n#include <%s>\n' "$inc" "$inc" | "$@" $flags -Wall -Wextra -Wpedantic -Werror -x c++ - 2> /dev/null; then
    echo "ok   header $inc"
  else
    echo "FAIL header $inc does not compile on its own (or twice)"
  fi
}

# spawn CMD...: runs CMD in the background into the next numbered output file, $jobs at a time.
n=0
spawn() {
  n=$((n + 1))
  "$@" > "$out_dir/$(printf '%04d' "$n")" &
  [ $((n % jobs)) -ne 0 ] || wait
}
for f in "$here"/*.cpp; do spawn check_case "$f" "$@"; done
for h in "$root"/policies/tide/policy/*.hpp "$root"/policies/tide/policy/detail/*.hpp "$root"/include/tide/policies.hpp \
         "$root"/include/tide/rdma/endpoint_store.hpp "$root"/include/tide/detail/sharded_shared_mutex.hpp \
         "$root"/include/tide/detail/string_hash.hpp "$root"/include/tide/rdma/plan/*.hpp; do
  spawn check_header "$h" "$@"
done
wait
results=$(cat "$out_dir"/*)
printf '%s\n' "$results"
fails=$(printf '%s\n' "$results" | grep -c '^FAIL')
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
