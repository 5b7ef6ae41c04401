#!/usr/bin/env bash
# consumer.sh installed|subproject SOURCE_ROOT BUILD_ROOT
#   installed:  meson install into a temp DESTDIR, then build main.cpp with
#               `pkg-config --cflags --libs tide` from that tree and run it.
#   subproject: a tiny meson project whose subprojects/tide links to the source
#               tree; configure, build and run it.
set -euo pipefail
mode=$1 src=$(cd "$2" && pwd -P) build=$(cd "$3" && pwd -P)
here=$src/test/consumer
tmp=$(mktemp -d "$build/consumer-$mode.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

case $mode in
  installed)
    meson install -C "$build" --no-rebuild --destdir "$tmp/root" --quiet
    pc=$(find "$tmp/root" -name tide.pc | head -n1)
    [[ -n $pc ]] || { echo "meson install put no tide.pc under $tmp/root" >&2; exit 1; }
    [[ -n $(find "$tmp/root" -path '*/include/tide/verbs/qp.hpp') ]] \
      || { echo "tide headers were not installed" >&2; exit 1; }
    [[ -n $(find "$tmp/root" -path '*/include/tide/policy' -type d) ]] \
      || { echo "include/tide/policy (the policies) was not installed" >&2; exit 1; }
    # The .pc names the final prefix; the sysroot points it into DESTDIR.
    export PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$tmp/root
    flags=$(pkg-config --cflags --libs tide)
    echo "pkg-config --cflags --libs tide: $flags"
    # shellcheck disable=SC2086  # flags are words
    ${CXX:-c++} -Wall -Wextra -Werror "$here/main.cpp" -o "$tmp/consumer" $flags
    LD_LIBRARY_PATH=$tmp/root$(pkg-config --variable=libdir tide | sed "s|^$tmp/root||") "$tmp/consumer"
    # A user's translation unit that includes <tide/engine.hpp> includes no
    # Boost.Asio header: Asio stays behind src/ (it used to come in through
    # rdma/connector.hpp, ~110k of ~219k preprocessed lines).
    # shellcheck disable=SC2046  # the cflags are words
    deps=$(echo '#include <tide/engine.hpp>' | ${CXX:-c++} -std=c++20 -x c++ -M - $(pkg-config --cflags tide))
    if grep -q 'boost/asio' <<< "$deps"; then
      echo "<tide/engine.hpp> pulls in Boost.Asio:" >&2
      grep -o '[^ ]*boost/asio[^ ]*' <<< "$deps" | head -n 5 >&2
      exit 1
    fi
    echo "<tide/engine.hpp>: no boost/asio header among $(wc -w <<< "$deps") dependencies"
    # Every ```cpp block of README.md and of docs/*.md, against the same installed tree.
    # shellcheck disable=SC2086
    bash "$here/readme_snippets.sh" "$src/README.md" "$tmp/readme" $flags
    for page in "$src"/docs/*.md; do
      grep -q '^```cpp' "$page" || continue
      # shellcheck disable=SC2086
      bash "$here/readme_snippets.sh" "$page" "$tmp/docs-$(basename "$page" .md)" $flags
    done
    ;;
  subproject)
    mkdir -p "$tmp/proj/subprojects"
    ln -s "$src" "$tmp/proj/subprojects/tide"
    cp "$here/main.cpp" "$tmp/proj/"
    # debug=false: what is tested is the subproject's meson interface, and the library's -O0
    # compile without debug info takes about a quarter less time.
    cat > "$tmp/proj/meson.build" <<'MESON'
project('tide-consumer', 'cpp', default_options : ['cpp_std=c++20', 'warning_level=3', 'werror=true', 'debug=false'])
tide_dep = subproject('tide', default_options : ['tests=false', 'bench=false']).get_variable('tide_dep')
executable('consumer', 'main.cpp', dependencies : tide_dep)
MESON
    meson setup "$tmp/build" "$tmp/proj" --wrap-mode=nodownload >/dev/null
    meson compile -C "$tmp/build" consumer
    "$tmp/build/consumer"
    ;;
  *) echo "usage: consumer.sh installed|subproject SOURCE_ROOT BUILD_ROOT" >&2; exit 2 ;;
esac
