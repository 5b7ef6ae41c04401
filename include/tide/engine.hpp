#pragma once
/// tide::transfer_engine<P> — the API (Mooncake's TransferEngine).
///
///   tide::engine_config cfg;
///   cfg.local_server_name = "10.0.0.1";        // p2p: the segment becomes "10.0.0.1:<port>"
///   auto engine = tide::transfer_engine<>::create(cfg).value();
///   engine->register_memory(buf, len, "cpu:0");
///   auto peer = engine->open_segment("10.0.0.2:15123").value();
///   auto batch = engine->allocate_batch(1).value();
///   auto req = tide::transfer_request::in_buffer(tide::transfer_op::write, buf, peer, 0, 0, len);
///   engine->submit(batch, {&req, 1});
///   engine->wait(batch, std::chrono::seconds(5));
///   engine->free_batch(batch);
///
/// P is a policy set (tide::default_policies or a struct derived from it):
/// eviction, shard_hash, idle, metadata.  The default set is instantiated
/// once in the library (src/engine/engine_default.cpp).
///
/// Threads: every member may be called from any thread; the hot path
/// (submit, task_status, batch_status) takes no lock but a per-batch submit
/// mutex and a shared lock on the buffer tables.

#include <tide/wire/descriptors.hpp>
#include <tide/detail/notify_inbox.hpp>
#include <tide/detail/notify_outbox.hpp>
#include <tide/net/handshake_server.hpp>
#include <tide/metadata/segment_cache.hpp>
#include <tide/policies.hpp>
#include <tide/policy/p2p.hpp>
#include <tide/rdma/rdma_transport.hpp>
#include <tide/result.hpp>
#include <tide/tcp/tcp_transport.hpp>
#include <tide/transfer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tide {

/// Where an effective setting came from (engine_config::resolve).
enum class config_source : std::uint8_t {
  default_value,  ///< the field's default (engine_config{})
  automatic,      ///< chosen at create (local_server_name "": this host's address)
  file,           ///< the JSON file named by TIDE_CONFIG
  environment,    ///< a TIDE_* (or Mooncake MC_*) variable
  program,        ///< set by the program: a field that differs from its default, or a key in set_keys
};
[[nodiscard]] std::string_view to_string(config_source s) noexcept;

/// One setting as an engine will use it.
struct config_value {
  std::string key;       ///< the JSON key ("slice_size", "transfer_timeout_ms")
  std::string value;     ///< as JSON would write it (long text shortened)
  config_source source = config_source::default_value;
  std::string origin;    ///< the file's path, the variable's name, or "" (default, program)
};

/// What engine_config::resolve did: every setting with its source, and what
/// it ignored or found odd (also logged, as warnings, once per process).
struct config_report {
  std::string file;                    ///< TIDE_CONFIG's path; "" = none
  std::vector<config_value> settings;  ///< every setting, in the reference's order
  std::vector<std::string> warnings;
  /// "key = value  (source origin)", one line per setting.
  [[nodiscard]] std::string to_text() const;
};

/// Everything an engine needs, in one place.  Every field is also a key of
/// the TIDE_CONFIG file and a TIDE_<KEY> variable (docs/configuration.md,
/// generated from the table in src/engine/config_table.hpp, lists them with
/// defaults, ranges and the Mooncake MC_* variables that set them).
///
/// Precedence, weakest first: the defaults below; the JSON file named by
/// TIDE_CONFIG; the environment (TIDE_<KEY>, else Mooncake's MC_* name);
/// what the program set.  A field counts as set by the program when its
/// value differs from its default, or when its key is in set_keys
/// (apply_json and apply_file add the keys they set; the Python module's
/// keyword arguments and tide-bench's flags arrive that way).
/// transfer_engine::create applies this rule (resolve) to the config it is
/// given.
struct engine_config {
  /// This host as peers reach it.  In p2p mode the segment name is
  /// "<local_server_name>:<handshake port>" (a port given here is replaced).
  /// "" (the default): this host's first non-loopback IPv4 address
  /// (Mooncake's MC_TCP_BIND_ADDRESS when set), else 127.0.0.1; the engine
  /// logs the choice.
  std::string local_server_name;
  /// "P2PHANDSHAKE", "etcd://h:p[,h:p]" (etcds:// for TLS), "http://h:p/path", or "" (in-process).
  std::string metadata = "P2PHANDSHAKE";
  std::string cluster_id;                  ///< optional metadata key prefix
  std::vector<std::string> devices;        ///< NICs to use; empty = every HCA
  /// QPs per endpoint = lanes (worker threads, each with its own CQ) per
  /// context: lane i owns QP i of every endpoint.  Mooncake's
  /// MC_NUM_QP_PER_EP; both ends must use the same value (the handshake
  /// rejects a mismatch), so keep 2 to talk to a default Mooncake peer.
  std::uint32_t num_qp_per_ep = 2;
  std::size_t slice_size = 65536;
  std::size_t fragment_limit = 16384;
  /// Mooncake's worker threads per context.  tide runs num_qp_per_ep lanes
  /// per context (a lane owns one QP of each endpoint) whatever this says;
  /// another value is accepted and logged.
  std::size_t workers_per_context = 0;
  /// The CPUs the lanes run on, as taskset -c writes them ("2", "0,4-7"):
  /// keeps the lanes off the threads that compute (or, with the caller
  /// pinned elsewhere, apart from the thread that waits on them).  Empty
  /// (the default): each lane runs on its NIC's NUMA node.  A CPU this
  /// machine lacks is config_invalid.
  std::string lane_cpus;
  std::size_t endpoint_capacity = 256;     ///< endpoints per context before eviction
  int gid_index = -1;                      ///< -1: automatic
  int mtu = 4096;                          ///< path MTU cap (bytes)
  std::uint8_t ib_port = 1;
  /// The GRH traffic class, service level and P_Key index of every RC QP
  /// (Mooncake's MC_IB_TC, MC_IB_SL, MC_PKEY_INDEX): on a RoCE fabric with
  /// PFC the traffic class puts RDMA on the lossless priority.
  std::uint8_t ib_traffic_class = 0;
  std::uint8_t ib_service_level = 0;
  std::uint16_t pkey_index = 0;
  /// Retries per failed slice (another NIC path, or the same one).  A
  /// transient failure (no ACK, a rejected request, a flush) is retried
  /// past it until transfer_timeout: on another healthy path, else on the
  /// same one with backoff (at once, then 4 ms doubling to 200 ms).  0 turns
  /// retries off.
  unsigned max_retry = 4;
  /// RC transport retries (QP retry_cnt) and ACK timeout exponent (4.096 us
  /// * 2^timeout).  Mooncake uses 7 and 14; tide's default retry_cnt is 6
  /// because Soft-RoCE (rdma_rxe) treats 7 as "retry forever", so a dead
  /// peer never fails its WRs there.  On real NICs 6 and 7 differ by one
  /// retry.  0..7 and 0..31.
  std::uint8_t qp_retry_cnt = 6;
  std::uint8_t qp_timeout = 14;
  std::chrono::milliseconds transfer_timeout{30000};
  std::chrono::milliseconds metadata_timeout{3000};
  std::chrono::milliseconds handshake_connect_timeout{5000};
  std::chrono::milliseconds handshake_timeout{30000};
  /// How long an accepted connection waits for the peer's ready ack; past
  /// it the connection is used anyway, and may be evicted.
  std::chrono::milliseconds ready_ack_timeout{10000};
  /// The handshake listener's bind address (and the TCP data port's).
  /// "0.0.0.0" (Mooncake's INADDR_ANY) lets every host that routes here
  /// reach it; bind the RDMA network's interface address to keep it off
  /// other networks.  Without auth_secret_file, anyone who reaches it can
  /// read this engine's buffer addresses and rkeys and connect QPs.
  std::string bind_host = "0.0.0.0";
  std::uint16_t handshake_port = 0;        ///< 0: a free port in 15000-17000
  /// The cluster secret: a file of at least 32 random bytes, not readable
  /// by group or others.  "" = none: Mooncake's unauthenticated wire.  Set:
  /// every handshake exchange (connect, metadata, notify) is authenticated
  /// both ways (HMAC-SHA256 over both sides' fresh nonces, wire/auth.hpp), a
  /// peer may connect or re-handshake only NIC paths whose server part is
  /// its authenticated segment name (wire::check_peer_identity), and
  /// published descriptors seal buffer addresses and rkeys (AES-256-GCM,
  /// wire/seal.hpp).  Peers without it (Mooncake
  /// included) then get nothing and see errors; every tide peer of the
  /// cluster needs the same file.
  std::string auth_secret_file;
  /// Notification inbox bounds (detail/notify_inbox.hpp); over them a
  /// message is refused (its sender told so) and counted in notification_stats().
  std::size_t notify_max_count = 4096;
  std::size_t notify_max_bytes = std::size_t{4} << 20;
  std::uint32_t notify_rate_per_peer = 1000;  ///< per sender per second; 0 = unbounded
  /// Receive buffers each endpoint posts for transfer-bound notifications
  /// sent over RDMA (a SEND on the endpoint's QP 0 after the data, with
  /// credits), advertised in the handshake; 0..64, 0 = off.  Only between
  /// tide peers that both advertise it; Mooncake peers, and tide peers with
  /// 0 (or an idle strategy that does not wake on completions), get
  /// Mooncake's TCP notify message.  Each receive is a 4 KiB + header
  /// buffer per endpoint (R + 2 of them).
  std::uint32_t notify_rdma_credits = 8;
  /// take_notifies(wait) with nothing queued runs lane 0 of the first NIC
  /// on the calling thread while it waits (the lane thread waits instead),
  /// so that a notification's SEND wakes the reader and not the lane that
  /// would then wake it: one wake-up instead of two.  Meanwhile lane 0's
  /// work runs on the reader's CPU, not on lane_cpus.  false: the reader
  /// sleeps on the inbox, as it always does with notify_rdma_credits 0 or
  /// an idle strategy that does not sleep on completions (busy_poll, hybrid).
  bool notify_wait_on_lane = true;
  /// The NIC priority matrix as JSON text, instead of the sysfs scan.
  std::string custom_topology_json;
  /// The same read from a file (Mooncake's MC_CUSTOM_TOPO_JSON names a
  /// file); custom_topology_json wins when both are set.
  std::string custom_topology_file;
  std::string sysfs_root = "/sys";
  std::size_t max_batches = 4096;
  /// The largest capacity allocate_batch takes (batch_too_large above it).
  /// A batch's memory (~128 B per task) stays with the engine for its life.
  std::size_t max_tasks_per_batch = std::size_t{1} << 16;
  /// etcd over TLS and etcd auth: see metadata_config (backend.hpp).
  /// "etcds://h:p[,h:p]" or any of the three files turns TLS on.
  std::string etcd_ca_file;
  std::string etcd_cert_file;
  std::string etcd_key_file;
  bool etcd_verify_server = true;          ///< false only to skip the certificate check
  std::string etcd_user;
  std::string etcd_password_file;
  /// http metadata: bearer token file for tide-metadata-server's PUT/DELETE.
  std::string metadata_token_file;
  /// etcd/http metadata: 0 = a registration returns once the store holds
  /// the descriptor with its buffer (Mooncake's promise; one store write of
  /// the whole descriptor per call).  > 0 = it returns once the buffer is
  /// registered here, and the store gets every change within this long: one
  /// write per window, however many buffers (flush_metadata() makes it
  /// current at once).  Unregistrations are stored before they return
  /// either way.  No effect with p2p, which is always current.
  std::chrono::milliseconds publish_delay{0};
  /// Completion-queue entries per lane (clamped to the device's max_cqe).  A
  /// lane never has more WRs outstanding than this, across all its QPs.
  int max_cqe = 4096;
  /// Send queue depth per QP (max_send_wr; clamped to the device's max_qp_wr).
  std::uint32_t max_wr = 256;
  /// Outstanding RDMA READs per QP, each way (clamped to the device).
  std::uint8_t max_rd_atomic = 16;
  /// WRITEs up to this many bytes go inline (the QP's granted size rules).
  std::uint32_t max_inline = 64;
  /// Every Nth WR is signaled (and the last of each post); at most max_wr / 2.
  std::uint32_t signal_interval = 16;
  /// Slice planning (see <tide/rdma/plan/slice_planner.hpp>): WRs per request
  /// before slices grow past slice_size (TENT's 32 / 64), and whether
  /// requests contiguous at both ends share WRs.
  std::uint32_t max_wrs_write = 32;
  std::uint32_t max_wrs_read = 64;
  bool coalesce_requests = true;
  /// A failing (local NIC, peer NIC) rail pauses this long, doubling on each
  /// failed probe up to rail_max_cooldown.
  std::chrono::milliseconds rail_cooldown{100};
  std::chrono::milliseconds rail_max_cooldown{10000};
  /// wait() polls the batch this long before it sleeps on the batch's
  /// condition variable (0 = sleep at once).  A small transfer ends within
  /// a few wire round trips, and waking a sleeping thread costs about as
  /// much again; a long one pays this much CPU once.  Adaptive: after a
  /// few waits in a row whose batch outlived the spin (large transfers over
  /// TCP), waits sleep at once, and one in 16 spins again to see.
  std::chrono::microseconds wait_spin{200};
  /// The Prometheus endpoint (GET /metrics, <tide/metrics.hpp>): 0 = off
  /// (the default); else the port it listens on, on metrics_bind.
  /// Loopback by default: the counters name peers and NICs.
  std::uint16_t metrics_port = 0;
  std::string metrics_bind = "127.0.0.1";

  /// The transports this engine installs: "rdma,tcp" (the default), "rdma"
  /// or "tcp".  With both, a request goes over RDMA where both sides have a
  /// NIC, and over TCP to a peer that serves only TCP, when this host has no
  /// RDMA device (the engine then runs on TCP alone and logs so once), and
  /// when every RDMA rail to the peer is paused; a slice whose rails fail is
  /// retried over TCP within its deadline.  Mooncake's MC_FORCE_TCP (set to
  /// anything) means "tcp".
  std::string transports = "rdma,tcp";
  /// The TCP data port: 0 = a free port in 15000-17000, published as the
  /// descriptor's tcp_data_port.  It binds bind_host, as the handshake port does.
  std::uint16_t tcp_port = 0;
  /// I/O threads of the TCP transport (both directions) and connections per
  /// peer; a large request is cut into tcp_slice_size pieces spread over them.
  /// Each piece costs a header, a status and a wakeup or two on both sides:
  /// 1 MiB (iperf3's largest write) keeps that under the copy's cost, where
  /// 256 KiB held 1 MiB requests on loopback to 0.8x iperf3 (docs/performance.md).
  unsigned tcp_io_threads = 2;
  unsigned tcp_conns_per_peer = 4;
  std::size_t tcp_slice_size = std::size_t{1} << 20;
  /// 2: status frames and persistent connections with peers that publish
  /// version 2; 1: Mooncake's first protocol with every peer (MC_TCP_PROTO=1).
  unsigned tcp_proto = 2;
  /// The staging switch: host memory takes the path of GPU memory that no
  /// NIC registers: registered on no NIC, published with "reach": "tcp",
  /// and staged through a copy engine (a memcpy; CUDA copies for GPU
  /// memory), so that path runs, and is tested, on hosts without a GPU.
  bool stage_host_memory = false;
  /// Memory no NIC registers (GPU memory without dma-buf or nvidia_peermem;
  /// host memory with stage_host_memory): this engine's requests from it
  /// still go over RDMA, through pinned host chunks the NIC registered
  /// (stage_chunk_size bytes each, stage_chunks per lane), where the peer's
  /// buffer is reachable by RDMA.  false: over TCP.  Peers reach such
  /// memory over TCP only either way.
  bool rdma_staging = true;
  std::size_t stage_chunk_size = std::size_t{256} << 10;
  unsigned stage_chunks = 32;

  /// Keys the program set on purpose, kept over TIDE_CONFIG and the
  /// environment even where the value equals the default.  apply_json and
  /// apply_file add the keys they set; add a key here after setting a field
  /// to its default value to keep it so.
  std::set<std::string, std::less<>> set_keys;

  /// The configuration an engine runs with: the defaults, then the
  /// TIDE_CONFIG file, then the environment, then what this config set
  /// (see above); local_server_name "" becomes this host's address and
  /// custom_topology_file is read into custom_topology_json.  A bad TIDE_*
  /// value or a bad file is an error; a Mooncake MC_* value Mooncake would
  /// not take is ignored with a warning, as Mooncake does; an unknown
  /// TIDE_* variable is warned about.  `report`, when given, receives every
  /// setting with its source.  transfer_engine::create calls it.
  /// Errors: config_invalid naming the variable (or the file and key).
  [[nodiscard]] result<engine_config> resolve(config_report* report = nullptr) const;

  /// Applies the JSON file named by TIDE_CONFIG, then the environment, onto
  /// this config, over whatever it holds (resolve, which create uses, puts
  /// the program's values last).  Same errors as resolve.
  [[nodiscard]] status apply_env();

  /// Sets the fields named in a JSON object file: keys are the field names
  /// above ("slice_size", "devices", ...; durations as "<name>_ms", e.g.
  /// "transfer_timeout_ms"), with the same ranges as the environment, and
  /// adds them to set_keys.  All or nothing.  Errors: config_invalid naming
  /// the file and the key (unknown key, wrong type, out of range), or why it
  /// cannot be read.
  [[nodiscard]] status apply_file(const std::string& path);
  /// apply_file's work on the text of a JSON object; errors name `origin`
  /// where apply_file names the file (the Python module passes its keyword
  /// arguments this way, so they count as set by the program).
  [[nodiscard]] status apply_json(std::string_view json_object, const std::string& origin);
  /// engine_config{} with apply_file(path).
  [[nodiscard]] static result<engine_config> from_file(const std::string& path);
};

/// docs/configuration.md: every setting (key, type, default, variable,
/// Mooncake name, range, meaning), the precedence rule and the Mooncake
/// variables, rendered from the same table the parsers use
/// (tide-config --markdown writes it; a unit test compares it with the file).
[[nodiscard]] std::string config_reference_markdown();

/// engine_config::transports, parsed.
struct transport_set {
  bool rdma = true;
  bool tcp = true;
};
/// "rdma", "tcp", "rdma,tcp" (in any order, spaces allowed).  Errors:
/// config_invalid naming the word that is not a transport.
[[nodiscard]] result<transport_set> parse_transports(std::string_view text);

namespace detail {
/// P::metadata, or policy::p2p for a policy set that names none.
template <class P>
struct metadata_of {
  using type = policy::p2p;
};
template <class P>
  requires requires { typename P::metadata; }
struct metadata_of<P> {
  using type = typename P::metadata;
};
}  // namespace detail

/// What engine->stats() returns (see <tide/rdma/plan/nic_load.hpp>).
using engine_stats = rdma::plan::transport_stats;

/// A buffer for the batch registration calls.
struct buffer_entry {
  void* addr = nullptr;
  std::size_t length = 0;
  /// As register_memory's `access`.
  buffer_access access = buffer_access::remote_read_write;
};

/// A message for the target of a submit's requests that arrives only after
/// their data (transfer_engine::submit with a notification).  The target
/// reads it with take_notifies() as a notify_desc{name, message}.
struct notification {
  /// The sender as the target sees it; "" = this engine's segment name.
  /// With a cluster secret the target records the authenticated identity
  /// instead, whatever this says.
  std::string name;
  std::string message;
  /// name + message at most this many bytes (invalid_argument above): it
  /// has to fit the receive buffers of the RDMA path.
  static constexpr std::size_t kMaxBytes = 4096;
};

template <class P = default_policies>
class transfer_engine {
  // First, so a bad policy set fails here with the message naming the member
  // to change, not deep inside the data path.
  static_assert(check_policy_set<P>());

 public:
  using metadata_backend_type = typename detail::metadata_of<P>::type;

  /// init(): starts the handshake service, opens every NIC, publishes the
  /// (empty) segment and, with an etcd/http backend, Mooncake's rpc_meta
  /// entry {"ip_or_host_name","rpc_port"} under rpc_meta_key(cluster_id, name).  Errors: config_invalid, no_device, device_not_found,
  /// verbs errors, metadata_unavailable.
  [[nodiscard]] static result<std::unique_ptr<transfer_engine>> create(engine_config cfg);

  transfer_engine(const transfer_engine&) = delete;
  transfer_engine& operator=(const transfer_engine&) = delete;
  /// Stops the workers and the handshake service; withdraws the segment
  /// and the rpc_meta entry.
  ~transfer_engine();

  /// This engine's segment name (what peers open).
  [[nodiscard]] const std::string& segment_name() const noexcept { return name_; }
  [[nodiscard]] std::uint16_t handshake_port() const noexcept;

  // ---- memory ----
  /// Registers [addr, addr+len) on every NIC with a location tag ("cpu:N",
  /// "*", "segments:<page>:<n0>,..."), and publishes the descriptor.
  /// When it returns, a peer that fetches the segment afterwards sees the
  /// buffer: with p2p metadata this engine serves the current descriptor
  /// (encoded when a peer asks); with etcd/http the call returns once the
  /// store holds a descriptor with the buffer.  Registrations (and
  /// unregistrations) from several threads at once share one store write
  /// (group commit: one encode and one PUT for all of them); one caller
  /// registering buffers one at a time still writes the descriptor, all
  /// its buffers, once per call: use register_memory_batch for many, or
  /// set publish_delay (then the store gets the buffer within that delay,
  /// and flush_metadata() waits for it).
  /// Errors: invalid_argument, zero_length, bad_location, already_registered,
  /// resource_exhausted / permission_denied (pinning), metadata errors.
  /// A store write that fails fails every registration that waited for it
  /// (metadata_unavailable ...: the detail says the store's error); those
  /// buffers stay registered here and go into the next write that succeeds.
  /// A caller waits for at most two store writes, however many wait with it.
  /// `access` says what peers may do: remote_read_write (Mooncake's, the
  /// default), remote_read, remote_write (the MR grants only that, and the
  /// descriptor says so: a peer's tide refuses other ops at submit, the NIC
  /// refuses them if forced), local_only (no remote access, not published).
  [[nodiscard]] status register_memory(void* addr, std::size_t len, std::string_view location = "*",
                                       buffer_access access = buffer_access::remote_read_write);
  /// With transfers in flight from the buffer: errc::busy naming how many
  /// slices, unless `mode` says to wait for them (in_flight::drain; new
  /// submits from the buffer fail at once) or to cancel them first
  /// (in_flight::cancel).  A drain is bounded by transfer_timeout + 10 s.
  /// Errors: not_registered, busy.
  [[nodiscard]] status unregister_memory(void* addr, in_flight mode = in_flight::reject);
  /// The stable id of the buffer registered at `addr`: peers address it
  /// with transfer_request::in_buffer(op, src, segment, id, offset, len).
  /// Ids count up from 0 per engine in registration order and are never
  /// reused, so an id keeps naming the same buffer (or none) whatever is
  /// registered or unregistered meanwhile.  Per engine: one restarted under
  /// the same segment name counts from 0 again, and peers that see its new
  /// descriptor fail requests by id (unknown_segment) until they close and
  /// open the segment again.  Errors: not_registered.
  [[nodiscard]] result<std::uint32_t> buffer_id(const void* addr) const { return transport_->buffer_id(addr); }
  /// All or nothing per buffer; one publish at the end.
  [[nodiscard]] status register_memory_batch(std::span<const buffer_entry> buffers, std::string_view location = "*");
  [[nodiscard]] status unregister_memory_batch(std::span<void* const> addrs);
  /// etcd/http with publish_delay: stores every change made before the call
  /// now, without waiting for the delay, and returns the store's status
  /// (metadata errors).  Otherwise the store is already current: returns
  /// at once.  Any thread.
  [[nodiscard]] status flush_metadata();

  // ---- segments ----
  /// Looks the segment up (metadata) and returns its handle.  Errors:
  /// segment_not_found, metadata_unavailable, metadata_malformed.
  [[nodiscard]] result<segment_id> open_segment(std::string_view name);
  /// With transfers to the segment in flight: errc::busy naming how many
  /// slices, unless `mode` is in_flight::drain (wait for them) or
  /// in_flight::cancel (cancel their tasks, then wait).  Errors:
  /// unknown_segment, busy.
  [[nodiscard]] status close_segment(segment_id id, in_flight mode = in_flight::reject);
  /// The descriptor of an open segment (to read buffer addresses).
  [[nodiscard]] result<std::shared_ptr<const segment_desc>> segment_descriptor(segment_id id) const;

  // ---- batches (hot path) ----
  // None of these throws; a failed allocation is errc::out_of_memory.
  /// Errors: capacity_zero, batch_too_large (above max_tasks_per_batch),
  /// resource_exhausted (max_batches reached), out_of_memory.
  [[nodiscard]] result<batch_id> allocate_batch(std::size_t capacity) noexcept {
    return transport_->allocate_batch(capacity);
  }
  /// Errors: unknown_batch, batch_busy (unfinished tasks or slices in flight).
  [[nodiscard]] status free_batch(batch_id b) noexcept { return transport_->free_batch(b); }
  /// Errors: unknown_batch, canceled (cancel() was called on the batch),
  /// batch_full, zero_length, unregistered_source, unknown_segment,
  /// out_of_bounds, out_of_memory.  Nothing is submitted on an error.
  [[nodiscard]] status submit(batch_id b, std::span<const transfer_request> requests) noexcept {
    return transport_->submit(b, requests);
  }
  /// submit() plus a notification bound to these requests: the target's
  /// take_notifies() yields `n` only once every byte of them is in its
  /// memory, and never if any of them fails.  It is sent once the last of
  /// this submit's tasks is final, if all of them COMPLETED; otherwise it is
  /// dropped (outbox_stats().dropped_failed) and the tasks' status says why.
  /// One message per submit, not per request.  Each submit to a batch may
  /// carry its own notification, covering that submit's requests only.
  /// Between tide peers that both advertise it (notify_rdma_credits) it is
  /// one SEND on QP 0 of an endpoint to the target, within the receive
  /// credits the target posted (outbox_stats().sent_rdma; a refusal by the
  /// target's inbox is then counted at the target only).  A submit that is
  /// one RDMA WRITE work request sends it right behind that WRITE on the
  /// same QP (outbox_stats().sent_with_data), so the target may read it
  /// before this side sees COMPLETED, never before the bytes; a WRITE that
  /// fails takes it down, but if such a submit is canceled or times out
  /// after its WRITE went out and the bytes land anyway, it arrives too.
  /// Otherwise, and when no credit comes within 50 ms or the endpoint is not
  /// connected, it is Mooncake's notify message to the target's handshake port after the
  /// data (so Mooncake peers take it too; sent_tcp); a refusal by the
  /// target's inbox bound is counted in outbox_stats().refused.
  /// Errors: invalid_argument (no requests; requests to more than one
  /// segment: one notification follows one target, so submit per segment;
  /// name + message over notification::kMaxBytes), unknown_segment, and
  /// submit()'s.  Nothing is submitted or sent on an error.
  [[nodiscard]] status submit(batch_id b, std::span<const transfer_request> requests,
                              const notification& n) noexcept;
  /// Final means final: a task is reported COMPLETED, FAILED, TIMEOUT or
  /// CANCELED only once none of its work requests can still touch local or
  /// remote memory (every slice completed, failed for good, was flushed or
  /// was dropped before posting).  Until then it is PENDING, also after its
  /// transfer_timeout passed or cancel() was called.  `reason` is the first
  /// error that hit the task (see transfer_status).
  [[nodiscard]] result<transfer_status> status_of(batch_id b, std::size_t task) noexcept {
    return transport_->task_status(b, task);
  }
  [[nodiscard]] result<transfer_status> batch_status(batch_id b) noexcept { return transport_->batch_status(b); }
  /// Per-request telemetry (<tide/telemetry.hpp>): submit, first post and
  /// completion times, bytes, WRs, retries, the rails used, the reason.
  /// Any thread, lock-free; complete once status_of reports the task final
  /// (until then completion is zero and the counts partial).  Valid until
  /// the batch is freed.  Errors: unknown_batch, unknown_task.
  [[nodiscard]] result<transfer_telemetry> task_telemetry(batch_id b, std::size_t task) noexcept {
    return transport_->task_telemetry(b, task);
  }
  /// The same summed over the batch's tasks (earliest submit and first
  /// post, latest completion once all are final).  Errors: unknown_batch.
  [[nodiscard]] result<transfer_telemetry> batch_telemetry(batch_id b) noexcept {
    return transport_->batch_telemetry(b);
  }
  /// Blocks until every task of the batch is final, so after it returns no
  /// DMA of the batch touches the user's memory any more, also for TIMEOUT
  /// and CANCELED tasks.  Polls for engine_config::wait_spin first, then
  /// sleeps until the last completion wakes it.  Errors: timed_out (this wait's own
  /// timeout), unknown_batch.
  [[nodiscard]] status wait(batch_id b, std::chrono::milliseconds timeout) noexcept {
    return transport_->wait(b, timeout);
  }
  /// Marks every unfinished task to end CANCELED: slices not yet posted are
  /// dropped, posted ones drain (complete or flush); each task turns
  /// CANCELED when its last slice is back (wait() returns then).
  [[nodiscard]] status cancel(batch_id b) noexcept { return transport_->cancel(b); }
  /// Tells `listener` (once) when the batch's last unfinished task turns
  /// final, or at once when none is unfinished; nullptr stops watching.
  /// One listener per batch; free_batch drops it.  The listener must outlive
  /// the watch: after watch_batch(b, nullptr) or free_batch(b) returns it is
  /// not called for b again.  Errors: unknown_batch.
  [[nodiscard]] status watch_batch(batch_id b, batch_listener* listener) noexcept {
    return transport_->watch_batch(b, listener);
  }

  // ---- notifications ----
  /// Sends `msg` to the owner of segment `target` over its handshake port,
  /// named as from `sender` ("" = this engine's segment name; Mooncake's
  /// TransferNotify lets the caller name it).
  [[nodiscard]] status send_notify(segment_id target, std::string_view msg, std::string_view sender = {});
  /// Is the owner of `segment` (a segment name, open or not) alive?  One
  /// probe message to its handshake port (Mooncake's type 3, which Mooncake
  /// peers answer too; authenticated with the cluster secret); no segment is
  /// opened and no QP is created.  Errors within `timeout`: peer_unreachable
  /// (nothing listens, or no answer in time), auth_failed (the peer does not
  /// share our secret), handshake_failed / protocol_error (it answered
  /// something else), invalid_argument (the name is no "host[:port]"; no
  /// port means Mooncake's default, 12001).
  [[nodiscard]] status probe(std::string_view segment, std::chrono::milliseconds timeout);
  /// The notifications received so far (and forgets them).  With `wait`
  /// and none queued, sleeps until one arrives or `wait` passes (an event
  /// loop's blocking read; polling with 0 costs a thread a core).  Any
  /// thread; not while the engine is being destroyed.
  [[nodiscard]] std::vector<notify_desc> take_notifies(std::chrono::milliseconds wait = std::chrono::milliseconds{0});
  /// The inbox's counters (what was refused, by which bound).
  [[nodiscard]] notify_stats notification_stats() const;
  /// The counters of notifications sent with submits (sent, dropped because
  /// a task failed, refused by the target, pending).  Any thread.
  [[nodiscard]] notify_outbox_stats outbox_stats() const noexcept;
  /// The handshake server's counters (auth_failed: refused strangers).
  [[nodiscard]] net::handshake_server_stats handshake_stats() const noexcept;
  /// How many times this engine has encoded its descriptor.  With p2p
  /// metadata that is once per peer request that followed a change, not once
  /// per registration; with etcd/http once per publish.  Any thread.
  [[nodiscard]] std::uint64_t descriptor_encodes() const noexcept;
  /// etcd/http: registrations and unregistrations waiting to join the next
  /// store write while one is in flight (they share it).  0 with p2p.  Any thread.
  [[nodiscard]] std::size_t registrations_waiting() const;
  /// The TCP transport's data port (0: TCP is not installed) and counters
  /// (requests and bytes both ways, connections, the server's refusals).
  [[nodiscard]] std::uint16_t tcp_port() const noexcept;
  [[nodiscard]] tcp::stats tcp_stats() const noexcept;

  [[nodiscard]] rdma::rdma_transport<P>& transport() noexcept { return *transport_; }

  /// Per NIC: bytes, WRs, errors, bytes in flight, bandwidth estimate; and
  /// every rail that has failed, with its state (healthy, paused, probing).
  /// Any thread; not for the hot path (copies names).
  [[nodiscard]] engine_stats stats() const { return transport_->stats(); }

  /// The Prometheus text exposition (format 0.0.4) of this engine's
  /// counters: per NIC and per rail, task outcomes and errors, latency
  /// histograms, handshakes, the notification inbox (<tide/metrics.hpp>
  /// lists the families).  Any thread; not for the hot path (a few
  /// allocations, the rail table's registration mutex).
  [[nodiscard]] std::string metrics_text() const;
  /// The port the metrics endpoint listens on; 0 when it is off.
  [[nodiscard]] std::uint16_t metrics_port() const noexcept;

 private:
  struct impl;
  explicit transfer_engine(engine_config cfg);

  status publish(const segment_desc& d);
  // After a (un)registration: p2p marks the descriptor stale; etcd/http
  // store it, sharing one write with concurrent callers.  `what` and
  // `after_failure` frame a store error for the caller.
  status store_changes(std::string_view what, std::string_view after_failure);
  // store_changes, or with publish_delay hand the write to the deferred publisher.
  status store_registrations(std::string_view what, std::string_view after_failure);
  void encode_if_stale();  // p2p: the descriptor a peer asks for, encoded if a publish came since
  status submit_notified(batch_id b, std::span<const transfer_request> requests, const notification& n);
  // The GID a Connection request without one refers to (open, one forced
  // refresh on a miss, close).
  result<gid_bytes> peer_gid(std::string_view segment, std::string_view device);

  engine_config cfg_;
  std::string name_;
  std::unique_ptr<impl> impl_;  // handshake server, notifications
  std::unique_ptr<segment_cache<metadata_backend_type>> cache_;
  std::unique_ptr<rdma::rdma_transport<P>> transport_;
};

extern template class rdma::rdma_transport<default_policies>;
extern template class transfer_engine<default_policies>;

}  // namespace tide

#include <tide/detail/engine_impl.hpp>
