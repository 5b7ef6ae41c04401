#pragma once
/// rdma::rdma_context<P> — everything tide holds for one HCA (Mooncake's
/// RdmaContext): the opened device, its protection domain, one completion
/// channel and CQ per lane, the endpoint store (P::eviction), the lanes
/// (lane_pool: lane i owns CQ i and QP i of every endpoint), the connector
/// (handshakes off the lanes), the async-event fd and an active flag.
///
/// Threads: dispatch() from any thread (the hot path in); handle_connect()
/// from the handshake service; the monitor (lane_pool) reads async events
/// and turns them into lane messages; lanes call back into endpoint_for,
/// start_connect, on_slice_failed, retire_endpoint_ptr.  The CQ table is
/// read under cq_mu_ (endpoint creation, setup path) and replaced only by
/// its lane after a CQ error.

#include <tide/detail/log.hpp>
#include <tide/rdma/connector.hpp>
#include <tide/rdma/detail/policy_adapt.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/rdma/endpoint_store.hpp>
#include <tide/rdma/lane_pool.hpp>
#include <tide/verbs/cq.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/error.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tide::rdma {

/// Per-context settings (filled by the engine from engine_config).
struct context_config {
  std::string device;             ///< "rxe0", "mlx5_0"
  std::string local_server_name;  ///< NIC paths are "<local_server_name>@<device>"
  std::uint8_t port = 1;
  int gid_index = -1;             ///< -1: automatic (verbs::select_gid_index)
  int mtu_cap = 4096;             ///< bytes; the path MTU is min(both ends' active MTU, this)
  /// Every QP's GRH traffic class, service level and P_Key index (Mooncake's
  /// MC_IB_TC, MC_IB_SL, MC_PKEY_INDEX); the P_Key index must be inside the
  /// port's table.
  std::uint8_t traffic_class = 0;
  std::uint8_t service_level = 0;
  std::uint16_t pkey_index = 0;
  /// Lanes per context = QPs per endpoint (Mooncake's MC_NUM_QP_PER_EP; both
  /// ends must agree, the handshake checks it).
  std::uint32_t num_qp_per_ep = 2;
  /// caps.max_send_wr is the send queue depth per QP, caps.max_inline_data
  /// the inline limit asked for (the QP's granted value is used).
  verbs::qp_caps caps{256, 1, 1, 1, 64};
  verbs::rc_params rc;
  int max_cqe = 4096;             ///< CQ entries per lane (clamped to the device)
  std::uint32_t signal_interval = 16;  ///< every Nth WR signaled (clamped to max_send_wr / 2)
  std::size_t endpoint_capacity = 256;
  int numa_node = -1;             ///< bind lanes here; -1: unbound
  std::vector<int> lane_cpus;     ///< run lanes on these CPUs instead of numa_node; empty: numa_node
  std::chrono::milliseconds ready_ack_timeout{10000};
  std::string sysfs_root = "/sys";
  /// Receives each endpoint advertises for RDMA notifications (0: none;
  /// at most kMaxNotifyCredits).  The transport zeroes it when nothing
  /// takes the messages or the idle strategy would sleep past a receive.
  std::uint32_t notify_credits = 0;
  /// The staged RDMA path (rdma/detail/stage_pool.hpp): bytes per chunk
  /// (no staged WR is longer) and chunks per lane, allocated and registered
  /// on the lane's first staged slice.
  std::size_t stage_chunk_size = std::size_t{256} << 10;
  std::size_t stage_chunks = 32;
};

/// Counters of one context (relaxed; for tests and benchmarks).
struct context_stats {
  std::uint64_t slices_posted = 0;
  std::uint64_t bytes_posted = 0;
  std::uint64_t endpoints_created = 0;
  std::uint64_t endpoints_live = 0;
  std::uint64_t endpoints_draining = 0;
  std::uint64_t port_errors = 0;
  std::uint64_t qp_fatal = 0;
  std::uint64_t cq_errors = 0;
  std::uint64_t bytes_staged = 0;  ///< payload copied through the lanes' stage chunks
};

template <class P>
class rdma_context {
  static_assert(check_policy_set<P>());

 public:
  using store_type = endpoint_store<endpoint, typename P::eviction>;
  using handle = typename store_type::handle;

  /// What the context calls back into its transport for.
  struct hooks {
    handshake_sender send;                              ///< the active handshake
    std::function<void(detail::slice&, errc)> failed;  ///< a slice to retry elsewhere or fail
    /// A notification arrived over RDMA from the peer whose NIC paths name
    /// server `peer_server` (lane 0's thread; must not block for long).
    std::function<void(const notify_desc&, std::string_view peer_server)> notified;
  };

  /// Opens `cfg.device`, validates the config against the device, builds
  /// everything and starts the lanes.  Errors: those of verbs (no_device,
  /// device_not_found, device_open_failed, resource_exhausted,
  /// gid_not_found, ...), config_invalid naming the field.  Setup path.
  [[nodiscard]] static result<std::unique_ptr<rdma_context>> create(const context_config& cfg,
                                                                    std::uint16_t device_id, hooks h) {
    std::unique_ptr<rdma_context> c(new rdma_context(cfg, device_id, std::move(h)));
    if (auto r = c->construct(); !r) return fail(r.error());
    return c;
  }

  rdma_context(const rdma_context&) = delete;
  rdma_context& operator=(const rdma_context&) = delete;

  ~rdma_context() {
    shutdown();
    lanes_.clear();
    {
      std::lock_guard lock(cq_mu_);
      cqs_.clear();
    }
    channels_.clear();
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  /// Phase one of teardown: no new handshakes, every endpoint retired (the
  /// lanes move their QPs to ERR and drain), lanes stopped, endpoints
  /// destroyed.  MRs of this PD may be deregistered afterwards.
  /// Idempotent; setup path.
  void shutdown() noexcept {
    begin_stop();
    connector_.stop();
    if (store_) (void)store_->clear();
    lanes_.stop();
    store_.reset();
  }

  [[nodiscard]] const std::string& name() const noexcept { return cfg_.device; }
  [[nodiscard]] std::uint16_t device_id() const noexcept { return device_id_; }
  [[nodiscard]] const std::string& nic_path() const noexcept { return params_.local_nic_path; }
  [[nodiscard]] const verbs::gid& gid() const noexcept { return params_.local_gid; }
  [[nodiscard]] std::uint16_t lid() const noexcept { return params_.lid; }
  [[nodiscard]] const verbs::protection_domain& pd() const noexcept { return *pd_; }
  [[nodiscard]] lane_pool<P>& lanes() noexcept { return lanes_; }
  [[nodiscard]] const context_config& config() const noexcept { return cfg_; }
  /// What the lanes' stage pools count (payload bytes copied through their chunks).
  [[nodiscard]] std::atomic<std::uint64_t>& bytes_staged_counter() noexcept { return bytes_staged_; }
  [[nodiscard]] std::uint64_t bytes_staged() const noexcept { return bytes_staged_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::chrono::milliseconds ready_ack_timeout() const noexcept { return cfg_.ready_ack_timeout; }
  /// The port's max_msg_sz: no slice may be larger.
  [[nodiscard]] std::uint64_t max_msg_size() const noexcept { return max_msg_size_; }
  /// The settings in force after validation against the device.
  [[nodiscard]] const endpoint_params& params() const noexcept { return params_; }
  [[nodiscard]] int cq_entries() const noexcept { return cfg_.max_cqe; }

  /// Hands a chain of slices for this context (linked by next, any peers)
  /// to at most `width` lanes, which decide where each is posted.  Hot
  /// path, any thread.
  void dispatch(detail::slice* first, detail::slice* last, std::size_t width) noexcept {
    lanes_.dispatch(first, last, width);
  }

  /// False after a device-fatal or port-error event, until the port is
  /// active again, and for good once teardown began (begin_stop).
  [[nodiscard]] bool active() const noexcept {
    return active_.load(std::memory_order_acquire) && !stopping_.load(std::memory_order_acquire);
  }
  void set_active(bool a) noexcept { active_.store(a, std::memory_order_release); }
  /// Teardown began: the context is inactive from now on, whatever the port
  /// does (a PORT_ACTIVE event cannot bring it back), so no lane makes new
  /// endpoints and no retry picks it.  The transport calls it on every
  /// context before it shuts the first one down.  Any thread.
  void begin_stop() noexcept { stopping_.store(true, std::memory_order_release); }

  /// Lane i's current CQ (setup path: lane start, endpoint creation).
  [[nodiscard]] std::shared_ptr<verbs::completion_queue> lane_cq(std::size_t i) const {
    std::lock_guard lock(cq_mu_);
    return cqs_[i];
  }
  [[nodiscard]] ibv_comp_channel* channel(std::size_t i) const noexcept { return channels_[i].native_handle(); }

  /// Registers [addr, addr+len) with this context's PD.  Setup path.
  [[nodiscard]] result<verbs::memory_region> register_memory(void* addr, std::size_t len) const {
    return verbs::memory_region::register_memory(*pd_, addr, len);
  }

  /// The endpoint to `peer_path`, made (QPs in RESET, unconnected) on a
  /// miss.  Hot path on a hit: one store find.  Any thread.
  [[nodiscard]] result<handle> endpoint_for(std::string_view peer_path) {
    if (handle h = store_->find(peer_path)) [[likely]]
      return h;
    return store_->get_or_insert(peer_path, [&](std::string_view key) { return make_endpoint(key); });
  }
  [[nodiscard]] handle find_endpoint(std::string_view peer_path) noexcept {
    return store_ ? store_->find(peer_path) : handle{};  // none after shutdown
  }

  /// Starts the active handshake of `h` (a lane won begin_connect()).
  void start_connect(const handle& h) noexcept { connector_.start_active(h); }

  /// Takes `e` out of the store: on_evict sends "QP to ERR" to every lane;
  /// it is destroyed once drained.  Any thread.
  void retire_endpoint(handle& h) noexcept { retire_endpoint_ptr(h.get()); }
  void retire_endpoint_ptr(endpoint* e) noexcept {
    if (e == nullptr || !store_) return;
    if (handle cur = store_->find(e->peer_nic_path()); cur && cur.get() == e) {
      cur.reset();
      (void)store_->erase(e->peer_nic_path());
    }
  }

  /// Removes the endpoint to `peer_path`, if any (it drains, then goes).
  void close_endpoint(std::string_view peer_path) noexcept {
    if (store_) (void)store_->erase(peer_path);  // none after shutdown
  }

  /// A slice failed here: back to the transport (another path, or FAILED).
  /// A WR of the notification path (hook set) is no transfer's: its owner
  /// learns it instead.
  void on_slice_failed(detail::slice& s, errc e) noexcept {
    if (s.hook != nullptr) [[unlikely]] {
      // A notification SEND the peer never had a receive for: it advertised
      // credits it does not honour.  (s.ep lives until the lane's release.)
      if (e == errc::rnr_retry_exceeded && s.ep != nullptr) refuse_rdma_notify(s.ep->peer_nic_path());
      detail::retire_wr(s, e);
      return;
    }
    (void)detail::unstage(s, e);  // the chunk stays with this lane; a retry may go elsewhere
    hooks_.failed(s, e);
  }

  /// Peer NIC paths whose notification SENDs drew RNR NAKs until the QP's
  /// retries ran out (a peer that advertises credits and posts no
  /// receives): endpoints made to them from then on advertise no RDMA
  /// notifications, so that peer gets TCP ones and QP 0 no SENDs to stall
  /// on.  At most kMaxNotifyRefused, the oldest forgotten.  Any thread.
  static constexpr std::size_t kMaxNotifyRefused = 256;
  void refuse_rdma_notify(std::string_view peer_path) noexcept {
    std::lock_guard lock(refused_mu_);
    if (std::find(refused_.begin(), refused_.end(), peer_path) != refused_.end()) return;
    try {
      if (refused_.size() >= kMaxNotifyRefused) refused_.pop_front();
      refused_.emplace_back(peer_path);
    } catch (...) {
      return;  // not remembered: the next endpoint stalls once more, then fails the same way
    }
    TIDE_LOG_WARN(cfg_.device << " -> " << peer_path
                              << ": a notification SEND found no receive (RNR retries exhausted) although the peer "
                                 "advertised credits; notifications to it go over TCP from now on");
  }
  [[nodiscard]] bool rdma_notify_refused(std::string_view peer_path) const {
    std::lock_guard lock(refused_mu_);
    return std::find(refused_.begin(), refused_.end(), peer_path) != refused_.end();
  }

  /// An RDMA notification from `peer_server` (lane 0).  Whatever the hook
  /// throws (bad_alloc) drops the message.
  void deliver_notify(const notify_desc& n, std::string_view peer_server) noexcept {
    if (!hooks_.notified) return;
    try {
      hooks_.notified(n, peer_server);
    } catch (...) {
      TIDE_LOG_WARN(cfg_.device << ": notification from " << peer_server << " dropped (out of memory)");
    }
  }

  void count_posted(std::size_t slices, std::size_t bytes) noexcept {
    slices_posted_.fetch_add(slices, std::memory_order_relaxed);
    bytes_posted_.fetch_add(bytes, std::memory_order_relaxed);
  }

  [[nodiscard]] context_stats stats() const noexcept {
    context_stats s;
    s.slices_posted = slices_posted_.load(std::memory_order_relaxed);
    s.bytes_posted = bytes_posted_.load(std::memory_order_relaxed);
    s.endpoints_created = endpoints_created_.load(std::memory_order_relaxed);
    s.endpoints_live = store_ ? store_->size() : 0;
    s.endpoints_draining = store_ ? store_->draining() : 0;
    s.port_errors = port_errors_.load(std::memory_order_relaxed);
    s.qp_fatal = qp_fatal_.load(std::memory_order_relaxed);
    s.cq_errors = cq_errors_.load(std::memory_order_relaxed);
    s.bytes_staged = bytes_staged();
    return s;
  }

  /// Passive side of a Connection request addressed to this NIC.  Handshake
  /// service thread; waits (bounded) for the lanes to move their QPs.
  [[nodiscard]] handshake_desc handle_connect(const handshake_desc& req) {
    if (req.ready_ack.value_or(false)) {
      handshake_desc reply;
      reply.reply_msg = connector_.ready_ack(req);
      return reply;
    }
    auto reject = [&](std::string why) {
      handshake_desc r;
      r.local_nic_path = params_.local_nic_path;
      r.peer_nic_path = req.local_nic_path;
      r.reply_msg = std::move(why);
      return r;
    };
    if (req.peer_nic_path != params_.local_nic_path)
      return reject("Invalid argument: peer nic path inconsistency: " + req.peer_nic_path + " != " +
                    params_.local_nic_path);
    if (!active()) return reject("context " + cfg_.device + " is inactive");
    return connector_.accept(req);
  }

  /// Reads async events for up to `timeout_ms` and reacts (monitor thread):
  /// QP fatal -> that endpoint retired (its lanes flush it); CQ error -> a
  /// message to the lane owning the CQ; device fatal / port error -> every
  /// endpoint retired, context inactive; port active -> active again.
  void process_async_events(int timeout_ms) noexcept {
    epoll_event ev{};
    const int n = ::epoll_wait(epoll_fd_, &ev, 1, timeout_ms);
    if (n <= 0) return;
    while (auto e = ctx_->next_async_event()) {
      switch (e->type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
          qp_fatal_.fetch_add(1, std::memory_order_relaxed);
          TIDE_LOG_WARN(cfg_.device << ": " << e->name() << " on QP " << e->qp_num);
          retire_qp_owner(e->qp_num);
          break;
        case IBV_EVENT_CQ_ERR:
          TIDE_LOG_WARN(cfg_.device << ": " << e->name());
          lanes_.send_cq_error(e->cq);
          break;
        case IBV_EVENT_DEVICE_FATAL:
        case IBV_EVENT_PORT_ERR:
          port_errors_.fetch_add(1, std::memory_order_relaxed);
          TIDE_LOG_WARN(cfg_.device << ": " << e->name() << ": disconnecting every endpoint, context inactive");
          set_active(false);
          disconnect_all();
          break;
        case IBV_EVENT_PORT_ACTIVE:
          TIDE_LOG_INFO(cfg_.device << ": port active again");
          set_active(true);
          break;
        default: TIDE_LOG_DEBUG(cfg_.device << ": async event " << e->name()); break;
      }
    }
  }

  /// Destroys drained endpoints (monitor thread, periodically).
  void reclaim_endpoints() noexcept {
    (void)store_->trim();  // back to capacity once the pins that let it grow have lifted
    (void)store_->reclaim();
  }

  /// Retires every endpoint (port error, CQ error, close).  Any thread.
  void disconnect_all() noexcept {
    if (store_) (void)store_->clear();
  }

  /// Lane `i`'s CQ failed (the lane has failed its own slices).  Lane thread.
  void cq_failed(std::size_t /*i*/) noexcept {
    cq_errors_.fetch_add(1, std::memory_order_relaxed);
    disconnect_all();  // every endpoint has a QP on that CQ
  }

  /// A new CQ for lane `i` (after a CQ error); endpoints created from now on
  /// use it, the old one lives until its QPs are gone.  Lane thread.
  [[nodiscard]] result<std::shared_ptr<verbs::completion_queue>> rebuild_cq(std::size_t i) {
    auto cq = verbs::completion_queue::create(*ctx_, cfg_.max_cqe, &channels_[i], static_cast<int>(i));
    if (!cq) return fail(cq.error());
    auto p = std::make_shared<verbs::completion_queue>(std::move(*cq));
    std::lock_guard lock(cq_mu_);
    cqs_[i] = p;
    return p;
  }

  [[nodiscard]] std::size_t live_endpoints() const noexcept { return store_ ? store_->size() : 0; }
  [[nodiscard]] std::size_t draining_endpoints() const noexcept { return store_ ? store_->draining() : 0; }

 private:
  rdma_context(const context_config& cfg, std::uint16_t device_id, hooks h)
      : cfg_(cfg), device_id_(device_id), hooks_(std::move(h)), lanes_(*this), connector_(*this, hooks_.send) {}

  result<std::unique_ptr<endpoint>> make_endpoint(std::string_view key) {
    std::vector<std::shared_ptr<verbs::completion_queue>> cqs;
    {
      std::lock_guard lock(cq_mu_);
      cqs = cqs_;
    }
    auto e = [&] {
      if (params_.notify_credits == 0 || !rdma_notify_refused(key)) return endpoint::create(params_, cqs, std::string(key));
      endpoint_params p = params_;
      p.notify_credits = 0;
      return endpoint::create(p, cqs, std::string(key));
    }();
    if (e) endpoints_created_.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  void retire_qp_owner(std::uint32_t qp_num) noexcept {
    if (qp_num == 0 || !store_) return;
    std::string owner;
    store_->for_each([&](std::string_view key, endpoint& e) {
      if (e.lane_of_qp(qp_num) >= 0) owner = std::string(key);
    });
    if (!owner.empty()) close_endpoint(owner);
  }

  // Checks the configuration against the device: clamps with a WARN what
  // the device caps, refuses (config_invalid naming the field) what cannot work.
  status validate_against(const ibv_device_attr& dev, const ibv_port_attr& port) {
    auto clamp = [&](auto& value, auto limit, const char* field) {
      using T = std::remove_reference_t<decltype(value)>;
      if (limit > 0 && static_cast<long long>(value) > static_cast<long long>(limit)) {
        TIDE_LOG_WARN(cfg_.device << ": " << field << " " << static_cast<long long>(value)
                                  << " is above the device's limit " << static_cast<long long>(limit)
                                  << "; using " << static_cast<long long>(limit));
        value = static_cast<T>(limit);
      }
    };
    if (cfg_.max_cqe < 1) return fail(errc::config_invalid, "max_cqe must be >= 1, got " + std::to_string(cfg_.max_cqe));
    if (cfg_.caps.max_send_wr < 1) return fail(errc::config_invalid, "max_wr must be >= 1");
    if (cfg_.signal_interval < 1) return fail(errc::config_invalid, "signal_interval must be >= 1");
    if (cfg_.rc.max_rd_atomic < 1) return fail(errc::config_invalid, "max_rd_atomic must be >= 1");
    clamp(cfg_.max_cqe, dev.max_cqe, "max_cqe");
    // Each QP gets kDrainMarkerSlots more than max_wr (endpoint::post_drain_marker).
    constexpr int marker = static_cast<int>(kDrainMarkerSlots);
    clamp(cfg_.caps.max_send_wr, dev.max_qp_wr > marker ? dev.max_qp_wr - marker : dev.max_qp_wr, "max_wr");
    clamp(cfg_.rc.max_rd_atomic, dev.max_qp_init_rd_atom, "max_rd_atomic");
    cfg_.rc.max_dest_rd_atomic = cfg_.rc.max_rd_atomic;
    clamp(cfg_.rc.max_dest_rd_atomic, dev.max_qp_rd_atom, "max_rd_atomic (as responder)");
    const std::uint32_t half = std::max<std::uint32_t>(1, cfg_.caps.max_send_wr / 2);
    clamp(cfg_.signal_interval, half, "signal_interval (max_wr / 2)");
    if (cfg_.service_level > 15)
      return fail(errc::config_invalid, "ib_service_level must be 0..15, got " + std::to_string(cfg_.service_level));
    if (port.pkey_tbl_len > 0 && cfg_.pkey_index >= port.pkey_tbl_len)
      return fail(errc::config_invalid, "pkey_index " + std::to_string(cfg_.pkey_index) + ": port " +
                                            std::to_string(cfg_.port) + " of " + cfg_.device + " has a P_Key table of " +
                                            std::to_string(port.pkey_tbl_len) + " entries");
    max_msg_size_ = port.max_msg_sz;
    return {};
  }

  status construct() {
    auto ctx = verbs::context::open(cfg_.device);
    if (!ctx) return fail(ctx.error());
    ctx_.emplace(std::move(*ctx));
    auto port = ctx_->query_port(cfg_.port);
    if (!port) return fail(port.error());
    auto dev = ctx_->query_device();
    if (!dev) return fail(dev.error());
    if (auto r = validate_against(*dev, *port); !r) return r;
    auto gid_index = verbs::select_gid_index(cfg_.device, cfg_.port, cfg_.gid_index, cfg_.sysfs_root);
    if (!gid_index) return fail(gid_index.error());
    auto gid = ctx_->query_gid(cfg_.port, *gid_index);
    if (!gid) return fail(gid.error());
    auto cap = verbs::mtu_from_bytes(cfg_.mtu_cap);
    if (!cap) return fail(errc::config_invalid, "mtu " + std::to_string(cfg_.mtu_cap) + ": " + cap.error().detail);
    auto pd = verbs::protection_domain::create(*ctx_);
    if (!pd) return fail(pd.error());
    pd_.emplace(std::move(*pd));
    const std::size_t lanes = cfg_.num_qp_per_ep;
    if (lanes == 0 || lanes > 255)
      return fail(errc::config_invalid, "num_qp_per_ep (lanes per context) must be 1..255, got " + std::to_string(lanes));
    channels_.reserve(lanes);
    for (std::size_t i = 0; i < lanes; ++i) {
      auto ch = verbs::completion_channel::create(*ctx_);
      if (!ch) return fail(ch.error());
      channels_.push_back(std::move(*ch));
      auto cq = verbs::completion_queue::create(*ctx_, cfg_.max_cqe, &channels_.back(), static_cast<int>(i));
      if (!cq) return fail(cq.error());
      cqs_.push_back(std::make_shared<verbs::completion_queue>(std::move(*cq)));
    }
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return fail(verbs::verbs_error("epoll_create1", cfg_.device, errno));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = ctx_->async_fd();
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, ctx_->async_fd(), &ev) != 0)
      return fail(verbs::verbs_error("epoll_ctl(async_fd)", cfg_.device, errno));
    auto store = store_type::create(cfg_.endpoint_capacity);
    if (!store) return fail(store.error());
    store_ = std::move(*store);

    params_.pd = &*pd_;
    params_.local_nic_path = cfg_.local_server_name + "@" + cfg_.device;
    params_.port = cfg_.port;
    params_.traffic_class = cfg_.traffic_class;
    params_.service_level = cfg_.service_level;
    params_.pkey_index = cfg_.pkey_index;
    params_.gid_index = *gid_index;
    params_.local_gid = *gid;
    params_.lid = port->lid;
    params_.mtu = verbs::path_mtu(port->active_mtu, port->active_mtu, *cap);
    params_.num_qp = static_cast<std::uint32_t>(lanes);
    params_.caps = cfg_.caps;
    // No receives on the data QPs but QP 0's notification buffers: no RQ
    // slots to speak of otherwise.
    cfg_.notify_credits = std::min(cfg_.notify_credits, kMaxNotifyCredits);
    params_.caps.max_recv_wr = cfg_.notify_credits != 0 ? cfg_.notify_credits + detail::kCreditReserve : 1;
    params_.caps.max_recv_sge = 1;
    if (cfg_.notify_credits != 0) {
      params_.notify_credits = cfg_.notify_credits;
      // Half of lane 0's CQ at most for receives: the rest stays the data path's.
      params_.notify_budget = std::make_shared<std::atomic<std::int64_t>>(cfg_.max_cqe / 2);
    }
    params_.caps.max_send_sge = 1;
    params_.rc = cfg_.rc;
    params_.signal_interval = cfg_.signal_interval;
    params_.ready_ack_timeout = cfg_.ready_ack_timeout;
    params_.retire = [this](endpoint& e) { lanes_.send_fail(e); };
    active_.store(port->state == IBV_PORT_ACTIVE, std::memory_order_release);
    if (!active()) TIDE_LOG_WARN(cfg_.device << ": port " << int(cfg_.port) << " is not active");
    TIDE_LOG_INFO(cfg_.device << ": opened port " << int(cfg_.port) << " as " << params_.local_nic_path << ", GID index "
                              << *gid_index << " (" << gid->to_string() << "), active MTU "
                              << verbs::mtu_bytes(port->active_mtu) << ", path MTU at most "
                              << verbs::mtu_bytes(params_.mtu) << ", " << lanes << " lanes, traffic class "
                              << int(cfg_.traffic_class) << ", SL " << int(cfg_.service_level) << ", P_Key index "
                              << cfg_.pkey_index);
    return lanes_.start(lanes, cfg_.numa_node, cfg_.lane_cpus);
  }

  context_config cfg_;
  std::uint16_t device_id_;
  hooks hooks_;
  std::optional<verbs::context> ctx_;
  std::optional<verbs::protection_domain> pd_;
  std::vector<verbs::completion_channel> channels_;
  mutable std::mutex cq_mu_;
  std::vector<std::shared_ptr<verbs::completion_queue>> cqs_;  // lane i's current CQ
  mutable std::mutex refused_mu_;
  std::deque<std::string> refused_;  ///< refuse_rdma_notify, oldest first
  int epoll_fd_ = -1;
  std::uint64_t max_msg_size_ = 1u << 31;
  endpoint_params params_;
  std::unique_ptr<store_type> store_;
  std::atomic<bool> active_{false};
  std::atomic<bool> stopping_{false};  ///< begin_stop(): inactive for good
  std::atomic<std::uint64_t> slices_posted_{0};
  std::atomic<std::uint64_t> bytes_posted_{0};
  std::atomic<std::uint64_t> endpoints_created_{0};
  std::atomic<std::uint64_t> port_errors_{0};
  std::atomic<std::uint64_t> qp_fatal_{0};
  std::atomic<std::uint64_t> cq_errors_{0};
  std::atomic<std::uint64_t> bytes_staged_{0};  ///< the lanes' stage pools add to it
  // Last: their threads start after everything above exists and stop first.
  lane_pool<P> lanes_;
  connector<P> connector_;
};

}  // namespace tide::rdma
