#!/usr/bin/env bash
# test/python/readme-install.sh — python/README.md's "## Install" section, run as a user runs it:
# its ```sh blocks in order, in a fresh clone of this repository (HEAD: commit first), then bytes
# moved over TCP with the venv they made, through `import tide` and through the drop-in's
# `from mooncake.engine import TransferEngine`; then README.md's Python quick start as written.
# Run by tools/run-tests (stage python-install).
#
#   bash test/python/readme-install.sh [--keep | --into DIR]
#     --keep: leave the clone (its path is printed)
#     --into DIR: clone into DIR (emptied first) and leave it; tools/run-tests then runs the python
#                 stages' pytest with the venv it made, DIR/.venv, instead of building the module twice
#
# The apt-get line runs as written when a package it names is missing (as root); when all are
# installed it is reported and skipped, so that no apt lock is taken.  Exit status 0 when every
# block and the transfers passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd -P)
keep=0 into=
while (($#)); do
  a=$1
  shift
  case $a in
    --keep) keep=1 ;;
    --into)
      (($#)) || { echo "readme-install: --into needs a directory" >&2; exit 2; }
      into=$1 keep=1
      shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "readme-install: unknown argument '$a' (see --help)" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d "${TMPDIR:-/tmp}/tide-readme-install.XXXXXX")
trap 'rm -rf "$work"' EXIT  # the scratch files; the clone lives here unless kept elsewhere
clone=$work/tide
if [[ -n $into ]]; then
  mkdir -p "$(dirname "$into")"
  clone=$(cd "$(dirname "$into")" && pwd -P)/$(basename "$into")
  rm -rf "$clone"
elif ((keep)); then
  clone=$(mktemp -d "${TMPDIR:-/tmp}/tide-readme-install-clone.XXXXXX")/tide
fi
((keep)) && echo "readme-install: clone kept in $clone" >&2
git clone -q "$root" "$clone"

# The blocks of the section "## Install" (with its subsections), as one script.
/usr/bin/python3 - "$clone/python/README.md" > "$work/blocks.sh" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"^## Install\n(.*?)(?=^## )", text + "\n## end\n", re.S | re.M)
if not m:
    sys.exit("python/README.md has no '## Install' section")
blocks = re.findall(r"^```sh\n(.*?)^```", m.group(1), re.S | re.M)
if len(blocks) < 2:
    sys.exit(f"python/README.md's Install section has {len(blocks)} sh blocks, expected the apt-get and venv ones")
# The top-level README.md quotes the venv and drop-in commands: they must be these.
readme = open(sys.argv[1].replace("python/README.md", "README.md")).read()
quoted = [l for b in re.findall(r"^```sh\n(.*?)^```", readme, re.S | re.M) for l in b.splitlines()
          if l.startswith(".venv/") or "-m venv" in l]
missing = [l for l in quoted if l not in "\n".join(blocks).splitlines()]
if not quoted or missing:
    sys.exit(f"README.md's Python commands differ from python/README.md's Install section: {missing or 'none quoted'}")
print("\n".join(blocks))
EOF
echo "=== the blocks of python/README.md's Install section:" >&2
cat "$work/blocks.sh" >&2

(
  cd "$clone"
  # apt-get as written when something is missing, else nothing (no lock, no network).
  apt-get() {
    local p missing=()
    for p in "$@"; do
      [[ $p == -* || $p == install ]] && continue
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then
      echo "readme-install: every package of 'apt-get $*' is installed: skipped" >&2
      return 0
    fi
    command apt-get "$@"
  }
  set -x
  # shellcheck disable=SC1091
  source "$work/blocks.sh"
)

echo "=== a transfer over TCP with the venv the blocks made" >&2
py=$clone/.venv/bin/python
cd "$work"  # not the clone: `import tide` must be the installed module
"$py" - <<'EOF'
import tide

a = tide.Engine(local_server_name="127.0.0.1", transports="tcp")
b = tide.Engine(local_server_name="127.0.0.1", transports="tcp")
src = a.register(bytearray(bytes(range(256)) * 64))
dst = b.register(bytearray(len(src)))
seg = a.open(b.segment_name)
assert a.transfer([tide.write(src, seg, dst.buffer_id)], timeout=60) == len(src)
assert bytes(dst.obj) == bytes(src.obj)
a.close(); b.close()
print("readme-install: tide", tide.__version__, "moved", len(src), "bytes over TCP")
EOF
"$py" - <<'EOF'
import ctypes
from mooncake.engine import TransferEngine, TransferOpcode

a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
src = ctypes.create_string_buffer(bytes(range(256)) * 64)
dst = ctypes.create_string_buffer(len(src))
assert a.register_memory(ctypes.addressof(src), len(src)) == 0
assert b.register_memory(ctypes.addressof(dst), len(dst)) == 0
peer = f"127.0.0.1:{b.get_rpc_port()}"
assert a.transfer_sync(peer, ctypes.addressof(src), ctypes.addressof(dst), len(src), TransferOpcode.Write) == 0
assert dst.raw == src.raw
a.close(); b.close()
print("readme-install: mooncake.engine moved", len(src), "bytes over TCP")
EOF
echo "=== the drop-in from every working directory a user may be in" >&2
# From the clone's root, python/compat (the drop-in's source copy beside the installed one: the
# same package, not a Mooncake to refuse) and /; from python/ the source tree's `tide` shadows the
# installed one, and the error must say so.
for d in "$clone" "$clone/python/compat" /; do
  got=$(cd "$d" && "$py" -c 'from mooncake.engine import TransferEngine; print(TransferEngine.__module__)' 2>&1) ||
    { echo "$got" >&2; echo "readme-install: from mooncake.engine failed with the working directory $d" >&2; exit 1; }
  [[ $got == tide._mooncake ]] || { echo "readme-install: in $d mooncake.engine is '$got'" >&2; exit 1; }
done
for code in 'import tide' 'from mooncake.engine import TransferEngine'; do
  if got=$(cd "$clone/python" && "$py" -c "$code" 2>&1) || [[ $got != *"tide's source tree"* ]]; then
    echo "$got" >&2
    echo "readme-install: '$code' from python/ did not say that tide there is the source tree" >&2
    exit 1
  fi
done
# python/compat/README.md writes the path without ./: the same install.
(cd "$clone" && "$clone/.venv/bin/pip" install -q --no-build-isolation --no-index --force-reinstall --no-deps python/compat)
for d in "$clone" "$clone/python/compat" /; do
  (cd "$d" && "$py" -c 'from mooncake.engine import TransferEngine') ||
    { echo "readme-install: after 'pip install python/compat', the drop-in failed in $d" >&2; exit 1; }
done

echo "=== README.md's Python quick start (target.py, initiator.py) as written" >&2
# The blocks are run unchanged; the environment keeps them on loopback (a program that sets no
# local_server_name takes TIDE_LOCAL_SERVER_NAME).
/usr/bin/python3 - "$clone/README.md" "$work" <<'EOF'
import re, sys
readme, out = open(sys.argv[1]).read(), sys.argv[2]
blocks = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
for name in ("target.py", "initiator.py"):
    found = [b for b in blocks if f"# {name}" in b.splitlines()[0]]
    if len(found) != 1:
        sys.exit(f"README.md has {len(found)} python blocks whose first line names {name}")
    open(f"{out}/{name}", "w").write(found[0])
EOF
export TIDE_LOCAL_SERVER_NAME=127.0.0.1
mkfifo "$work/target.stdin"
"$py" "$work/target.py" < "$work/target.stdin" > "$work/target.out" 2> "$work/target.err" &
target=$!
exec 7> "$work/target.stdin"  # held open: the target's input() waits until it is closed
for _ in $(seq 600); do  # its first line, or its exit; 60 s at most
  [[ -s $work/target.out ]] && break
  kill -0 "$target" 2>/dev/null || break
  sleep 0.1
done
read -r name id < "$work/target.out" || {
  cat "$work/target.err" >&2
  echo "readme-install: target.py printed nothing" >&2
  exit 1
}
got=$("$py" "$work/initiator.py" "$name" "$id")
echo "initiator.py: $got" >&2
echo >&7 && exec 7>&-  # Enter: the target stops
wait "$target" || { cat "$work/target.err" >&2; echo "readme-install: target.py failed" >&2; exit 1; }
[[ $got == "1048576 bytes" ]] || { echo "readme-install: initiator.py printed '$got', expected '1048576 bytes'" >&2; exit 1; }
unset TIDE_LOCAL_SERVER_NAME

echo "readme-install: passed" >&2
