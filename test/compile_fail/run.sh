#!/bin/sh
# Compile-time checks of the policy layer:
#  1. every case here must FAIL to compile, and its diagnostic must contain
#     the text of each of its "// expect:" lines (the static_assert that tells the
#     user what to change);
#  2. every policy header must compile on its own (self-contained).
# Usage: run.sh SOURCE_ROOT CXX [CXX ARGS...]
set -u
root=$1; shift
here="$root/test/compile_fail"
flags="-std=c++20 -fsyntax-only -I$root/include -I$root/policies"
fails=0
# Plain ASCII quotes in diagnostics, whatever the caller's locale.
export LC_ALL=C
for f in "$here"/*.cpp; do
  want=$(sed -n 's|^// expect: ||p' "$f" | head -n 1)
  if out=$("$@" $flags "$f" 2>&1); then
    echo "FAIL $(basename "$f"): compiled, expected an error containing: $want"
    fails=$((fails + 1))
    continue
  fi
  # Every "// expect:" line must appear in the diagnostics.
  missing=$(sed -n 's|^// expect: ||p' "$f" | while IFS= read -r w; do
    printf '%s' "$out" | grep -F -q -- "$w" || printf '%s\n' "$w"
  done)
  if [ -z "$missing" ]; then
    echo "ok   $(basename "$f")"
  else
    echo "FAIL $(basename "$f"): the error does not say: $missing"
    printf '%s\n' "$out" | grep -m 5 'error' | sed 's/^/     /'
    fails=$((fails + 1))
  fi
done
for h in "$root"/policies/tide/policy/*.hpp "$root"/policies/tide/policy/detail/*.hpp "$root"/include/tide/policies.hpp \
         "$root"/include/tide/rdma/endpoint_store.hpp "$root"/include/tide/detail/sharded_shared_mutex.hpp \
         "$root"/include/tide/detail/string_hash.hpp; do
  rel=${h#"$root"/}
  inc=${rel#include/}; inc=${inc#policies/}
  if printf '#include <%s>\n#include <%s>\n' "$inc" "$inc" | "$@" $flags -Wall -Wextra -Wpedantic -Werror -x c++ - 2>/dev/null; then
    echo "ok   header $inc"
  else
    echo "FAIL header $inc does not compile on its own (or twice)"
    fails=$((fails + 1))
  fi
done
[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
