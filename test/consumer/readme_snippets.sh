#!/usr/bin/env bash
# readme_snippets.sh MARKDOWN OUTDIR COMPILER-FLAGS...
# Compiles (and links) every ```cpp block of a Markdown file (README.md, a
# page of docs/) against the tide the flags point at, so the documentation
# cannot drift from the API.  A block's
# #include lines go first; the rest becomes the body of a function with
# `void* buf` and `std::size_t len` in scope (the names the README's
# fragments use).  main() calls nothing unless given an argument, so the
# snippets are linked but not run (they need RDMA devices and peers).
# Unused-variable warnings are off: a fragment may stop before using what
# it made.
set -euo pipefail
readme=$1 out=$2
shift 2
doc=$(basename "$readme")
flags=("$@")
mkdir -p "$out"
n=0
in_block=0
includes="" body=""
emit() {
  n=$((n + 1))
  local f="$out/readme_snippet_$n.cpp"
  {
    printf '%s' "$includes"
    printf '#include <cstddef>\n\nnamespace {\n'
    printf 'void readme_snippet([[maybe_unused]] void* buf, [[maybe_unused]] std::size_t len) {\n'
    printf '%s' "$body"
    printf '}\n}  // namespace\n\nint main(int argc, char**) {\n  if (argc > 1) readme_snippet(nullptr, 0);\n  return 0;\n}\n'
  } > "$f"
  if ${CXX:-c++} -std=c++20 -Wall -Wextra -Werror -Wno-unused-variable -Wno-unused-but-set-variable \
       "$f" -o "$out/readme_snippet_$n" "${flags[@]}" 2> "$out/readme_snippet_$n.log"; then
    echo "ok   $doc cpp block $n"
  else
    echo "FAIL $doc cpp block $n does not compile ($f):" >&2
    sed -n '1,30p' "$out/readme_snippet_$n.log" >&2
    exit 1
  fi
}
while IFS= read -r line || [[ -n $line ]]; do
  if (( in_block )); then
    if [[ $line == '```'* ]]; then
      emit
      in_block=0 includes="" body=""
    elif [[ $line == '#include'* ]]; then
      includes+="$line"$'\n'
    else
      body+="$line"$'\n'
    fi
  elif [[ $line == '```cpp'* ]]; then
    in_block=1
  fi
done < "$readme"
(( n > 0 )) || { echo "no \`\`\`cpp block found in $readme" >&2; exit 1; }
echo "$n $doc cpp block(s) compiled"
