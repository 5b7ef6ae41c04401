# shellcheck shell=bash
# tools/rxe-vm.d/guest-net.sh — the Soft-RoCE network inside tools/rxe-vm's guest.
# The guest script sources it and calls net_setup; `tide-vm-link` (on the guest's PATH)
# runs it with "link ..." to take links down and up while traffic runs.
# It reads /run/tide/net.conf (written by tools/rxe-vm): NICS, TOPOLOGY and RATES / LOSSES /
# DELAYS (one word per link, "-" for none).
#
# Layout, N = NICS, devices k = 0 .. 2N-1:
#   rxe<k> on netdev veth<k>, address 10.47.<k/2>.<k%2+1>/24, GID index 1 (RoCE v2, IPv4).
#   Side A = even k (rxe0 rxe2 ...), side B = odd k (rxe1 rxe3 ...); link i joins rxe<2i> and rxe<2i+1>.
#   rails: link i is the veth pair veth<2i> <-> veth<2i+1>; nothing joins two links
#          (N = 1 is the default two-device VM).
#   mesh:  every veth<k> is one end of a cable whose other end, fab<k>, is a port of the bridge
#          "fabric"; link i is the cables of rxe<2i> and rxe<2i+1>.
# Rate, loss and delay of link i shape both directions of each of its cables (tbf under netem).
#
# Why policy routing: rxe in kernel 6.1 has no network namespaces, so all addresses live in one
# namespace, where a packet between two local addresses would short-cut through lo (and rxe,
# which only accepts packets arriving on its own netdev, drops it). For every local source
# address, rule 10+k (iif lo = locally sent) looks up table 47+k first, which routes to each
# peer the topology lets rxe<k> reach over veth<k>; the local table comes after (pref 100).
# A peer the topology does not connect (rails, cross-rail) has no route from that device, so
# ibv_modify_qp to RTR fails ("Unable to Connect the HCA's through the link" in perftest).
# A link taken down (tide-vm-link) loses carrier: its rxe ports go DOWN (IBV_EVENT_PORT_ERR);
# QPs on it stall (measured: no retry-exceeded completion within minutes), they do not fail.

NET_CONF=/run/tide/net.conf

net_ip() { echo "10.47.$(($1 / 2)).$(($1 % 2 + 1))"; }
net_field() { local -a a; read -r -a a <<< "$1"; local v=${a[$2]:-${a[0]:--}}; [[ $v == - ]] || echo "$v"; }

# Devices rxe<k> reaches: rails its link partner, mesh everyone else.
net_peers() {
  local k=$1 d
  if [[ $TOPOLOGY == rails ]]; then echo $((k ^ 1)); return; fi
  for ((d = 0; d < 2 * NICS; d++)); do ((d == k)) || echo "$d"; done
}

# The routes of table 47+k (again after `ip link set veth<k> up`, which flushed them).
net_routes() {
  local k=$1 d
  for d in $(net_peers "$k"); do
    echo "route replace $(net_ip "$d")/32 dev veth$k src $(net_ip "$k") table $((47 + k))"
  done
}

# shape DEV RATE LOSS DELAY: tbf (rate, deep queue) under netem (loss, delay) on DEV's egress.
net_shape() {
  local dev=$1 rate=$2 loss=$3 delay=$4 bps burst limit parent=root
  [[ -n $rate$loss$delay ]] || return 0
  if [[ -n $loss$delay ]]; then
    tc qdisc add dev "$dev" root handle 1: netem limit 100000 ${delay:+delay "$delay"} ${loss:+loss "$loss"} || return 1
    parent="parent 1:1"
  fi
  if [[ -n $rate ]]; then
    bps=$(tc_rate_bits "$rate") || return 1
    # Burst 10 ms of the rate (at least two jumbo frames), queue 250 ms (at least 2 MB): rxe keeps
    # at most ~64 packets per QP in flight, so the queue absorbs them and the link paces them.
    burst=$((bps / 800)); ((burst >= 32768)) || burst=32768
    limit=$((bps / 32)); ((limit >= 2097152)) || limit=2097152
    # shellcheck disable=SC2086  # $parent is two words
    tc qdisc add dev "$dev" $parent handle 2: tbf rate "$rate" burst "$burst" limit "$limit" || return 1
  fi
}

# tc rate text (200mbit, 1gbit, 25mbps, 800kbit ...) in bits per second.
tc_rate_bits() {
  awk -v r="$1" 'BEGIN {
    n = r + 0; u = tolower(r); sub(/^[0-9.]+/, "", u)
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
    if (!(u in m) || n <= 0) exit 1
    printf "%.0f\n", n * m[u] }'
}

# The netdevs of link i's cables, whose egress is shaped: both directions of the link.
net_link_shaped() {
  local i=$1
  if [[ $TOPOLOGY == rails ]]; then echo "veth$((2 * i)) veth$((2 * i + 1))"
  else echo "veth$((2 * i)) fab$((2 * i)) veth$((2 * i + 1)) fab$((2 * i + 1))"; fi
}

net_setup() {
  # shellcheck source=/dev/null
  source "$NET_CONF" || return 1
  local k i n=$((2 * NICS)) dev devs=() ips=() netdevs=() side_a=() side_b=()
  sysctl_set() { echo "$2" > "/proc/sys/net/ipv4/conf/$1/$3" || return 1; }
  # A veth delivers into the receiving CPU's backlog (1000 packets by default).
  # When that is full, Soft-RoCE's responder cannot send a READ response packet
  # (hw_counters/send_err), answers RNR NAK, and the requester has been seen to
  # complete that READ successfully without its data (one 64 KiB READ in 512,
  # test/rxe/lanes_test.cpp's 16 peers).  A deep backlog keeps send_err at 0, as a
  # real NIC never drops its own responses; loss is what --loss is for.
  echo 100000 > /proc/sys/net/core/netdev_max_backlog || return 1
  for dev in all default; do
    sysctl_set "$dev" 1 accept_local && sysctl_set "$dev" 0 rp_filter || return 1
    # Mesh: one L2 segment holds every address; only the netdev owning one answers ARP for it.
    sysctl_set "$dev" 1 arp_ignore && sysctl_set "$dev" 2 arp_announce || return 1
  done
  {
    echo "link set lo up"
    if [[ $TOPOLOGY == rails ]]; then
      for ((i = 0; i < NICS; i++)); do
        echo "link add veth$((2 * i)) mtu 9000 type veth peer name veth$((2 * i + 1)) mtu 9000"
      done
    else
      echo "link add fabric mtu 9000 type bridge stp_state 0 forward_delay 0"
      for ((k = 0; k < n; k++)); do
        echo "link add veth$k mtu 9000 type veth peer name fab$k mtu 9000"
        echo "link set fab$k master fabric"
      done
    fi
    for ((k = 0; k < n; k++)); do echo "addr add $(net_ip "$k")/24 dev veth$k"; done
    [[ $TOPOLOGY == rails ]] || echo "link set fabric up"
    for ((k = 0; k < n; k++)); do
      echo "link set veth$k up"
      [[ $TOPOLOGY == rails ]] || echo "link set fab$k up"
    done
    for ((k = 0; k < n; k++)); do net_routes "$k"; done
    for ((k = 0; k < n; k++)); do echo "rule add pref $((10 + k)) iif lo from $(net_ip "$k") lookup $((47 + k))"; done
    echo "rule add pref 100 lookup local"
    echo "rule del pref 0 lookup local"
  } | ip -batch - || return 1
  for ((k = 0; k < n; k++)); do
    sysctl_set "veth$k" 1 accept_local && sysctl_set "veth$k" 0 rp_filter || return 1
  done
  for ((i = 0; i < NICS; i++)); do
    for dev in $(net_link_shaped "$i"); do
      net_shape "$dev" "$(net_field "$RATES" "$i")" "$(net_field "$LOSSES" "$i")" "$(net_field "$DELAYS" "$i")" \
        || { echo "[rxe-vm] shaping $dev (link $i) failed" >&2; return 1; }
    done
  done
  for ((k = 0; k < n; k++)); do rdma link add "rxe$k" type rxe netdev "veth$k" || return 1; done
  printf '127.0.0.1\tlocalhost\n10.47.0.1\trxe-vm\n' > /etc/hosts
  for ((k = 0; k < n; k++)); do
    net_wait_port "rxe$k" ACTIVE || echo "[rxe-vm] rxe$k's port is not ACTIVE after 30 s" >&2
    devs+=("rxe$k") netdevs+=("veth$k") ips+=("$(net_ip "$k")")
    if ((k % 2)); then side_b+=("rxe$k"); else side_a+=("rxe$k"); fi
    export "RXE_VM_IP_rxe$k=$(net_ip "$k")" "RXE_VM_NETDEV_rxe$k=veth$k"
  done
  export RXE_VM_DEVICES="${devs[*]}" RXE_VM_NETDEVS="${netdevs[*]}" RXE_VM_IPS="${ips[*]}"
  export RXE_VM_SIDE_A="${side_a[*]}" RXE_VM_SIDE_B="${side_b[*]}"
  export RXE_VM_NICS=$NICS RXE_VM_TOPOLOGY=$TOPOLOGY RXE_VM_GID_INDEX=1
  export RXE_VM_RATES=$RATES RXE_VM_LOSSES=$LOSSES RXE_VM_DELAYS=$DELAYS
}

# net_wait_port DEV STATE: up to 30 s for rxe DEV's port 1 to reach STATE (ACTIVE, DOWN). Counted
# in seconds, not polls: an emulated guest on a busy host may get little CPU.
net_wait_port() {
  local deadline=$((SECONDS + 30)) state=""
  while :; do
    read -r _ state < "/sys/class/infiniband/$1/ports/1/state" 2> /dev/null  # "4: ACTIVE"
    [[ $state == "$2" ]] && return 0
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

net_link_usage() {
  cat <<'USAGE'
usage: tide-vm-link down|up LINK     take a link down / bring it back (waits for the rxe ports)
       tide-vm-link status           links, rxe port states, shaping, byte counters
LINK: a link index i (rails: the veth pair of rxe<2i> and rxe<2i+1>; mesh: the cables of
rxe<2i> and rxe<2i+1> into the fabric), or a device rxe<k> / veth<k> (mesh: only that
device's cable; rails: its whole link). Other links are never touched.
USAGE
}

# tide-vm-link: only the named link changes; the others keep carrier and routes.
net_link() {
  # shellcheck source=/dev/null
  source "$NET_CONF" || exit 1
  local cmd=${1:-} what=${2:-} i k cut=() ports=() d
  case $cmd in
    status) net_link_status; return ;;
    down|up) ;;
    -h|--help|help) net_link_usage; return 0 ;;
    *) net_link_usage >&2; return 2 ;;
  esac
  if [[ $what =~ ^[0-9]+$ ]] && ((what < NICS)); then
    i=$what
    if [[ $TOPOLOGY == rails ]]; then cut=("veth$((2 * i + 1))"); else cut=("fab$((2 * i))" "fab$((2 * i + 1))"); fi
    ports=("rxe$((2 * i))" "rxe$((2 * i + 1))")
  elif [[ $what =~ ^(rxe|veth)([0-9]+)$ ]] && ((BASH_REMATCH[2] < 2 * NICS)); then
    k=${BASH_REMATCH[2]}
    if [[ $TOPOLOGY == rails ]]; then
      cut=("veth$((k | 1))"); ports=("rxe$((k & ~1))" "rxe$((k | 1))")
    else
      cut=("fab$k"); ports=("rxe$k")
    fi
  else
    echo "tide-vm-link: '$what' is not a link 0..$((NICS - 1)) nor a device rxe0..rxe$((2 * NICS - 1))" >&2
    return 2
  fi
  for d in "${cut[@]}"; do ip link set "$d" "$cmd" || return 1; done
  if [[ $cmd == up && $TOPOLOGY == rails ]]; then
    # Setting a NIC's netdev down flushed its routes, the policy routes among them.
    for d in "${cut[@]}"; do net_routes "${d#veth}" | ip -batch - || return 1; done
  fi
  local want=ACTIVE; [[ $cmd == up ]] || want=DOWN
  for d in "${ports[@]}"; do
    net_wait_port "$d" "$want" || { echo "tide-vm-link: $d's port did not become $want" >&2; return 1; }
  done
}

net_link_status() {
  local k i dev
  echo "topology $TOPOLOGY, $NICS NICs per side"
  for ((k = 0; k < 2 * NICS; k++)); do
    printf 'rxe%-3s veth%-3s %-12s port %-8s link %d  tx %12s  rx %12s bytes\n' "$k" "$k" "$(net_ip "$k")" \
      "$(awk '{print $2}' "/sys/class/infiniband/rxe$k/ports/1/state")" $((k / 2)) \
      "$(cat "/sys/class/net/veth$k/statistics/tx_bytes")" "$(cat "/sys/class/net/veth$k/statistics/rx_bytes")"
  done
  for ((i = 0; i < NICS; i++)); do
    for dev in $(net_link_shaped "$i"); do
      tc qdisc show dev "$dev" | sed "s/^/link $i $dev: /" | grep -v 'noqueue' || true
    done
  done
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  case ${1:-} in
    link) shift; net_link "$@"; exit ;;
    *) echo "usage: $0 link down|up|status ..." >&2; exit 2 ;;
  esac
fi
