#pragma once
/// rdma::worker_pool<P> — the threads of one rdma_context (Mooncake's
/// WorkerPool): shards of queued slices, transfer workers that alternate
/// posting and polling, and one monitor that handles async events and
/// reclaims drained endpoints.
///
/// Shards: a slice goes to shard P::shard_hash(target segment, peer device,
/// peer NIC path) mod kShards; shard s belongs to worker s mod workers, so
/// every slice for one peer NIC path is posted by one thread (QP reuse and
/// order).  Producers push a chain per shard with one CAS (no lock).
///
/// Completion queues: one CQ (and completion channel) per worker.  An
/// endpoint's QPs complete on the CQ of the worker that created it; that
/// worker polls it.  Idle workers follow P::idle's protocol (see
/// <tide/policy/idle.hpp>); with cq_event they sleep on the completion
/// channel as well as on wake-ups.

#include <tide/detail/log.hpp>
#include <tide/rdma/detail/policy_adapt.hpp>
#include <tide/rdma/detail/slice_queue.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/verbs/error.hpp>

#include <numa.h>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

namespace tide::rdma {

template <class P>
class rdma_context;

template <class P>
class worker_pool {
  static_assert(check_policy_set<P>());

 public:
  static constexpr std::size_t kShards = 8;  ///< Mooncake's kShardCount
  static constexpr int kPollBatch = 64;      ///< completions per ibv_poll_cq

  explicit worker_pool(rdma_context<P>& ctx) : ctx_(ctx) {}
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  ~worker_pool() { stop(); }

  /// Starts `workers` transfer threads and the monitor, bound to `numa_node`
  /// (-1: not bound).  Errors: invalid_argument (0 workers, a shard count
  /// the shard hash refuses), the idle strategy's errors.  Setup path; once.
  [[nodiscard]] status start(std::size_t workers, int numa_node) {
    if (workers == 0) return fail(errc::invalid_argument, "workers_per_context must be >= 1");
    if (auto r = validate_shard_count<typename P::shard_hash>(kShards); !r) return r;
    numa_node_ = numa_node;
    workers_.reserve(workers);
    for (std::size_t i = 0; i < workers; ++i) {
      auto w = std::make_unique<worker>();
      w->index = static_cast<std::uint32_t>(i);
      auto idle = P::idle::create(typename P::idle::config{});
      if (!idle) return fail(idle.error());
      w->idle.emplace(std::move(*idle));
      if (auto r = w->idle->attach(ctx_.cq(i).native_handle(), ctx_.channel(i)); !r) return r;
      workers_.push_back(std::move(w));
    }
    running_.store(true, std::memory_order_release);
    for (auto& w : workers_) w->thread = std::thread([this, p = w.get()] { run(*p); });
    monitor_ = std::thread([this] { monitor(); });
    return {};
  }

  /// Stops and joins every thread; slices still queued are retired as
  /// endpoint_closed.  Idempotent; never throws.
  void stop() noexcept {
    if (!running_.exchange(false, std::memory_order_acq_rel)) {
      for (auto& w : workers_)
        if (w->idle) w->idle->detach(ctx_.cq(w->index).native_handle());
      workers_.clear();
      return;
    }
    for (auto& w : workers_) w->idle->wake();
    for (auto& w : workers_)
      if (w->thread.joinable()) w->thread.join();
    if (monitor_.joinable()) monitor_.join();
    for (auto& w : workers_) w->idle->detach(ctx_.cq(w->index).native_handle());
    workers_.clear();
  }

  [[nodiscard]] std::size_t workers() const noexcept { return workers_.size(); }

  /// The shard of a slice for (target segment, peer device, peer NIC path).
  [[nodiscard]] static std::size_t shard_of(std::uint64_t target, std::uint32_t peer_device,
                                            std::string_view peer_path) noexcept {
    return detail::shard_index<P>(target, peer_device, peer_path, kShards);
  }

  /// The worker that owns peer NIC path `peer_path`'s endpoint CQ when the
  /// endpoint is created passively (no target segment known).
  [[nodiscard]] std::uint32_t worker_for_path(std::string_view peer_path) const noexcept {
    return static_cast<std::uint32_t>(std::hash<std::string_view>{}(peer_path) % workers_.size());
  }

  /// Hands the chain first..last (all for `shard`) to its worker and wakes
  /// it if it sleeps.  Hot path: one CAS, a fence and a relaxed load (plus an
  /// eventfd write when the worker sleeps).  Any thread.
  void submit(std::size_t shard, detail::slice* first, detail::slice* last) noexcept {
    shards_[shard].push(first, last);
    workers_[shard % workers_.size()]->idle->wake();
  }

  /// Completions pending on worker `i`'s CQ (posted, not yet polled).
  void add_cq_outstanding(std::uint32_t i, std::size_t n) noexcept {
    workers_[i]->cq_outstanding.fetch_add(n, std::memory_order_relaxed);
  }

  /// Wakes every worker (e.g. after an endpoint came up passively).
  void wake_all() noexcept {
    for (auto& w : workers_) w->idle->wake();
  }

 private:
  struct group {
    const std::string* path = nullptr;
    detail::slice* head = nullptr;
    detail::slice* tail = nullptr;
  };

  struct worker {
    std::uint32_t index = 0;
    std::thread thread;
    std::atomic<std::size_t> cq_outstanding{0};
    std::vector<group> pending;  ///< slices taken from the shards, not yet posted
    std::optional<typename P::idle> idle;
  };

  static void bind_to_node(int node) noexcept {
    if (node < 0 || numa_available() < 0) return;
    if (numa_run_on_node(node) != 0) TIDE_LOG_DEBUG("numa_run_on_node(" << node << ") failed");
  }

  // Adds a chain taken from a shard to the worker's pending groups.
  static void enqueue(worker& w, detail::slice* s) noexcept {
    while (s != nullptr) {
      detail::slice* next = s->next;
      s->next = nullptr;
      group* g = nullptr;
      for (auto& cand : w.pending)
        if (cand.path == s->peer_path || (cand.head == nullptr && cand.path == nullptr)) {
          g = &cand;
          break;
        }
      if (g == nullptr) {
        // Grows only when a worker talks to a new peer NIC at once (setup-ish).
        w.pending.push_back({});
        g = &w.pending.back();
      }
      if (g->head == nullptr) {
        g->path = s->peer_path;
        g->head = g->tail = s;
      } else {
        g->tail->next = s;
        g->tail = s;
      }
      s = next;
    }
  }

  // Drops the slices of tasks marked to stop (timeout, cancel) before posting.
  static void drop_dead(group& g) noexcept {
    detail::slice** link = &g.head;
    g.tail = nullptr;
    while (*link != nullptr) {
      detail::slice* s = *link;
      if (const errc why = detail::should_drop(*s); why != errc::ok) [[unlikely]] {
        *link = s->next;
        s->next = nullptr;
        detail::retire_slice(*s, why);
        continue;
      }
      g.tail = s;
      link = &s->next;
    }
  }

  // Fails every slice of a group (cold): each goes back to the transport for
  // another path or, past its retry bound, fails its task.
  void fail_group(group& g, errc e) noexcept {
    detail::slice* s = g.head;
    g.head = g.tail = nullptr;
    g.path = nullptr;
    while (s != nullptr) {
      detail::slice* next = s->next;
      s->next = nullptr;
      ctx_.on_slice_failed(*s, e);
      s = next;
    }
  }

  // Posts what it can of every pending group.  Returns true when it did work.
  bool post_pending(worker& w) noexcept {
    bool did = false;
    for (auto& g : w.pending) {
      if (g.head == nullptr) continue;
      drop_dead(g);
      if (g.head == nullptr) {
        g.path = nullptr;
        did = true;
        continue;
      }
      if (!ctx_.active()) [[unlikely]] {
        fail_group(g, errc::context_inactive);
        did = true;
        continue;
      }
      auto ep = ctx_.endpoint_for(*g.path, w.index);
      if (!ep) [[unlikely]] {
        TIDE_LOG_WARN(ctx_.name() << ": no endpoint to " << *g.path << ": " << ep.error().message());
        fail_group(g, ep.error().code);
        did = true;
        continue;
      }
      endpoint& e = **ep;
      if (!e.ready()) {
        const auto st = e.state();
        if (st == endpoint_state::connected_wait_ready_ack) continue;  // the ack is on its way
        if (auto r = ctx_.connect(e); !r) [[unlikely]] {
          ctx_.retire_endpoint(*ep);
          did = true;
          // Evicted under us: not a failure of the path; the next pass makes a new endpoint.
          if (r.error().code == errc::endpoint_closed) continue;
          TIDE_LOG_WARN(ctx_.name() << ": connect to " << *g.path << " failed: " << r.error().message());
          fail_group(g, r.error().code);
          continue;
        }
        if (!e.ready()) continue;
      }
      std::size_t posted = 0;
      std::size_t bytes = 0;
      const errc pe = e.post(g.head, posted, bytes);
      if (posted != 0) {
        did = true;
        add_cq_outstanding(e.cq_index(), posted);
        ctx_.count_posted(posted, bytes);
      }
      if (g.head == nullptr) {
        g.tail = nullptr;
        g.path = nullptr;
      }
      if (pe != errc::ok) [[unlikely]] {
        ctx_.retire_endpoint(*ep);
        did = true;
        if (pe != errc::endpoint_closed) fail_group(g, pe);  // evicted: repost on a new endpoint
      }
    }
    return did;
  }

  // Polls this worker's CQ once.  Returns the number of completions.
  int poll(worker& w) noexcept {
    std::array<ibv_wc, kPollBatch> wcs;
    const int n = ctx_.cq(w.index).poll(wcs);
    if (n <= 0) return 0;
    w.cq_outstanding.fetch_sub(static_cast<std::size_t>(n), std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = wcs[static_cast<std::size_t>(i)];
      auto* s = reinterpret_cast<detail::slice*>(wc.wr_id);
      endpoint* ep = s->ep;
      if (wc.status == IBV_WC_SUCCESS) [[likely]] {
        ep->on_completion(*s);
        detail::retire_slice(*s, errc::ok);
        continue;
      }
      const errc e = verbs::errc_from_wc_status(wc.status);
      if (e != errc::work_request_flushed)
        TIDE_LOG_WARN(ctx_.name() << " -> " << *s->peer_path << ": " << verbs::wc_error(wc, ctx_.name()).message());
      // The QP is in ERR now: retire the endpoint (its other WRs flush) and redo the slice elsewhere.
      ctx_.retire_endpoint_ptr(ep);
      ep->on_completion(*s);
      ctx_.on_slice_failed(*s, e);
    }
    return n;
  }

  // One pass: take the shards' slices, post what can be posted, poll the CQ.
  bool pass(worker& w) noexcept {
    bool did = false;
    for (std::size_t s = w.index; s < kShards; s += workers_.size()) {
      if (detail::slice* chain = shards_[s].take_all()) {
        enqueue(w, chain);
        did = true;
      }
    }
    did |= post_pending(w);
    did |= poll(w) > 0;
    return did;
  }

  void run(worker& w) noexcept {
    bind_to_node(numa_node_);
    while (running_.load(std::memory_order_relaxed)) {
      if (pass(w)) {
        w.idle->on_work();
        continue;
      }
      const bool work_due = w.cq_outstanding.load(std::memory_order_relaxed) != 0 || has_pending(w);
      if (work_due && !detail::kIdleWaitsOnCq<P>) {
        // Completions are on their way; a sleeping strategy would miss them.
        for (int i = 0; i < 64; ++i) detail::cpu_relax();
        std::this_thread::yield();
        continue;
      }
      w.idle->on_empty([&]() noexcept { return pass(w) || !running_.load(std::memory_order_relaxed); });
    }
    drain_on_stop(w);
  }

  static bool has_pending(const worker& w) noexcept {
    for (const auto& g : w.pending)
      if (g.head != nullptr) return true;
    return false;
  }

  void drain_on_stop(worker& w) noexcept {
    for (std::size_t s = w.index; s < kShards; s += workers_.size())
      if (detail::slice* chain = shards_[s].take_all()) enqueue(w, chain);
    for (auto& g : w.pending) {
      for (detail::slice* s = g.head; s != nullptr;) {
        detail::slice* next = s->next;
        detail::retire_slice(*s, errc::endpoint_closed);
        s = next;
      }
      g = {};
    }
    // Completions of WRs still out: bounded wait (the context moves the QPs to ERR first).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (w.cq_outstanding.load(std::memory_order_relaxed) != 0 && std::chrono::steady_clock::now() < until)
      if (poll(w) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  void monitor() noexcept {
    bind_to_node(numa_node_);
    auto last_reclaim = std::chrono::steady_clock::now();
    while (running_.load(std::memory_order_relaxed)) {
      ctx_.process_async_events(100);
      const auto now = std::chrono::steady_clock::now();
      if (now - last_reclaim > std::chrono::milliseconds(200)) {
        ctx_.reclaim_endpoints();
        last_reclaim = now;
      }
    }
  }

  rdma_context<P>& ctx_;
  int numa_node_ = -1;
  std::atomic<bool> running_{false};
  std::array<detail::slice_queue, kShards> shards_;
  std::vector<std::unique_ptr<worker>> workers_;
  std::thread monitor_;
};

}  // namespace tide::rdma
