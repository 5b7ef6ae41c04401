#pragma once
// The one table of engine_config's settings.  The JSON file, the
// environment, resolve()'s report and docs/configuration.md all walk it, so
// a setting has one name, one range and one line of meaning everywhere.

#include <tide/engine.hpp>

#include <chrono>
#include <climits>
#include <string_view>
#include <type_traits>

namespace tide::config_table {

/// Whether a field holds a std::chrono::duration (read as an integer count of its unit).
template <class T>
struct is_duration : std::false_type {};
template <class R, class Per>
struct is_duration<std::chrono::duration<R, Per>> : std::true_type {};

/// How a Mooncake MC_* variable's value is read (what Mooncake accepts).
enum class mc_rule : std::uint8_t {
  none,        ///< no Mooncake variable
  range,       ///< an integer in [mc_lo, mc_hi] (atoi-style: leading digits), times mc_scale
  mtu,         ///< exactly 512, 1024, 2048 or 4096
  text,        ///< the text as it is
  force_tcp,   ///< set to anything: "tcp" (Mooncake tests only that it is set)
};

struct spec {
  std::string_view key;      ///< JSON key; the variable is TIDE_ + upper(key)
  std::string_view meaning;  ///< one line for the reference
  long long lo = 0, hi = 0;  ///< numbers: the range (file, TIDE_*, program)
  std::string_view unit = {};
  std::string_view mc = {};  ///< Mooncake's variable, "" = none
  mc_rule rule = mc_rule::none;
  long long mc_lo = 0, mc_hi = 0, mc_scale = 1;
  std::string_view mc_note = {};    ///< how tide reads it, where that is not obvious
  std::string_view old_env = {};    ///< a former TIDE_ spelling, still read (deprecated)
  std::string_view mc_fallback = {};  ///< a second variable Mooncake reads for it (NCCL_IB_GID_INDEX)
};

constexpr long long kMaxMs = 1LL << 40;

// Every setting, in the reference's order: f(spec, &engine_config::field).
// f returns a status; the first error stops the walk.
template <class F>
status each(F&& f) {
  using c = engine_config;
#define TIDE_SETTING(member, ...)                                                     \
  if (auto r = f(spec{__VA_ARGS__}, &c::member); !r) return r;
  // ---- identity and metadata ----
  TIDE_SETTING(local_server_name, .key = "local_server_name",
               .meaning = "This host as peers reach it; the p2p segment name is <this>:<handshake port>. "
                          "Empty: the first non-loopback IPv4 address, else 127.0.0.1 (logged).",
               .mc = "MC_TCP_BIND_ADDRESS", .rule = mc_rule::text,
               .mc_note = "Mooncake publishes it as this node's address instead of its first LAN address; "
                          "tide uses it where local_server_name is not set")
  TIDE_SETTING(metadata, .key = "metadata",
               .meaning = "P2PHANDSHAKE, etcd://h:p[,h:p] (etcds:// for TLS), http://h:p/path, or empty (in-process); "
                          "the policy set's metadata backend must match")
  TIDE_SETTING(cluster_id, .key = "cluster_id", .meaning = "Prefix of this cluster's metadata keys",
               .mc = "MC_METADATA_CLUSTER_ID", .rule = mc_rule::text, .old_env = "TIDE_METADATA_CLUSTER_ID")
  TIDE_SETTING(devices, .key = "devices",
               .meaning = "RDMA devices to open (comma-separated in the environment); empty: every device")
  TIDE_SETTING(transports, .key = "transports",
               .meaning = "rdma,tcp (RDMA where both ends have a NIC, TCP otherwise), rdma, or tcp",
               .mc = "MC_FORCE_TCP", .rule = mc_rule::force_tcp,
               .mc_note = "set to any value (even 0), as in Mooncake: tcp")
  // ---- RDMA ----
  TIDE_SETTING(num_qp_per_ep, .key = "num_qp_per_ep",
               .meaning = "QPs per endpoint = lanes per device; both ends must agree (Mooncake's default is 2)",
               .lo = 1, .hi = 255, .mc = "MC_NUM_QP_PER_EP", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 255)
  TIDE_SETTING(workers_per_context, .key = "workers_per_context",
               .meaning = "Mooncake's workers per device; tide runs num_qp_per_ep lanes whatever it says (logged)",
               .lo = 0, .hi = 64, .mc = "MC_WORKERS_PER_CTX", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 8,
               .old_env = "TIDE_WORKERS_PER_CTX")
  TIDE_SETTING(slice_size, .key = "slice_size", .meaning = "Bytes per RDMA slice (one WR)", .lo = 1,
               .hi = 1LL << 30, .unit = "bytes", .mc = "MC_SLICE_SIZE", .rule = mc_rule::range, .mc_lo = 1,
               .mc_hi = INT_MAX, .mc_note = "above 2^30 ignored with a warning (tide's range)")
  TIDE_SETTING(fragment_limit, .key = "fragment_limit",
               .meaning = "A request's tail shorter than this joins the previous slice", .lo = 0, .hi = 1LL << 30,
               .unit = "bytes")
  TIDE_SETTING(endpoint_capacity, .key = "endpoint_capacity",
               .meaning = "Endpoints (connected peers' NICs) per device before the eviction policy drops one",
               .lo = 1, .hi = 1 << 20, .mc = "MC_MAX_EP_PER_CTX", .rule = mc_rule::range, .mc_lo = 1,
               .mc_hi = 65535, .old_env = "TIDE_MAX_EP_PER_CTX")
  TIDE_SETTING(gid_index, .key = "gid_index",
               .meaning = "GID index of each port; -1: automatic (a RoCE v2 IPv4 GID first; on InfiniBand the first one)",
               .lo = -1, .hi = 255, .mc = "MC_GID_INDEX", .rule = mc_rule::range, .mc_lo = 0, .mc_hi = 255,
               .mc_fallback = "NCCL_IB_GID_INDEX")
  TIDE_SETTING(mtu, .key = "mtu", .meaning = "Path MTU cap; the path MTU is the smaller of both ends' active MTU and this",
               .lo = 256, .hi = 4096, .unit = "bytes", .mc = "MC_MTU", .rule = mc_rule::mtu)
  TIDE_SETTING(ib_port, .key = "ib_port", .meaning = "Port number of each device", .lo = 1, .hi = 255,
               .mc = "MC_IB_PORT", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 255)
  TIDE_SETTING(ib_traffic_class, .key = "ib_traffic_class",
               .meaning = "GRH traffic class of every QP (DSCP << 2 on RoCE: the lossless class under PFC)", .lo = 0,
               .hi = 255, .mc = "MC_IB_TC", .rule = mc_rule::range, .mc_lo = 0, .mc_hi = 255)
  TIDE_SETTING(ib_service_level, .key = "ib_service_level", .meaning = "Service level of every QP's address vector",
               .lo = 0, .hi = 15, .mc = "MC_IB_SL", .rule = mc_rule::range, .mc_lo = 0, .mc_hi = 15)
  TIDE_SETTING(pkey_index, .key = "pkey_index", .meaning = "P_Key table index of every QP", .lo = 0, .hi = 65535,
               .mc = "MC_PKEY_INDEX", .rule = mc_rule::range, .mc_lo = 0, .mc_hi = 65535)
  TIDE_SETTING(max_retry, .key = "max_retry",
               .meaning = "Retries per failed slice (another NIC path, or the same one after a pause); 0: none",
               .lo = 0, .hi = 255, .mc = "MC_RETRY_CNT", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 127,
               .old_env = "TIDE_RETRY_CNT")
  TIDE_SETTING(qp_retry_cnt, .key = "qp_retry_cnt",
               .meaning = "RC transport retries of a QP (7 is infinite on Soft-RoCE, hence 6)", .lo = 0, .hi = 7)
  TIDE_SETTING(qp_timeout, .key = "qp_timeout", .meaning = "ACK timeout exponent: 4.096 us * 2^this", .lo = 0,
               .hi = 31)
  TIDE_SETTING(max_cqe, .key = "max_cqe",
               .meaning = "Completion queue entries per lane (clamped to the device); bounds the WRs a lane has out",
               .lo = 1, .hi = 1 << 22, .mc = "MC_MAX_CQE_PER_CTX", .rule = mc_rule::range, .mc_lo = 1,
               .mc_hi = 65535, .mc_note = "Mooncake's is per device, tide's per lane")
  TIDE_SETTING(max_wr, .key = "max_wr", .meaning = "Send queue depth per QP (clamped to the device)", .lo = 1,
               .hi = 1 << 16, .mc = "MC_MAX_WR", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 65535)
  TIDE_SETTING(max_rd_atomic, .key = "max_rd_atomic",
               .meaning = "Outstanding RDMA READs per QP, each way (clamped to the device)", .lo = 1, .hi = 255)
  TIDE_SETTING(max_inline, .key = "max_inline", .meaning = "WRITEs up to this size go inline (as the QP grants)",
               .lo = 0, .hi = 1 << 16, .unit = "bytes", .mc = "MC_MAX_INLINE", .rule = mc_rule::range, .mc_lo = 0,
               .mc_hi = 65535)
  TIDE_SETTING(signal_interval, .key = "signal_interval",
               .meaning = "Every Nth WR is signaled (and the last of each post); at most max_wr / 2", .lo = 1,
               .hi = 1 << 15)
  TIDE_SETTING(max_wrs_write, .key = "max_wrs_write",
               .meaning = "WRs per WRITE request before its slices grow past slice_size", .lo = 1, .hi = 1 << 16)
  TIDE_SETTING(max_wrs_read, .key = "max_wrs_read",
               .meaning = "WRs per READ request before its slices grow past slice_size", .lo = 1, .hi = 1 << 16)
  TIDE_SETTING(coalesce_requests, .key = "coalesce_requests",
               .meaning = "Requests contiguous at both ends share WRs", .lo = 0, .hi = 1)
  TIDE_SETTING(lane_cpus, .key = "lane_cpus",
               .meaning = "CPUs the lanes run on, as taskset -c writes them (\"0,4-7\"); empty: the NIC's NUMA node")
  TIDE_SETTING(custom_topology_json, .key = "custom_topology_json",
               .meaning = "NIC priority matrix as JSON text, instead of the sysfs scan",
               .old_env = "TIDE_CUSTOM_TOPO_JSON")
  TIDE_SETTING(custom_topology_file, .key = "custom_topology_file",
               .meaning = "The same read from a file; custom_topology_json wins when both are set",
               .mc = "MC_CUSTOM_TOPO_JSON", .rule = mc_rule::text,
               .mc_note = "a file path, as in Mooncake; one that cannot be read or parsed is ignored (the sysfs scan is "
                          "used), as Mooncake does")
  TIDE_SETTING(sysfs_root, .key = "sysfs_root", .meaning = "Where the device scan reads sysfs (tests use fakes)")
  // ---- timeouts ----
  TIDE_SETTING(transfer_timeout, .key = "transfer_timeout_ms",
               .meaning = "A request not done by then ends TIMEOUT (once none of its WRs can touch memory)", .lo = 1,
               .hi = kMaxMs, .unit = "ms")
  TIDE_SETTING(metadata_timeout, .key = "metadata_timeout_ms", .meaning = "One metadata lookup or publish", .lo = 1,
               .hi = kMaxMs, .unit = "ms")
  TIDE_SETTING(handshake_connect_timeout, .key = "handshake_connect_timeout_ms",
               .meaning = "TCP connect to a peer's handshake or data port", .lo = 1, .hi = kMaxMs, .unit = "ms",
               .mc = "MC_HANDSHAKE_CONNECT_TIMEOUT", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 3599,
               .mc_scale = 1000)
  TIDE_SETTING(handshake_timeout, .key = "handshake_timeout_ms", .meaning = "A handshake exchange after connect",
               .lo = 1, .hi = kMaxMs, .unit = "ms")
  TIDE_SETTING(ready_ack_timeout, .key = "ready_ack_timeout_ms",
               .meaning = "How long an accepted connection waits for the peer's ready ack", .lo = 1, .hi = kMaxMs,
               .unit = "ms")
  TIDE_SETTING(rail_cooldown, .key = "rail_cooldown_ms",
               .meaning = "A failing (local NIC, peer NIC) rail pauses this long, doubling per failed probe", .lo = 1,
               .hi = kMaxMs, .unit = "ms")
  TIDE_SETTING(rail_max_cooldown, .key = "rail_max_cooldown_ms", .meaning = "The longest rail pause", .lo = 1,
               .hi = kMaxMs, .unit = "ms")
  TIDE_SETTING(wait_spin, .key = "wait_spin_us",
               .meaning = "wait() polls this long before it sleeps (not after 4 polls in a row that missed; 1 wait in 16 tries again); 0: sleep at once", .lo = 0, .hi = 1000000,
               .unit = "us")
  // ---- handshake, security, notifications ----
  TIDE_SETTING(bind_host, .key = "bind_host",
               .meaning = "Address the handshake and TCP data ports listen on; 0.0.0.0: every interface",
               .old_env = "TIDE_HANDSHAKE_BIND")
  TIDE_SETTING(handshake_port, .key = "handshake_port", .meaning = "Handshake port; 0: a free one in 15000-17000",
               .lo = 0, .hi = 65535, .mc = "MC_HANDSHAKE_PORT", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 65535)
  TIDE_SETTING(auth_secret_file, .key = "auth_secret_file",
               .meaning = "Cluster secret (>= 32 random bytes, mode 0600): authenticated handshakes, sealed "
                          "descriptors; Mooncake peers are then refused")
  TIDE_SETTING(notify_max_count, .key = "notify_max_count", .meaning = "Notifications the inbox holds", .lo = 1,
               .hi = 1LL << 32)
  TIDE_SETTING(notify_max_bytes, .key = "notify_max_bytes", .meaning = "Bytes the inbox holds", .lo = 1,
               .hi = 1LL << 40, .unit = "bytes")
  TIDE_SETTING(notify_rate_per_peer, .key = "notify_rate_per_peer",
               .meaning = "Notifications per sender per second; 0: unbounded", .lo = 0, .hi = 1LL << 31)
  TIDE_SETTING(notify_rdma_credits, .key = "notify_rdma_credits",
               .meaning = "Receives each endpoint posts for notifications over RDMA (tide peers); 0: TCP only",
               .lo = 0, .hi = 64)
  TIDE_SETTING(notify_wait_on_lane, .key = "notify_wait_on_lane",
               .meaning = "take_notifies(wait) runs lane 0 of the first NIC while it waits, so that an RDMA "
                          "notification wakes the reader itself; false: the reader sleeps until the lane wakes it",
               .lo = 0, .hi = 1)
  // ---- engine limits ----
  TIDE_SETTING(max_batches, .key = "max_batches", .meaning = "Batches allocated at once", .lo = 1, .hi = 1LL << 24)
  TIDE_SETTING(max_tasks_per_batch, .key = "max_tasks_per_batch",
               .meaning = "The largest capacity allocate_batch takes", .lo = 1, .hi = 1LL << 30)
  // ---- etcd and http metadata ----
  TIDE_SETTING(etcd_ca_file, .key = "etcd_ca_file", .meaning = "etcd TLS: CA bundle (PEM); setting it turns TLS on")
  TIDE_SETTING(etcd_cert_file, .key = "etcd_cert_file", .meaning = "etcd TLS: client certificate (PEM)")
  TIDE_SETTING(etcd_key_file, .key = "etcd_key_file", .meaning = "etcd TLS: client key (PEM)")
  TIDE_SETTING(etcd_verify_server, .key = "etcd_verify_server",
               .meaning = "Check the etcd server's certificate (false only for tests)", .lo = 0, .hi = 1)
  TIDE_SETTING(etcd_user, .key = "etcd_user", .meaning = "etcd user (auth)")
  TIDE_SETTING(etcd_password_file, .key = "etcd_password_file", .meaning = "File holding the etcd user's password")
  TIDE_SETTING(metadata_token_file, .key = "metadata_token_file",
               .meaning = "http metadata: bearer token file for tide-metadata-server's PUT and DELETE")
  TIDE_SETTING(publish_delay, .key = "publish_delay_ms",
               .meaning = "etcd/http: 0: a registration returns once the store holds it; more: it returns at once "
                          "and the store gets it within this long, one write per window (flush_metadata() at once)",
               .lo = 0, .hi = 3600000, .unit = "ms")
  // ---- metrics ----
  TIDE_SETTING(metrics_port, .key = "metrics_port", .meaning = "Prometheus GET /metrics port; 0: off", .lo = 0,
               .hi = 65535)
  TIDE_SETTING(metrics_bind, .key = "metrics_bind", .meaning = "Address the metrics port listens on")
  // ---- TCP transport ----
  TIDE_SETTING(tcp_port, .key = "tcp_port", .meaning = "TCP data port; 0: a free one in 15000-17000", .lo = 0,
               .hi = 65535)
  TIDE_SETTING(tcp_io_threads, .key = "tcp_io_threads", .meaning = "I/O threads of the TCP transport", .lo = 1,
               .hi = 64)
  TIDE_SETTING(tcp_conns_per_peer, .key = "tcp_conns_per_peer", .meaning = "TCP connections per peer", .lo = 1,
               .hi = 64)
  TIDE_SETTING(tcp_slice_size, .key = "tcp_slice_size", .meaning = "Bytes per TCP piece of a large request",
               .lo = 4096, .hi = 1LL << 30, .unit = "bytes")
  TIDE_SETTING(tcp_proto, .key = "tcp_proto",
               .meaning = "2: status frames and persistent connections with v2 peers; 1: Mooncake's first protocol",
               .lo = 1, .hi = 2, .mc = "MC_TCP_PROTO", .rule = mc_rule::range, .mc_lo = 1, .mc_hi = 2,
               .mc_note = "Mooncake acts on 1 only; 2 is tide's default")
  TIDE_SETTING(stage_host_memory, .key = "stage_host_memory",
               .meaning = "Host memory takes the path of GPU memory no NIC registers: staged through bounce buffers, "
                          "peers reach it over TCP only (tests that path without a GPU)",
               .lo = 0, .hi = 1)
  TIDE_SETTING(rdma_staging, .key = "rdma_staging",
               .meaning = "Memory no NIC registers moves over RDMA through NIC-registered host chunks where the "
                          "peer's buffer is RDMA-reachable; 0: over TCP",
               .lo = 0, .hi = 1)
  TIDE_SETTING(stage_chunk_size, .key = "stage_chunk_size",
               .meaning = "Bytes per staging chunk (no staged work request is longer)", .lo = 4096, .hi = 64LL << 20,
               .unit = "bytes")
  TIDE_SETTING(stage_chunks, .key = "stage_chunks",
               .meaning = "Staging chunks per lane, registered on its first staged request", .lo = 1, .hi = 4096)
#undef TIDE_SETTING
  return {};
}

/// TIDE_ + upper(key).
[[nodiscard]] std::string env_name(std::string_view key);

}  // namespace tide::config_table
