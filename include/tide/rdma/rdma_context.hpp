#pragma once
/// rdma::rdma_context<P> — everything tide holds for one HCA (Mooncake's
/// RdmaContext): the opened device, its protection domain, one completion
/// channel and CQ per transfer worker, the endpoint store (P::eviction),
/// the worker pool, the async-event fd in an epoll set, and an active flag.

#include <tide/detail/log.hpp>
#include <tide/rdma/detail/policy_adapt.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/rdma/endpoint_store.hpp>
#include <tide/rdma/worker_pool.hpp>
#include <tide/verbs/cq.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/error.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>

#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
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
  std::uint32_t num_qp_per_ep = 2;
  verbs::qp_caps caps;
  verbs::rc_params rc;
  int max_cqe = 4096;
  std::size_t workers = 2;
  std::size_t endpoint_capacity = 256;
  int numa_node = -1;             ///< bind workers here; -1: unbound
  std::chrono::milliseconds ready_ack_timeout{10000};
  std::string sysfs_root = "/sys";
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
  };

  /// Opens `cfg.device` and builds everything; starts the workers.
  /// Errors: those of verbs (no_device, device_not_found, device_open_failed,
  /// resource_exhausted, gid_not_found, ...), config_invalid.  Setup path.
  [[nodiscard]] static result<std::unique_ptr<rdma_context>> create(const context_config& cfg,
                                                                    std::uint16_t device_id, hooks h) {
    std::unique_ptr<rdma_context> c(new rdma_context(cfg, device_id, std::move(h)));
    if (auto r = c->construct(); !r) return fail(r.error());
    return c;
  }

  rdma_context(const rdma_context&) = delete;
  rdma_context& operator=(const rdma_context&) = delete;

  /// Teardown: every endpoint to ERR (in-flight WRs flush), workers drain
  /// and stop, then endpoints, CQs, channels, PD and device close.
  ~rdma_context() {
    shutdown();
    cqs_.clear();
    channels_.clear();
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
  }

  /// Phase one of teardown: every endpoint to ERR, workers drain and stop,
  /// endpoints destroyed.  MRs of this PD may be deregistered afterwards.
  /// Idempotent; setup path.
  void shutdown() noexcept {
    if (store_) store_->for_each([](std::string_view, endpoint& e) { e.disable(); });
    pool_.stop();
    store_.reset();
  }

  [[nodiscard]] const std::string& name() const noexcept { return cfg_.device; }
  [[nodiscard]] std::uint16_t device_id() const noexcept { return device_id_; }
  [[nodiscard]] const std::string& nic_path() const noexcept { return params_.local_nic_path; }
  [[nodiscard]] const verbs::gid& gid() const noexcept { return params_.local_gid; }
  [[nodiscard]] std::uint16_t lid() const noexcept { return params_.lid; }
  [[nodiscard]] const verbs::protection_domain& pd() const noexcept { return *pd_; }
  [[nodiscard]] worker_pool<P>& pool() noexcept { return pool_; }

  /// False after a device-fatal or port-error event, until the port is active again.
  [[nodiscard]] bool active() const noexcept { return active_.load(std::memory_order_acquire); }
  void set_active(bool a) noexcept { active_.store(a, std::memory_order_release); }

  [[nodiscard]] verbs::completion_queue& cq(std::size_t worker) noexcept { return cqs_[worker]; }
  [[nodiscard]] ibv_comp_channel* channel(std::size_t worker) const noexcept {
    return channels_[worker].native_handle();
  }

  /// Registers [addr, addr+len) with this context's PD.  Setup path.
  [[nodiscard]] result<verbs::memory_region> register_memory(void* addr, std::size_t len) const {
    return verbs::memory_region::register_memory(*pd_, addr, len);
  }

  /// The endpoint to `peer_path`, made (unconnected) on a miss with its QPs
  /// on worker `w`'s CQ.  Hot path on a hit: one store find.
  [[nodiscard]] result<handle> endpoint_for(std::string_view peer_path, std::uint32_t w) {
    if (handle h = store_->find(peer_path)) [[likely]]
      return h;
    return store_->get_or_insert(peer_path, [&](std::string_view key) { return make_endpoint(key, w); });
  }

  /// Active connect of `e` through the transport's handshake.
  [[nodiscard]] status connect(endpoint& e) { return e.connect(hooks_.send); }

  /// Takes `e` out of the store (it drains, then is destroyed) after moving
  /// its QPs to ERR.  Any thread.
  void retire_endpoint(handle& h) noexcept { retire_endpoint_ptr(h.get()); }
  void retire_endpoint_ptr(endpoint* e) noexcept {
    if (e == nullptr) return;
    e->disable();
    if (handle cur = store_->find(e->peer_nic_path()); cur && cur.get() == e) {
      cur.reset();
      (void)store_->erase(e->peer_nic_path());
    }
  }

  /// Removes the endpoint to `peer_path`, if any (it drains, then goes).
  void close_endpoint(std::string_view peer_path) noexcept { (void)store_->erase(peer_path); }

  /// A slice failed here: back to the transport (another path, or FAILED).
  void on_slice_failed(detail::slice& s, errc e) noexcept { hooks_.failed(s, e); }

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
    return s;
  }

  /// Passive side of a Connection request addressed to this NIC.  Any
  /// thread (the handshake service's).
  [[nodiscard]] handshake_desc handle_connect(const handshake_desc& req) {
    if (req.ready_ack.value_or(false)) {
      handshake_desc reply;
      handle h = store_->find(req.local_nic_path);
      reply.reply_msg = h ? h->on_ready_ack(req) : "Received RDMA ready ACK for unconnected endpoint";
      if (reply.reply_msg.empty()) pool_.wake_all();
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
    const auto w = pool_.worker_for_path(req.local_nic_path);
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto h = endpoint_for(req.local_nic_path, w);
      if (!h) return reject(h.error().message());
      if (auto reply = (*h)->accept(req)) return *reply;
      // Connected to older peer QPs with work in flight, or being evicted: replace it.
      retire_endpoint(*h);
    }
    return reject("endpoint to " + req.local_nic_path + " is busy; retry");
  }

  /// Reads async events for up to `timeout_ms` and reacts (monitor thread):
  /// QP fatal -> that endpoint only; device fatal / port error -> every
  /// endpoint disabled, context inactive; port active -> active again.
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
          TIDE_LOG_WARN(cfg_.device << ": " << e->name() << " on QP " << (e->qp ? e->qp->qp_num : 0));
          disable_qp_owner(e->qp);
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
  void reclaim_endpoints() noexcept { (void)store_->reclaim(); }

  /// Disables and removes every endpoint (port error, close).  Any thread.
  void disconnect_all() noexcept {
    store_->for_each([](std::string_view, endpoint& e) { e.disable(); });
    (void)store_->clear();
  }

  [[nodiscard]] std::size_t live_endpoints() const noexcept { return store_ ? store_->size() : 0; }
  [[nodiscard]] std::size_t draining_endpoints() const noexcept { return store_ ? store_->draining() : 0; }

 private:
  rdma_context(const context_config& cfg, std::uint16_t device_id, hooks h)
      : cfg_(cfg), device_id_(device_id), hooks_(std::move(h)), pool_(*this) {}

  result<std::unique_ptr<endpoint>> make_endpoint(std::string_view key, std::uint32_t w) {
    auto e = endpoint::create(params_, cqs_[w], std::string(key), w);
    if (e) endpoints_created_.fetch_add(1, std::memory_order_relaxed);
    return e;
  }

  void disable_qp_owner(const ibv_qp* qp) noexcept {
    if (qp == nullptr) return;
    endpoint* owner = nullptr;
    store_->for_each([&](std::string_view, endpoint& e) {
      if (e.owns_qp(qp->qp_num)) owner = &e;
    });
    if (owner != nullptr) retire_endpoint_ptr(owner);
  }

  status construct() {
    auto ctx = verbs::context::open(cfg_.device);
    if (!ctx) return fail(ctx.error());
    ctx_.emplace(std::move(*ctx));
    auto port = ctx_->query_port(cfg_.port);
    if (!port) return fail(port.error());
    auto gid_index = verbs::select_gid_index(cfg_.device, cfg_.port, cfg_.gid_index, cfg_.sysfs_root);
    if (!gid_index) return fail(gid_index.error());
    auto gid = ctx_->query_gid(cfg_.port, *gid_index);
    if (!gid) return fail(gid.error());
    auto cap = verbs::mtu_from_bytes(cfg_.mtu_cap);
    if (!cap) return fail(errc::config_invalid, "mtu " + std::to_string(cfg_.mtu_cap) + ": " + cap.error().detail);
    auto pd = verbs::protection_domain::create(*ctx_);
    if (!pd) return fail(pd.error());
    pd_.emplace(std::move(*pd));
    if (cfg_.workers == 0) return fail(errc::config_invalid, "workers_per_context must be >= 1");
    channels_.reserve(cfg_.workers);
    cqs_.reserve(cfg_.workers);
    for (std::size_t i = 0; i < cfg_.workers; ++i) {
      auto ch = verbs::completion_channel::create(*ctx_);
      if (!ch) return fail(ch.error());
      channels_.push_back(std::move(*ch));
      auto cq = verbs::completion_queue::create(*ctx_, cfg_.max_cqe, &channels_.back(), static_cast<int>(i));
      if (!cq) return fail(cq.error());
      cqs_.push_back(std::move(*cq));
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
    params_.gid_index = *gid_index;
    params_.local_gid = *gid;
    params_.lid = port->lid;
    params_.mtu = verbs::path_mtu(port->active_mtu, port->active_mtu, *cap);
    params_.num_qp = cfg_.num_qp_per_ep;
    params_.caps = cfg_.caps;
    params_.rc = cfg_.rc;
    params_.ready_ack_timeout = cfg_.ready_ack_timeout;
    active_.store(port->state == IBV_PORT_ACTIVE, std::memory_order_release);
    if (!active()) TIDE_LOG_WARN(cfg_.device << ": port " << int(cfg_.port) << " is not active");
    return pool_.start(cfg_.workers, cfg_.numa_node);
  }

  context_config cfg_;
  std::uint16_t device_id_;
  hooks hooks_;
  std::optional<verbs::context> ctx_;
  std::optional<verbs::protection_domain> pd_;
  std::vector<verbs::completion_channel> channels_;
  std::vector<verbs::completion_queue> cqs_;
  int epoll_fd_ = -1;
  endpoint_params params_;
  std::unique_ptr<store_type> store_;
  std::atomic<bool> active_{false};
  std::atomic<std::uint64_t> slices_posted_{0};
  std::atomic<std::uint64_t> bytes_posted_{0};
  std::atomic<std::uint64_t> endpoints_created_{0};
  std::atomic<std::uint64_t> port_errors_{0};
  std::atomic<std::uint64_t> qp_fatal_{0};
  worker_pool<P> pool_;  // last: its threads start after everything above exists, stop first
};

}  // namespace tide::rdma
