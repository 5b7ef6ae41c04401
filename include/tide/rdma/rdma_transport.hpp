#pragma once
/// rdma::rdma_transport<P> — Mooncake's RdmaTransport: registers memory on
/// every context, resolves peers' segments, and runs the data path:
///
///   submit (resolve, detail/rdma_transport_impl.hpp)
///     -> plan  (plan/slice_planner.hpp: WRs per request, coalescing)
///     -> path  (plan/path_selector.hpp + P::path + plan/rail_health.hpp: a rail per WR)
///     -> lane  (rdma_context::dispatch -> lane_pool / lane: credits, post, poll)
///     -> NIC -> completion (detail/retire_wr.hpp: slice -> task -> batch)
///   failure -> on_failed (detail/transport_dispatch.hpp): the rail pauses,
///              the slice goes to the next healthy rail, up to max_retry;
///              a transient failure with no other rail waits in the retry
///              timer (detail/retry_timer.hpp) and goes to the same rail
///              again, past max_retry, until its task's deadline.
///
/// Files: this one is the facade (config, members); rdma_transport_impl.hpp
/// setup, segments and request resolution; transport_memory.hpp local
/// memory; transport_dispatch.hpp planning, rail choice, dispatch, retry and
/// stats; transport_connect.hpp the passive handshake.

#include <tide/detail/log.hpp>
#include <tide/rdma/batch_table.hpp>
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/carrier.hpp>
#include <tide/rdma/detail/retire_wr.hpp>
#include <tide/rdma/detail/retry_timer.hpp>
#include <tide/rdma/detail/task_telemetry.hpp>
#include <tide/rdma/plan/nic_load.hpp>
#include <tide/rdma/plan/path_selector.hpp>
#include <tide/rdma/plan/rail_health.hpp>
#include <tide/rdma/plan/slice_planner.hpp>
#include <tide/rdma/rdma_context.hpp>
#include <tide/rdma/segment.hpp>
#include <tide/topology/hca.hpp>
#include <tide/topology/priority_matrix.hpp>
#include <tide/transfer.hpp>
#include <tide/wire/address.hpp>

#include <algorithm>
#include <atomic>
#include <array>
#include <map>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
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
  /// Retries per slice after a failure, on another rail or the same one.
  /// A transient failure (plan::fresh_endpoint_may_help) is retried past
  /// it while the retry starts before the task's deadline: on another rail
  /// when one is healthy, else on the same one after a backoff
  /// (detail/retry_timer.hpp).  0 turns every retry off.
  unsigned max_retry = 4;
  std::chrono::milliseconds transfer_timeout{30000};
  std::string custom_topology_json;    ///< a priority matrix to use instead of the sysfs scan
  std::size_t max_batches = 4096;      ///< batches alive at once
  std::size_t max_tasks_per_batch = batch_table::kDefaultMaxTasks;  ///< allocate_batch's cap
  std::uint32_t max_wrs_write = 32;    ///< WRs per WRITE request before its slices grow (plan/slice_planner.hpp)
  std::uint32_t max_wrs_read = 64;     ///< WRs per READ request before its slices grow
  std::uint64_t max_msg_size = 1u << 30;  ///< no WR longer (the devices' max_msg_sz when smaller)
  std::uint32_t inline_limit = 0;      ///< WRITE WRs up to this size are marked inline
  bool coalesce = true;                ///< requests contiguous at both ends share WRs
  std::chrono::microseconds wait_spin{200};  ///< wait() polls this long before it sleeps
  plan::rail_health_config rail;       ///< pause and cooldown of failing rails
  /// Takes the notifications peers send over RDMA (lane 0 of a context;
  /// `peer_server` = the server part of the peer's NIC path).  Empty: the
  /// endpoints advertise no receives (context.notify_credits is ignored).
  std::function<void(const notify_desc&, std::string_view peer_server)> on_notify;
  /// Open the host's RDMA devices.  false: no context at all (an engine on
  /// TCP alone); every request goes to the carrier (set_carrier).
  bool rdma = true;
  /// No RDMA device on the host is errc::no_device unless this is set: then
  /// the transport runs without a context, as with rdma = false.
  bool allow_no_devices = false;
  /// What the descriptor advertises for the carrier (the TCP transport's
  /// data port; 0 = none) and its protocol version.
  std::uint16_t tcp_data_port = 0;
  std::uint32_t tcp_proto_version = 2;
  /// Slicing of submits that only the carrier can take (each WR is a
  /// request with its own header there, so fewer, larger ones).
  std::size_t carrier_slice_size = std::size_t{256} << 10;
  /// Host memory is staged through the host copy engine as GPU memory is
  /// through CUDA's (engine_config::stage_host_memory).
  bool stage_host_memory = false;
  /// Local memory no NIC registered moves over RDMA through the lanes'
  /// stage chunks (context.stage_chunk_size, stage_chunks) where the peer's
  /// buffer is reachable by RDMA; false: over the carrier (TCP) only.
  bool rdma_staging = true;
};

template <class P>
class rdma_transport {
  static_assert(check_policy_set<P>());

 public:
  static constexpr std::size_t kMaxContexts = 16;
  using context_type = rdma_context<P>;
  using lanes = lane_pool<P>;

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
  /// Phase one of teardown (the destructor runs it): no retry from now on,
  /// every context inactive, then each shuts down (its lanes flush and
  /// drain, bounded).  Afterwards every submitted task is final and no WR
  /// touches memory; a later submit ends its tasks FAILED.  Idempotent;
  /// setup path, not concurrent with other calls of this transport.
  void shutdown() noexcept;

  // ---- local memory (setup path; any thread) ----
  /// Registers [addr, addr+len) on every context with location tag
  /// `location` and publishes the descriptor when `publish`.  Errors:
  /// invalid_argument (null), zero_length, bad_location, already_registered,
  /// verbs errors (resource_exhausted, permission_denied).  `access` sets
  /// the MRs' remote flags and the descriptor's "access"; local_only
  /// buffers are left out of the descriptor.
  [[nodiscard]] status register_memory(void* addr, std::size_t len, std::string_view location, bool publish = true,
                                       buffer_access access = buffer_access::remote_read_write);
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
  /// Calls f(d) with the descriptor as the last publish() saw it (null
  /// before the first), under the lock publishes take: no publish changes it
  /// meanwhile.  For an owner that encodes its descriptor on request.
  template <class F>
  decltype(auto) with_published(F&& f) {
    std::lock_guard lock(publish_mu_);
    return std::forward<F>(f)(published_ ? &*published_ : static_cast<const segment_desc*>(nullptr));
  }
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
  /// submitted on an error.  With `group` (its `left` set to
  /// requests.size() by the caller), every task of this submit joins it and
  /// the last to turn final calls group->done(); on an error the group is
  /// left untouched.  After a successful return the caller must not touch
  /// the group (it may be done already).
  [[nodiscard]] status submit(batch_id id, std::span<const transfer_request> requests,
                              detail::task_group* group = nullptr) noexcept;
  [[nodiscard]] result<transfer_status> task_status(batch_id id, std::size_t task) noexcept {
    return batches_->task_status(id, task);
  }
  [[nodiscard]] result<transfer_status> batch_status(batch_id id) noexcept { return batches_->batch_status(id); }
  [[nodiscard]] status wait(batch_id id, std::chrono::milliseconds timeout) noexcept {
    return batches_->wait(id, timeout, cfg_.wait_spin);
  }
  [[nodiscard]] status cancel(batch_id id) noexcept { return batches_->cancel(id); }
  [[nodiscard]] result<transfer_telemetry> task_telemetry(batch_id id, std::size_t task) noexcept {
    return batches_->task_telemetry(id, task);
  }
  [[nodiscard]] result<transfer_telemetry> batch_telemetry(batch_id id) noexcept {
    return batches_->batch_telemetry(id);
  }
  /// Latency histograms and final-task counts of every batch so far.  Any thread.
  [[nodiscard]] transfer_meter::snapshot meter() const noexcept { return batches_->meter().read(); }
  [[nodiscard]] status watch_batch(batch_id id, batch_listener* listener) noexcept {
    return batches_->watch(id, listener);
  }

  // ---- RDMA notifications (detail/transport_connect.hpp) ----
  /// Hands `n` to lane 0 of a context with a connected endpoint to segment
  /// `target` whose peer advertised notification receives; that lane posts
  /// it as a SEND and calls n->sent().  False: no such endpoint (the caller
  /// keeps `n` and sends it over TCP).  Any thread but a lane's; never
  /// after shutdown() began.
  [[nodiscard]] bool send_notify_rdma(segment_id target, detail::notify_send* n) noexcept;
  /// The lane send_notify_rdma would hand `n` to now (and n->peer_path set
  /// to that endpoint), or null.  At submit: the thread that retires the
  /// notification's last task then hands it to this lane itself, without a
  /// hop through the outbox thread.  Any thread but a lane's.
  [[nodiscard]] detail::notify_sink* notify_lane_for(segment_id target, detail::notify_send* n) noexcept;

  // ---- another transport (detail/carrier.hpp) ----
  /// Installs the carrier for WRs no RDMA rail can take (before the first
  /// submit; the carrier outlives every WR it was handed).
  void set_carrier(detail::slice_carrier* c) noexcept { carrier_ = c; }
  /// The carrier's outcome of WR `s`: retires it, or hands it to the
  /// carrier again (connection_lost, before the deadline, up to max_retry).
  /// Any thread but one inside the carrier's locks.
  void carried(detail::slice& s, errc e) noexcept;
  /// For a peer's request that another transport serves: the registered
  /// buffer holding [addr, addr + len) when it grants `op` to peers; it
  /// stays registered (unregister_memory waits) until close_local_range.
  /// Errors (no detail: the I/O path): out_of_bounds (no buffer holds the
  /// range), remote_access_denied (its access mode forbids `op`; local_only
  /// buffers forbid both), busy (being unregistered).  `stager`: the
  /// buffer's copy engine where bytes must be staged (GPU memory), else
  /// null.  Any thread.
  [[nodiscard]] errc open_local_range(std::uint64_t addr, std::uint64_t len, transfer_op op, void*& handle,
                                      const memory::copy_engine*& stager) noexcept;
  void close_local_range(void* handle) noexcept;
  /// The copy engine another transport stages [addr, addr + len) of a
  /// registered buffer through (null: none, or no such buffer).  A submitted
  /// slice holds its buffer, so the engine stays valid while it moves.
  [[nodiscard]] const memory::copy_engine* stager_of(std::uint64_t addr, std::uint64_t len) const noexcept;

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
  /// Whether context `i`'s NIC registers dma-bufs (GPU memory without a
  /// peer-memory module): probed once, on first use.  Any thread.
  [[nodiscard]] verbs::dmabuf_support dmabuf_support(std::size_t i) const;
  [[nodiscard]] std::size_t context_count() const noexcept { return contexts_.size(); }
  [[nodiscard]] context_type& context(std::size_t i) noexcept { return *contexts_[i]; }
  [[nodiscard]] const topology::priority_matrix& local_matrix() const noexcept { return matrix_; }
  [[nodiscard]] const std::string& server_name() const noexcept { return cfg_.context.local_server_name; }

  /// Per-NIC bytes, WRs, errors, in-flight bytes and bandwidth, and every
  /// rail that has failed with its state.  Any thread; takes the rail
  /// table's registration mutex (not a hot-path call).  `every_rail`: every
  /// (local NIC, known peer NIC) rail, failed or not (the metrics' gauge).
  [[nodiscard]] plan::transport_stats stats(bool every_rail = false) const;
  /// The rail table (tests, tools).
  [[nodiscard]] plan::rail_table& rails() noexcept { return rails_; }
  /// Rail maps built so far (tests: a refresh that changes no NIC builds
  /// none).  A map lives as long as a view of its segment does (a task
  /// holding one included), no longer.  Any thread.
  [[nodiscard]] std::size_t rail_maps_kept() const {
    std::shared_lock lock(seg_mu_);
    return rail_maps_built_;
  }

 private:
  explicit rdma_transport(const transport_config& cfg) : cfg_(cfg), rails_(cfg.rail) {}

  /// A segment id's current view and its in-flight slice count.  Slots are
  /// never freed while the transport lives (tasks point at `inflight`).
  struct segment_slot {
    std::shared_ptr<const remote_segment> view;
    std::atomic<std::size_t> inflight{0};
    /// Set when the peer rejected an rkey (remote_access_error): its buffers
    /// may have changed, so the next submit refreshes the view first.
    std::atomic<bool> stale{false};
    /// Under seg_mu_: the incarnation of the view the segment was opened
    /// with.  A refresh that brings another (the peer restarted under the
    /// same name, its ids counting from 0 again) fails requests by buffer id
    /// until the segment is closed and opened again.
    std::optional<std::uint64_t> opened_incarnation;
  };
  /// A request after resolution: where its bytes are on both sides.
  struct resolved_request {
    const local_buffer* local;
    std::shared_ptr<const remote_segment> seg;
    segment_slot* slot;  ///< the target's slot (its in-flight count)
    int peer_buffer;
    std::uint64_t remote_addr;
  };
  /// Candidate NICs of one extent, as device ids (stack storage for plan::candidates).
  struct candidate_lists {
    std::array<std::uint16_t, kMaxContexts> local_preferred, local_available;
    std::array<std::uint16_t, 64> peer_preferred, peer_available;
    std::size_t nlp = 0, nla = 0, npp = 0, npa = 0;
    [[nodiscard]] plan::candidates view() const noexcept {
      return {{local_preferred.data(), nlp}, {local_available.data(), nla}, {peer_preferred.data(), npp},
              {peer_available.data(), npa}};
    }
  };

  // transport_dispatch.hpp
  [[nodiscard]] status plan_and_dispatch(detail::batch_state& b, std::size_t used,
                                         std::span<const transfer_request> requests,
                                         std::span<const resolved_request> res, detail::task_group* group);
  void on_failed(detail::slice& s, errc e) noexcept;
  // The rail that failed once more: at once for a first retry, else parked
  // in retry_timer_ for the backoff (retired when that would pass the deadline).
  void retry_on_same_rail(detail::slice& s, errc e) noexcept;
  // A retry leaves now: charges the slice's NIC and dispatches it (the retry
  // timer's thread for a parked slice).
  void resume_parked(detail::slice& s, errc e) noexcept;
  void count_retry(detail::slice& s) noexcept;
  void fill_candidates(const local_buffer& lb, std::uint64_t local_addr, const remote_segment& seg,
                       const remote_buffer& pb, std::uint64_t remote_addr, candidate_lists& out) const noexcept;
  [[nodiscard]] std::uint32_t active_mask() const noexcept;
  /// Points slice `s` at rail `r` (keys, path, health) and charges its NIC.
  void bind_rail(detail::slice& s, const local_buffer& lb, const remote_segment& seg, const remote_buffer& pb,
                 plan::rail r, std::int64_t now_ns) noexcept;
  void dispatch_one(detail::slice& s) noexcept;
  // Markers in a head's local_device between planning and dispatch.
  static constexpr std::uint16_t kNoRoute = 0xffff;
  static constexpr std::uint16_t kViaCarrier = 0xfffe;
  // Hands WR `s` to the carrier (its RDMA fields cleared, telemetry noted).
  void to_carrier(detail::slice& s) noexcept;
  // Whether a submit to `seg` can only go to the carrier (no NIC here, or
  // none there).
  [[nodiscard]] bool carrier_only(const remote_segment& seg) const noexcept {
    return contexts_.empty() || seg.nic_paths.empty();
  }
  // The same for one resolved request: also when no NIC registered its
  // local buffer or the peer's.
  [[nodiscard]] bool carrier_only(const resolved_request& r) const noexcept {
    return carrier_only(*r.seg) || (!r.local->nic_reachable && !cfg_.rdma_staging) ||
           r.seg->buffers[static_cast<std::size_t>(r.peer_buffer)].tcp_only;
  }
  // Whether a resolved request RDMA moves through stage chunks.
  [[nodiscard]] static bool staged(const resolved_request& r) noexcept { return !r.local->nic_reachable; }
  // Builds seg.rails (or takes the slot's current map when no NIC changed).
  void set_rail_map(const segment_slot& slot, remote_segment& seg, const segment_desc& d);

  [[nodiscard]] status submit_or_throw(batch_id id, std::span<const transfer_request> requests,
                                       detail::task_group* group);
  // Resolves every request into res (caller holds local_mu_ shared).  With
  // `wanted` non-null, a request a fresh descriptor might resolve adds its
  // target there (once) instead of failing; null: it fails.
  [[nodiscard]] status resolve_all(std::span<const transfer_request> requests, std::span<resolved_request> res,
                                   std::vector<segment_id>* wanted);
  [[nodiscard]] const local_buffer* find_local(std::uint64_t addr, std::uint64_t len) const noexcept;
  // GPU memory on every context's NIC (dma-buf, else peer memory), or the
  // error naming each NIC that can reach it by neither.
  [[nodiscard]] status register_device_memory(local_buffer& b, const memory::range_info& info);
  // The descriptor without its buffers: name, devices, priority matrix.
  [[nodiscard]] segment_desc local_header() const;
  // The descriptor's entry of `b` (a remote-visible buffer).
  [[nodiscard]] static buffer_desc published_entry(const local_buffer& b);
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
  std::uint64_t local_gen_ = 0;                       ///< under local_mu_: bumped by every change of local_
  /// Under local_mu_: what changed in the published buffer list since the
  /// last publish took it (registrations of remote-visible buffers, in id
  /// order, and unregistrations), so a publish updates published_ by the
  /// change instead of rebuilding every buffer's entry.
  struct buffer_change {
    bool added = false;
    buffer_desc buffer;  ///< added: the whole entry; removed: only its id
  };
  std::vector<buffer_change> changes_;

  // Snapshot and store write happen under one mutex, so an older snapshot is
  // never stored after a newer one.
  std::mutex publish_mu_;
  std::uint64_t published_gen_ = ~std::uint64_t{0};  ///< under publish_mu_: local_gen_ of the last stored snapshot
  /// Under publish_mu_: unregistered buffers whose MRs deregister once a
  /// descriptor without them has been published (a peer reading the store
  /// in between would get rkeys that no longer exist).
  std::vector<std::unique_ptr<local_buffer>> withdrawn_;
  mutable std::mutex dmabuf_mu_;
  mutable std::vector<std::optional<verbs::dmabuf_support>> dmabuf_probes_;  ///< by context, under dmabuf_mu_
  /// Under publish_mu_: the descriptor as the last publish saw it; its
  /// buffers in id order (= registration order, what local_segment() writes).
  std::optional<segment_desc> published_;

  mutable std::shared_mutex seg_mu_;
  std::vector<std::unique_ptr<segment_slot>> segments_;  ///< by segment_id

  std::unique_ptr<batch_table> batches_;

  plan::planner_config plan_cfg_;
  plan::planner_config carrier_plan_cfg_;  ///< submits only the carrier takes
  plan::planner_config stage_plan_cfg_;    ///< submits with a staged request: no WR longer than a stage chunk
  detail::slice_carrier* carrier_ = nullptr;
  plan::rail_table rails_;
  std::unique_ptr<plan::nic_load[]> loads_;  ///< by device id
  std::optional<plan::path_selector<typename P::path>> paths_;
  /// Under seg_mu_: rail maps built (each segment view owns its map).
  std::size_t rail_maps_built_ = 0;

  /// shutdown() began: on_failed retires instead of retrying.
  std::atomic<bool> stopping_{false};
  /// Slices waiting out a backoff before a retry on the only rail to their
  /// peer; owns them meanwhile (see its header).  Last member: it goes
  /// first, though shutdown() has closed it already.
  detail::retry_timer retry_timer_{[this](detail::slice& s, errc e) { resume_parked(s, e); }};
};

}  // namespace tide::rdma

#include <tide/rdma/detail/rdma_transport_impl.hpp>
#include <tide/rdma/detail/transport_memory.hpp>
#include <tide/rdma/detail/transport_connect.hpp>
#include <tide/rdma/detail/transport_dispatch.hpp>
