# tools/common.sh — sourced by tools/run-tests and tools/run-bench.
# Installs what building tide needs (Debian 12, only what is missing) and
# configures the build directory.

TIDE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TIDE_BUILD=${TIDE_BUILD:-$TIDE_ROOT/build}
# The ThreadSanitizer build tools/sanitize (its TSan half) and tools/tsan-rxe share.
TIDE_TSAN_BUILD=${TIDE_TSAN_BUILD:-$TIDE_ROOT/build-tsan-rxe}
# What building and testing tide needs; the VM's own needs are tools/rxe-vm's.
TIDE_PACKAGES=(meson ninja-build g++ pkg-config cmake libibverbs-dev librdmacm-dev libnuma-dev
               libboost-dev nlohmann-json3-dev doctest-dev libexpected-dev iproute2
               etcd-server curl clang libclang-rt-14-dev
               libssl-dev openssl prometheus)

tide_say() { echo "[tide] $*" >&2; }
tide_die() { tide_say "ERROR: $*"; exit 1; }

# tide_ensure_packages [PKG...]: apt-get install those of TIDE_PACKAGES and PKG that are missing.
tide_ensure_packages() {
  local missing=() p
  for p in "${TIDE_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || tide_die "missing Debian packages: ${missing[*]} (run as root, or apt-get install them)"
  if ! apt-cache policy "${missing[0]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -qq >&2 || tide_say "apt-get update failed; trying with the package lists there are"
  fi
  tide_say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || tide_die "apt-get install ${missing[*]} failed"
}

# tide_configure: meson setup of $TIDE_BUILD unless it is configured already.
tide_configure() {
  if [[ ! -f $TIDE_BUILD/build.ninja ]]; then
    meson setup "$TIDE_BUILD" "$TIDE_ROOT" --wrap-mode=nodownload "$@" >&2 || tide_die "meson setup failed"
  fi
}

# tide_tsan_configure: meson setup of $TIDE_TSAN_BUILD with ThreadSanitizer unless it is
# configured already. One directory serves the TSan unit tests (tools/sanitize tsan) and the
# data path's (tools/tsan-rxe), so the library is compiled once for both. Boost.Asio's fences
# make g++ warn under TSan (-Wtsan). -O1 (not debugoptimized's -O2) and -g1 (line tables only):
# faster to build, and TSan's reports keep their frames and lines.
tide_tsan_configure() {
  local dir=$TIDE_TSAN_BUILD cxx=${CXX:-g++}
  [[ -f $dir/build.ninja ]] && return 0
  command -v ccache > /dev/null && [[ $cxx != ccache* ]] && cxx="ccache $cxx"
  CXX=$cxx meson setup "$dir" "$TIDE_ROOT" --wrap-mode=nodownload -Db_sanitize=thread -Dbuildtype=debug \
    -Doptimization=1 -Dcpp_args="-Wno-tsan -g1" >&2 || tide_die "meson setup of $dir failed"
}
