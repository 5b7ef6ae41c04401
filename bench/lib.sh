# shellcheck shell=bash
# bench/lib.sh — sourced by the bench scripts: perftest and tide-bench runs
# on named devices, and figures out of their output. The caller sets BENCH (tide-bench),
# WORK (a scratch directory) and GID_INDEX.

# bench_die MSG: the script's name, MSG, exit 2.
bench_die() { echo "$(basename "$0"): $*" >&2; exit 2; }

# bench_failed WHAT: records a run that failed, in $BENCH_FAILURES (default $WORK/failed; a file,
# so runs in subshells count too); bench_finish, the script's last word, names them and exits 1
# when there were any, so a table with a failed row never passes for a good one.
bench_failed() {
    local f=${BENCH_FAILURES:-${WORK:-}/failed}
    [[ $f == /failed ]] || echo "$*" >> "$f"
    echo "$(basename "$0"): failed: $*" >&2
}
bench_finish() {
    local f=${BENCH_FAILURES:-${WORK:-}/failed}
    [[ -s $f ]] || return 0
    echo "$(basename "$0"): $(wc -l < "$f") run(s) failed:" >&2
    sed 's/^/  /' "$f" >&2
    exit 1
}

bench_need() {   # BUILD: tide-bench and perftest are there
    BENCH=$1/bench/tide-bench
    [[ -x $BENCH ]] || bench_die "$BENCH not built (meson compile -C $1 tide-bench)"
    command -v ib_write_bw > /dev/null || bench_die "perftest is not installed (apt-get install perftest)"
}

# The address of an rxe-vm device (RXE_VM_IP_<dev>), else the first IPv4 of its netdev, else 127.0.0.1.
dev_ip() {
    local v=RXE_VM_IP_$1 nd
    if [[ -n ${!v:-} ]]; then echo "${!v}"; return; fi
    nd=$(ls "/sys/class/infiniband/$1/device/net" 2>/dev/null | head -n1)
    ip -o -4 addr show dev "${nd:-lo}" 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4; exit}' | grep . || echo 127.0.0.1
}

# perftest TOOL SRV_DEV CLI_DEV ARGS...: one perftest run (with $PERFTEST_FLAGS), the client's
# output in $WORK/pt-cli.log; fails (with the output on stderr) when the client does.
# Each run its own TCP port; runs started at once from subshells must set PT_PORT apart first
# (subshells draw the same $RANDOM).
PT_PORT=$((18515 + RANDOM % 1000))
perftest() {
    local tool=$1 srv=$2 cli=$3 port=$((PT_PORT += 1)) sp rc=0
    shift 3
    # shellcheck disable=SC2206  # flags are words
    set -- ${PERFTEST_FLAGS:-} "$@"
    "$tool" -d "$srv" -x "$GID_INDEX" -p "$port" "$@" > "$WORK/pt-srv.log" 2>&1 &
    sp=$!
    # The server listens on its TCP port once it has set up (seconds under TCG emulation).
    for _ in $(seq 1 150); do
        ss -Hltn "sport = :$port" 2> /dev/null | grep -q . && break
        kill -0 "$sp" 2> /dev/null || break
        sleep 0.2
    done
    timeout 120 "$tool" -d "$cli" -x "$GID_INDEX" -p "$port" "$@" "$(dev_ip "$srv")" > "$WORK/pt-cli.log" 2>&1 || rc=$?
    # Its output goes to the log, not between a table's rows.
    if ((rc != 0)); then
        { echo "== $tool $srv <- $cli $* failed ($rc):"; cat "$WORK/pt-cli.log"; } >> "${TIDE_PERFTEST_LOG:-/dev/null}"
        bench_failed "$tool $srv <- $cli $* ($rc): $(grep -m1 -iE "can't|error|fail" "$WORK/pt-cli.log")"
    fi
    # The server ends with its client; one whose client never came would wait forever.
    for _ in $(seq 1 100); do kill -0 "$sp" 2> /dev/null || break; sleep 0.1; done
    kill "$sp" 2> /dev/null || true
    wait "$sp" 2> /dev/null || true
    return "$rc"
}

# perftest_bw TOOL SRV_DEV CLI_DEV SECONDS SIZE: bytes/s (0 when it failed).
perftest_bw() {
    perftest "$1" "$2" "$3" -D "$4" -s "$5" || { echo 0; return; }
    awk -v s="$5" '$1 == s && NF >= 5 {printf "%.0f\n", $4 * 1048576; f = 1} END {if (!f) print 0}' "$WORK/pt-cli.log"
}

# perftest_lat TOOL SRV_DEV CLI_DEV SIZE ITERS: "typical p99" in us ("0 0" when it failed).
perftest_lat() {
    perftest "$1" "$2" "$3" -s "$4" -n "$5" || { echo "0 0"; return; }
    awk -v s="$4" '$1 == s && NF >= 8 {print $5, $8; f = 1} END {if (!f) print "0 0"}' "$WORK/pt-cli.log"
}

# tide_target_start DEVS IP POLICY: a tide-bench target on the devices DEVS (comma list), with
# the extra flags in $TARGET_FLAGS; sets
# TARGET_PID and SEGMENT, fails when it printed no segment within 20 s.
tide_target_start() {

    # shellcheck disable=SC2086  # TARGET_FLAGS: extra flags, split on spaces
    "$BENCH" --mode=target --local_server_name="$2" --device_name="$1" --policy="$3" \
        --buffer_size="${TARGET_BUFFER:-64M}" --noprogress ${TARGET_FLAGS:-} > "$WORK/tb-srv.log" 2>&1 &
    TARGET_PID=$! SEGMENT=""
    for _ in $(seq 1 200); do
        SEGMENT=$(sed -n 's/^segment: //p' "$WORK/tb-srv.log" | head -n1)
        [[ -n $SEGMENT ]] && return 0
        kill -0 "$TARGET_PID" 2> /dev/null || break
        sleep 0.1
    done
    cat "$WORK/tb-srv.log" >&2
    bench_failed "tide-bench target on $1 printed no segment"
    tide_target_stop
    return 1
}
tide_target_stop() { kill "$TARGET_PID" 2> /dev/null || true; wait "$TARGET_PID" 2> /dev/null || true; }

# tide_initiator DEVS IP POLICY SECONDS FLAGS...: one run against $SEGMENT, JSON in $WORK/tb.json;
# run under the command words in the array INITIATOR_WRAP when it is set (e.g. env, taskset).
tide_initiator() {
    local devs=$1 ip=$2 policy=$3 secs=$4
    shift 4
    rm -f "$WORK/tb.json"
    timeout $((${secs%.*} + 90)) "${INITIATOR_WRAP[@]}" "$BENCH" --mode=initiator --segment_id="$SEGMENT" --local_server_name="$ip" \
        --device_name="$devs" --policy="$policy" --duration="$secs" --noprogress --json="$WORK/tb.json" "$@" \
        > "$WORK/tb-cli.log" 2>&1 || {
        tail -n 20 "$WORK/tb-cli.log" >&2
        bench_failed "tide-bench initiator on $devs ($policy) $*"
        return 1
    }
    # A run with failed requests is a failed row, whatever its throughput (its figures still print).
    local failed
    failed=$(tb_field failed_requests)
    [[ ${failed%.*} == 0 ]] || bench_failed "tide-bench initiator on $devs ($policy) $*: $failed failed requests"
}

# tb_field KEY: a number from tide-bench's --json output (one "key": value per line).
tb_field() { sed -n "s/^ *\"$1\": *\([-0-9.eE+]*\),\{0,1\}$/\1/p" "$WORK/tb.json" 2> /dev/null | grep . || echo 0; }

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR % 2) print a[(NR+1)/2]; else printf "%.1f\n", (a[NR/2]+a[NR/2+1])/2}'; }
mbs() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1e6}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a"}'; }
