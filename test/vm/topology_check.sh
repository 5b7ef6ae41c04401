#!/usr/bin/env bash
# test/vm/topology_check.sh — checks tools/rxe-vm's multi-NIC network itself, inside a VM with
# two or more NICs per side (tools/run-tests runs it in `--nics 2 --topology mesh`):
#   1. every (side A, side B) pair the topology connects exchanges verified RC messages
#      (ibv_rc_pingpong -c), every pair it does not connect (rails, cross-rail) fails;
#   2. the bytes of a pair cross exactly that pair's netdevs (link counters), not lo, not others;
#   3. `tide-vm-link down 0` kills exactly the pairs that use link 0 (mesh: both its cables;
#      rails: its veth pair), the others keep working; after `up 0` all connected pairs work again
#      (these two rounds run all pairs at once).
# Prints one line per check and "topology check: N passed, N failed"; exit 0 when none failed.
set -uo pipefail

[[ -n ${RXE_VM_SIDE_A:-} && -n ${RXE_VM_SIDE_B:-} ]] \
    || { echo "topology check: not in tools/rxe-vm with --nics 2 (no RXE_VM_SIDE_A/B)"; exit 77; }
command -v tide-vm-link > /dev/null || { echo "topology check: tide-vm-link is not on PATH"; exit 1; }
read -r -a A <<< "$RXE_VM_SIDE_A"
read -r -a B <<< "$RXE_VM_SIDE_B"
((${#A[@]} >= 2 && ${#A[@]} == ${#B[@]})) || { echo "topology check: needs two or more NICs per side"; exit 77; }
ITERS=20 SIZE=4096 GID=${RXE_VM_GID_INDEX:-1}
passed=0 failed=0
WORK=$(mktemp -d); trap 'kill $(jobs -p) 2> /dev/null; rm -rf "$WORK"' EXIT

var() { local v=$1; echo "${!v}"; }
bytes() { cat "/sys/class/net/$1/statistics/$2_bytes"; }
check() {   # check OK? MESSAGE
    if [[ $1 == 1 ]]; then passed=$((passed + 1)); echo "ok   $2"; else failed=$((failed + 1)); echo "FAIL $2"; fi
}

# pingpong SERVER_DEV CLIENT_DEV: 0 when ITERS verified exchanges of SIZE bytes completed.
# Each call its own TCP port (subshells running at once would draw the same $RANDOM).
PORT=$((30000 + RANDOM % 20000))
pingpong() {
    local srv=$1 cli=$2 port=$((PORT += 1)) sp rc deadline=$((SECONDS + 30))
    timeout 60 ibv_rc_pingpong -d "$srv" -g "$GID" -p "$port" -n "$ITERS" -s "$SIZE" -c -e > "$WORK/srv.log" 2>&1 &
    sp=$!
    # The server listens once its device is open: seconds on a busy emulated guest.
    until ss -Hltn "sport = :$port" | grep -q . || ((SECONDS > deadline)); do sleep 0.1; done
    timeout 30 ibv_rc_pingpong -d "$cli" -g "$GID" -p "$port" -n "$ITERS" -s "$SIZE" -c -e \
        "$(var "RXE_VM_IP_$srv")" > "$WORK/cli.log" 2>&1
    rc=$?
    # A dead path leaves the server waiting for a message that never comes.
    ((rc == 0)) && { wait "$sp"; rc=$?; } || { kill "$sp" 2> /dev/null; wait "$sp" 2> /dev/null; }
    return "$rc"
}

# connected I J: does the topology (with link DOWN_LINK down) join A[I] and B[J]?
DOWN_LINK=-1
connected() {
    local i=$1 j=$2
    ((i == DOWN_LINK || j == DOWN_LINK)) && return 1
    [[ $RXE_VM_TOPOLOGY == mesh ]] || ((i == j))
}

# every_pair WHEN: each (A[i], B[j]) works exactly when connected; the bytes of each pair cross
# its two netdevs and nothing else (pairs one after the other, link counters around each).
every_pair() {
    local i j k nd_a nd_b want got others name delta before after nds
    read -r -a nds <<< "$RXE_VM_NETDEVS lo"
    for ((i = 0; i < ${#A[@]}; i++)); do
        for ((j = 0; j < ${#B[@]}; j++)); do
            nd_a=$(var "RXE_VM_NETDEV_${A[i]}") nd_b=$(var "RXE_VM_NETDEV_${B[j]}")
            before=(); for k in "${nds[@]}"; do before+=("$(bytes "$k" tx)"); done
            if pingpong "${B[j]}" "${A[i]}"; then got=1; else got=0; fi
            if connected "$i" "$j"; then want=1; else want=0; fi
            check $((got == want)) "$1: ${A[i]} <-> ${B[j]} $( ((want)) && echo works || echo "does not connect")"
            ((got == want)) || sed 's/^/     /' "$WORK/cli.log"
            ((got && want)) || continue
            after=(); for k in "${nds[@]}"; do after+=("$(bytes "$k" tx)"); done
            others=""
            for ((k = 0; k < ${#nds[@]}; k++)); do
                name=${nds[k]} delta=$((after[k] - before[k]))
                if [[ $name == "$nd_a" || $name == "$nd_b" ]]; then
                    ((delta >= ITERS * SIZE)) || others+=" $name sent only $delta"
                elif ((delta >= ITERS * SIZE / 2)); then
                    others+=" $name sent $delta"
                fi
            done
            check "$([[ -z $others ]] && echo 1 || echo 0)" "$1: ${A[i]} <-> ${B[j]} bytes over $nd_a and $nd_b only${others:+ (but$others)}"
        done
    done
}

# every_pair_at_once WHEN: the same reachability, all pairs at the same time (the counters would mix).
every_pair_at_once() {
    local i j pids=() want got
    for ((i = 0; i < ${#A[@]}; i++)); do
        for ((j = 0; j < ${#B[@]}; j++)); do
            PORT=$((PORT + 1))
            ( WORK=$WORK/$i-$j; mkdir -p "$WORK"; pingpong "${B[j]}" "${A[i]}" ) &
            pids+=($!)
        done
    done
    for ((i = 0; i < ${#A[@]}; i++)); do
        for ((j = 0; j < ${#B[@]}; j++)); do
            if wait "${pids[i * ${#B[@]} + j]}"; then got=1; else got=0; fi
            if connected "$i" "$j"; then want=1; else want=0; fi
            check $((got == want)) "$1: ${A[i]} <-> ${B[j]} $( ((want)) && echo works || echo "does not connect")"
            ((got == want)) || sed 's/^/     /' "$WORK/$i-$j/cli.log"
        done
    done
}

t0=$SECONDS
echo "topology $RXE_VM_TOPOLOGY: side A $RXE_VM_SIDE_A, side B $RXE_VM_SIDE_B"
every_pair "all up"
if tide-vm-link down 0; then check 1 "tide-vm-link down 0"; else check 0 "tide-vm-link down 0"; fi
DOWN_LINK=0
every_pair_at_once "link 0 down"
if tide-vm-link up 0; then check 1 "tide-vm-link up 0"; else check 0 "tide-vm-link up 0"; fi
DOWN_LINK=-1
every_pair_at_once "link 0 up again"
echo "topology check: $passed passed, $failed failed ($((SECONDS - t0)) s)"
((failed == 0))
