#pragma once
/// rdma::rdma_transport<P> — Mooncake's RdmaTransport: registers memory on
/// every context, resolves peers' segments, splits requests into slices,
/// picks local and peer NICs from the topology, stripes slices over NICs,
/// rolls completions up (slice -> task -> batch) and redispatches a failed
/// slice to another NIC path up to a bound.

#include <tide/detail/log.hpp>
#include <tide/rdma/batch_table.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/rdma_context.hpp>
#include <tide/rdma/segment.hpp>
#include <tide/topology/hca.hpp>
#include <tide/topology/priority_matrix.hpp>
#include <tide/transfer.hpp>

#include <algorithm>
#include <atomic>
#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <thread>
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
  static_assert(check_policy_set<P>());

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
  /// verbs errors (resource_exhausted, permission_denied).
  [[nodiscard]] status register_memory(void* addr, std::size_t len, std::string_view location, bool publish = true);
  /// With transfers in flight from the buffer: errc::busy naming how many
  /// slices, unless `mode` is drain (new submits from it fail at once; waits
  /// for the slices, at most transfer_timeout + 10 s) or cancel (cancels
  /// their tasks, then drains).  Errors: not_registered, busy.
  [[nodiscard]] status unregister_memory(void* addr, bool publish = true, in_flight mode = in_flight::reject);
  /// The stable id of the buffer registered at `addr` (what peers address
  /// with transfer_request::in_buffer).  Errors: not_registered.
  [[nodiscard]] result<std::uint32_t> buffer_id(const void* addr) const;
  [[nodiscard]] segment_desc local_segment() const;
  [[nodiscard]] status publish();
  [[nodiscard]] std::size_t registered_buffers() const;

  // ---- remote segments ----
  /// Installs (or replaces) the view of segment `id`.  Errors: metadata_malformed.
  [[nodiscard]] status set_segment(segment_id id, const segment_desc& d);
  void drop_segment(segment_id id);
  /// Slices submitted to segment `id` and not yet retired.
  [[nodiscard]] std::size_t segment_inflight(segment_id id) const noexcept;
  /// Before a close: ok when nothing is in flight to `id`; else busy
  /// (reject), or cancels those tasks (cancel) and waits for them (drain,
  /// cancel; at most transfer_timeout + 10 s).  Submits racing the close
  /// from other threads are the caller's to order.
  [[nodiscard]] status quiesce_segment(segment_id id, in_flight mode) noexcept;

  // ---- batches ----
  // The hot path throws nothing: an allocation that fails is errc::out_of_memory.
  [[nodiscard]] result<batch_id> allocate_batch(std::size_t capacity) noexcept { return batches_->allocate(capacity); }
  [[nodiscard]] status free_batch(batch_id id) noexcept { return batches_->free(id); }
  /// Errors: see transfer_engine::submit; out_of_memory.  Nothing is
  /// submitted on an error.
  [[nodiscard]] status submit(batch_id id, std::span<const transfer_request> requests) noexcept;
  [[nodiscard]] result<transfer_status> task_status(batch_id id, std::size_t task) noexcept {
    return batches_->task_status(id, task);
  }
  [[nodiscard]] result<transfer_status> batch_status(batch_id id) noexcept { return batches_->batch_status(id); }
  [[nodiscard]] status wait(batch_id id, std::chrono::milliseconds timeout) noexcept {
    return batches_->wait(id, timeout);
  }
  [[nodiscard]] status cancel(batch_id id) noexcept { return batches_->cancel(id); }

  // ---- control ----
  /// The passive handshake: routes a Connection request to the context of
  /// the NIC it targets.  A request without a GID gets it from the requester's
  /// segment (peer_gid_fn), as Mooncake's passive side does; blocks for
  /// that metadata round trip (two when the device is missing: one forced
  /// refresh).  Handshake-service threads.
  [[nodiscard]] handshake_desc on_connect(const handshake_desc& req);
  [[nodiscard]] std::size_t context_count() const noexcept { return contexts_.size(); }
  [[nodiscard]] context_type& context(std::size_t i) noexcept { return *contexts_[i]; }
  [[nodiscard]] const topology::priority_matrix& local_matrix() const noexcept { return matrix_; }
  [[nodiscard]] const std::string& server_name() const noexcept { return cfg_.context.local_server_name; }

 private:
  explicit rdma_transport(const transport_config& cfg) : cfg_(cfg) {}

  void on_failed(detail::slice& s, errc e) noexcept;
  [[nodiscard]] status submit_or_throw(batch_id id, std::span<const transfer_request> requests);
  [[nodiscard]] int pick_local(const local_buffer& b, std::uint64_t offset, unsigned retry, std::uint32_t rnd) const noexcept;
  [[nodiscard]] const local_buffer* find_local(std::uint64_t addr, std::uint64_t len) const noexcept;
  // Waits (bounded) until `count` is 0, expiring timed-out tasks meanwhile.
  [[nodiscard]] bool drain(const std::atomic<std::size_t>& count) noexcept;

  transport_config cfg_;
  topology::priority_matrix matrix_;
  std::vector<std::unique_ptr<context_type>> contexts_;
  publish_fn publish_;
  refresh_fn refresh_;
  peer_gid_fn peer_gid_;

  mutable std::shared_mutex local_mu_;
  std::vector<std::unique_ptr<local_buffer>> local_;  ///< sorted by addr
  std::uint32_t next_buffer_id_ = 0;                  ///< under local_mu_

  mutable std::shared_mutex seg_mu_;
  /// A segment id's current view and its in-flight slice count.  Slots are
  /// never freed while the transport lives (tasks point at `inflight`).
  struct segment_slot {
    std::shared_ptr<const remote_segment> view;
    std::atomic<std::size_t> inflight{0};
    /// Set when the peer rejected an rkey (remote_access_error): its buffers
    /// may have changed, so the next submit refreshes the view first.
    std::atomic<bool> stale{false};
  };
  std::vector<std::unique_ptr<segment_slot>> segments_;  ///< by segment_id

  std::unique_ptr<batch_table> batches_;
};

}  // namespace tide::rdma

#include <tide/rdma/detail/rdma_transport_impl.hpp>
