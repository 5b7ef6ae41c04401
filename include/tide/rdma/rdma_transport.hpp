#pragma once
/// rdma::rdma_transport<P> — Mooncake's RdmaTransport: registers memory on
/// every context, resolves peers' segments, splits requests into slices,
/// picks local and peer NICs from the topology, stripes slices over NICs,
/// rolls completions up (slice -> task -> batch) and redispatches a failed
/// slice to another NIC path up to a bound.

#include <tide/detail/log.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/rdma_context.hpp>
#include <tide/rdma/segment.hpp>
#include <tide/topology/hca.hpp>
#include <tide/topology/priority_matrix.hpp>
#include <tide/transfer.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

namespace tide::rdma {

struct transport_config {
  context_config context;            ///< template for every device (device name filled in)
  std::vector<std::string> devices;  ///< NICs to use; empty = every HCA found
  std::size_t slice_size = 65536;
  std::size_t fragment_limit = 16384;  ///< a tail up to this size joins the previous slice
  unsigned max_retry = 4;              ///< other paths tried per slice after a failure
  std::chrono::milliseconds transfer_timeout{30000};
  std::string custom_topology_json;    ///< a priority matrix to use instead of the sysfs scan
  std::size_t max_batches = 4096;      ///< batches alive at once
};

template <class P>
class rdma_transport {
 public:
  static constexpr std::size_t kMaxContexts = 16;
  using context_type = rdma_context<P>;
  using shards = worker_pool<P>;

  /// Re-fetches segment `id`'s descriptor (the forced refresh on a miss).
  using refresh_fn = std::function<status(segment_id)>;
  /// Stores the local segment descriptor where peers find it.
  using publish_fn = std::function<status(const segment_desc&)>;
  /// The GID of device `device` in segment `segment`'s published devices[]
  /// (for a Connection request that sent `local_gid: ""`).  Errors: any;
  /// the detail becomes the reply_msg.
  using peer_gid_fn = std::function<result<gid_bytes>(std::string_view segment, std::string_view device)>;

  /// Scans the HCAs, opens a context per NIC (in the matrix's device order).
  /// Errors: no_device, device_not_found, config_invalid, verbs errors.
  [[nodiscard]] static result<std::unique_ptr<rdma_transport>> create(const transport_config& cfg,
                                                                      handshake_sender send, publish_fn publish,
                                                                      refresh_fn refresh, peer_gid_fn peer_gid = {});

  rdma_transport(const rdma_transport&) = delete;
  rdma_transport& operator=(const rdma_transport&) = delete;
  ~rdma_transport();

  // ---- local memory (setup path; any thread) ----
  /// Registers [addr, addr+len) on every context with location tag
  /// `location` and publishes the descriptor when `publish`.  Errors:
  /// invalid_argument (null), zero_length, bad_location, already_registered,
  /// verbs errors (resource_exhausted, permission_denied).  `access` sets
  /// the MRs' remote flags and the descriptor's "access"; local_only
  /// buffers are left out of the descriptor.
  [[nodiscard]] status register_memory(void* addr, std::size_t len, std::string_view location, bool publish = true,
                                       buffer_access access = buffer_access::remote_read_write);
  /// Errors: not_registered.
  [[nodiscard]] status unregister_memory(void* addr, bool publish = true);
  [[nodiscard]] segment_desc local_segment() const;
  [[nodiscard]] status publish();
  [[nodiscard]] std::size_t registered_buffers() const;

  // ---- remote segments ----
  /// Installs (or replaces) the view of segment `id`.  Errors: metadata_malformed.
  [[nodiscard]] status set_segment(segment_id id, const segment_desc& d);
  void drop_segment(segment_id id);

  // ---- batches ----
  [[nodiscard]] result<batch_id> allocate_batch(std::size_t capacity);
  [[nodiscard]] status free_batch(batch_id id);
  [[nodiscard]] status submit(batch_id id, std::span<const transfer_request> requests);
  [[nodiscard]] result<transfer_status> task_status(batch_id id, std::size_t task);
  [[nodiscard]] result<transfer_status> batch_status(batch_id id);
  [[nodiscard]] status wait(batch_id id, std::chrono::milliseconds timeout);
  [[nodiscard]] status cancel(batch_id id);

  // ---- control ----
  /// The passive handshake: routes a Connection request to the context of
  /// the NIC it targets.  A request without a GID gets it from the requester's
  /// segment (peer_gid_fn), as Mooncake's passive side does; blocks for
  /// that metadata round trip (two when the device is missing: one forced
  /// refresh).  Handshake-service threads.  `peer_identity` is what the
  /// peer authenticated as ("" without a cluster secret); once an endpoint
  /// path has been accepted from one identity, connects for that path from
  /// another are rejected (a re-handshake cannot re-target it).
  [[nodiscard]] handshake_desc on_connect(const handshake_desc& req, std::string_view peer_identity = {});
  [[nodiscard]] std::size_t context_count() const noexcept { return contexts_.size(); }
  [[nodiscard]] context_type& context(std::size_t i) noexcept { return *contexts_[i]; }
  [[nodiscard]] const topology::priority_matrix& local_matrix() const noexcept { return matrix_; }
  [[nodiscard]] const std::string& server_name() const noexcept { return cfg_.context.local_server_name; }

 private:
  explicit rdma_transport(const transport_config& cfg) : cfg_(cfg) {}

  [[nodiscard]] detail::batch_state* lookup(batch_id id) const noexcept;
  void on_failed(detail::slice& s, errc e) noexcept;
  [[nodiscard]] int pick_local(const local_buffer& b, std::uint64_t offset, unsigned retry, std::uint32_t rnd) const noexcept;
  void expire(detail::batch_state& b) noexcept;
  [[nodiscard]] const local_buffer* find_local(std::uint64_t addr, std::uint64_t len) const noexcept;

  transport_config cfg_;
  topology::priority_matrix matrix_;
  std::vector<std::unique_ptr<context_type>> contexts_;
  publish_fn publish_;
  refresh_fn refresh_;
  peer_gid_fn peer_gid_;

  mutable std::shared_mutex local_mu_;
  std::vector<std::unique_ptr<local_buffer>> local_;  ///< sorted by addr

  mutable std::shared_mutex seg_mu_;
  std::vector<std::shared_ptr<const remote_segment>> segments_;  ///< by segment_id

  std::mutex identity_mu_;
  std::unordered_map<std::string, std::string> peer_identity_;  ///< endpoint path -> authenticated peer

  std::mutex batch_mu_;
  std::unique_ptr<std::unique_ptr<detail::batch_state>[]> slots_;
  std::size_t slot_count_ = 0;
  std::vector<std::uint32_t> free_slots_;
};

}  // namespace tide::rdma

#include <tide/rdma/detail/rdma_transport_impl.hpp>
