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

#include <tide/metadata/descriptors.hpp>
#include <tide/metadata/segment_cache.hpp>
#include <tide/policies.hpp>
#include <tide/policy/p2p.hpp>
#include <tide/rdma/rdma_transport.hpp>
#include <tide/result.hpp>
#include <tide/transfer.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace tide {

/// Everything an engine needs, in one place.  Environment variables only
/// override it (apply_env).
struct engine_config {
  /// This host as peers reach it.  In p2p mode the segment name is
  /// "<local_server_name>:<handshake port>" (a port given here is replaced).
  std::string local_server_name = "127.0.0.1";
  /// "P2PHANDSHAKE", "etcd://h:p[,h:p]" (etcds:// for TLS), "http://h:p/path", or "" (in-process).
  std::string metadata = "P2PHANDSHAKE";
  std::string cluster_id;                  ///< optional metadata key prefix
  std::vector<std::string> devices;        ///< NICs to use; empty = every HCA
  std::uint32_t num_qp_per_ep = 2;
  std::size_t slice_size = 65536;
  std::size_t fragment_limit = 16384;
  std::size_t workers_per_context = 2;
  std::size_t endpoint_capacity = 256;     ///< endpoints per context before eviction
  int gid_index = -1;                      ///< -1: automatic
  int mtu = 4096;                          ///< path MTU cap (bytes)
  std::uint8_t ib_port = 1;
  unsigned max_retry = 4;                  ///< other NIC paths tried per failed slice
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
  std::string bind_host = "0.0.0.0";       ///< handshake listener
  std::uint16_t handshake_port = 0;        ///< 0: a free port in 15000-17000
  std::string custom_topology_json;        ///< priority matrix override
  std::string sysfs_root = "/sys";
  std::size_t max_batches = 4096;
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

  /// Applies, in this order, the JSON file named by TIDE_CONFIG (apply_file)
  /// and the TIDE_* (and Mooncake's MC_*) overrides: NUM_QP_PER_EP,
  /// SLICE_SIZE, WORKERS_PER_CTX, MAX_EP_PER_CTX, GID_INDEX, MTU, IB_PORT,
  /// RETRY_CNT, QP_RETRY_CNT, QP_TIMEOUT, TRANSFER_TIMEOUT_MS, CUSTOM_TOPO_JSON,
  /// METADATA_CLUSTER_ID, ETCD_CA_FILE, ETCD_CERT_FILE, ETCD_KEY_FILE,
  /// ETCD_VERIFY_SERVER (0/1), ETCD_USER, ETCD_PASSWORD_FILE, METADATA_TOKEN_FILE.
  /// transfer_engine::create calls it.
  /// Errors: config_invalid naming the variable (or the file and key).
  [[nodiscard]] status apply_env();

  /// Sets the fields named in a JSON object file: keys are the field names
  /// above ("slice_size", "devices", ...; durations as "<name>_ms", e.g.
  /// "transfer_timeout_ms"), with the same ranges as the environment
  /// overrides.  All or nothing.  Errors: config_invalid naming the file and
  /// the key (unknown key, wrong type, out of range), or why it cannot be read.
  [[nodiscard]] status apply_file(const std::string& path);
  /// engine_config{} with apply_file(path).
  [[nodiscard]] static result<engine_config> from_file(const std::string& path);
};

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

/// A buffer for the batch registration calls.
struct buffer_entry {
  void* addr = nullptr;
  std::size_t length = 0;
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
  /// Errors: invalid_argument, zero_length, bad_location, already_registered,
  /// resource_exhausted / permission_denied (pinning), metadata errors.
  [[nodiscard]] status register_memory(void* addr, std::size_t len, std::string_view location = "*");
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
  /// registered or unregistered meanwhile.  Errors: not_registered.
  [[nodiscard]] result<std::uint32_t> buffer_id(const void* addr) const { return transport_->buffer_id(addr); }
  /// All or nothing per buffer; one publish at the end.
  [[nodiscard]] status register_memory_batch(std::span<const buffer_entry> buffers, std::string_view location = "*");
  [[nodiscard]] status unregister_memory_batch(std::span<void* const> addrs);

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
  /// Errors: capacity_zero, resource_exhausted (max_batches reached), out_of_memory.
  [[nodiscard]] result<batch_id> allocate_batch(std::size_t capacity) noexcept {
    return transport_->allocate_batch(capacity);
  }
  /// Errors: unknown_batch, batch_busy (unfinished tasks or slices in flight).
  [[nodiscard]] status free_batch(batch_id b) noexcept { return transport_->free_batch(b); }
  /// Errors: unknown_batch, batch_full, zero_length, unregistered_source,
  /// unknown_segment, out_of_bounds, out_of_memory.  Nothing is submitted on
  /// an error.
  [[nodiscard]] status submit(batch_id b, std::span<const transfer_request> requests) noexcept {
    return transport_->submit(b, requests);
  }
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
  /// Blocks (no spinning) until every task of the batch is final, so after
  /// it returns no DMA of the batch touches the user's memory any more, also
  /// for TIMEOUT and CANCELED tasks.  Errors: timed_out (this wait's own
  /// timeout), unknown_batch.
  [[nodiscard]] status wait(batch_id b, std::chrono::milliseconds timeout) noexcept {
    return transport_->wait(b, timeout);
  }
  /// Marks every unfinished task to end CANCELED: slices not yet posted are
  /// dropped, posted ones drain (complete or flush); each task turns
  /// CANCELED when its last slice is back (wait() returns then).
  [[nodiscard]] status cancel(batch_id b) noexcept { return transport_->cancel(b); }

  // ---- notifications ----
  /// Sends `msg` to the owner of segment `target` over its handshake port.
  [[nodiscard]] status send_notify(segment_id target, std::string_view msg);
  /// The notifications received so far (and forgets them).
  [[nodiscard]] std::vector<notify_desc> take_notifies();

  [[nodiscard]] rdma::rdma_transport<P>& transport() noexcept { return *transport_; }

 private:
  struct impl;
  explicit transfer_engine(engine_config cfg);

  status publish(const segment_desc& d);
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
