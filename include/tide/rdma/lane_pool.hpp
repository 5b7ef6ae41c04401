#pragma once
/// rdma::lane_pool<P> — the lanes of one rdma_context plus its monitor
/// thread.  dispatch() decides which lane posts a slice; send_*() deliver
/// control messages to the lanes that own the QPs concerned.
///
/// Lane choice: a chain of slices for one context is cut into runs, one
/// run per lane, starting at the lane P::shard_hash picks for the first
/// slice's (target segment, peer device, peer NIC path).  A one-slice
/// request of a peer therefore always goes to the same lane (latency: no
/// thread hop but the submit -> lane one); a many-slice request uses every
/// lane's QP.
///
/// Threads: dispatch / send_* / wake_all from any thread; start / stop from
/// the owner (rdma_context); the monitor thread reads async events and
/// reclaims drained endpoints.

#include <tide/detail/log.hpp>
#include <tide/rdma/detail/policy_adapt.hpp>
#include <tide/rdma/lane.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace tide::rdma {

template <class P>
class lane_pool {
  static_assert(check_policy_set<P>());

 public:
  static constexpr std::size_t kShards = 8;  ///< shard_hash's modulus (Mooncake's kShardCount)

  explicit lane_pool(rdma_context<P>& ctx) : ctx_(ctx) {}
  lane_pool(const lane_pool&) = delete;
  lane_pool& operator=(const lane_pool&) = delete;
  ~lane_pool() { stop(); }

  /// Starts `lanes` lanes and the monitor, bound to `numa_node` (-1: not
  /// bound); the lanes run on `lane_cpus` instead when it names any.
  /// Errors: invalid_argument (0 lanes, a shard count the shard hash
  /// refuses), config_invalid (lane_cpus refused), the idle strategy's
  /// errors.  Setup path; once.
  [[nodiscard]] status start(std::size_t lanes, int numa_node, const std::vector<int>& lane_cpus = {}) {
    if (lanes == 0) return fail(errc::invalid_argument, "num_qp_per_ep (lanes per context) must be >= 1");
    if (auto r = validate_shard_count<typename P::shard_hash>(kShards); !r) return r;
    numa_node_ = numa_node;
    lanes_.reserve(lanes);
    for (std::size_t i = 0; i < lanes; ++i) lanes_.push_back(std::make_unique<lane<P>>(ctx_, static_cast<std::uint32_t>(i)));
    for (auto& l : lanes_)
      if (auto r = l->start(numa_node, lane_cpus); !r) return r;
    running_.store(true, std::memory_order_release);
    monitor_ = std::thread([this] { monitor(); });
    return {};
  }

  /// Stops the monitor, then every lane (each drains, bounded).  Idempotent.
  void stop() noexcept {
    running_.store(false, std::memory_order_release);
    if (monitor_.joinable()) monitor_.join();
    for (auto& l : lanes_) l->stop();
  }

  /// Frees the lanes (after stop and after the endpoints are gone).
  void clear() noexcept { lanes_.clear(); }

  [[nodiscard]] std::size_t size() const noexcept { return lanes_.size(); }
  [[nodiscard]] lane<P>& at(std::size_t i) noexcept { return *lanes_[i]; }

  /// Hands the chain first..last (every slice for this context; any peers)
  /// to `width` of the lanes (all of them when width >= size()), from the
  /// shard's lane on.  A chain narrower than the pool starts one lane further
  /// each time, so concurrent submits to one peer still share every lane.
  /// Hot path, any thread: a walk of the chain, one push and one wake per
  /// lane used.
  void dispatch(detail::slice* first, detail::slice* last, std::size_t width) noexcept {
    const std::size_t lanes = lanes_.size();
    const std::size_t n = std::clamp<std::size_t>(width, 1, lanes);
    const detail::task_state& t = *first->task;
    std::size_t start = detail::shard_index<P>(t.target, first->peer_device, *first->peer_path, kShards);
    if (n < lanes && first != last) start += next_start_.fetch_add(1, std::memory_order_relaxed);
    start %= lanes;
    if (n == 1 || first == last) {
      // A notification goes out as a SEND on QP 0, lane 0's: its transfer
      // there retires on the lane that sends it, with no hand-off (and no
      // sleeping lane to wake) between the data and the message.
      if (t.group != nullptr) start = 0;
      lanes_[start]->submit(first, last);
      return;
    }
    std::size_t count = 0;
    for (detail::slice* s = first; s != nullptr; s = s == last ? nullptr : s->next) ++count;
    const std::size_t per = (count + n - 1) / n;
    detail::slice* s = first;
    for (std::size_t k = 0; s != nullptr; ++k) {
      detail::slice* run_first = s;
      detail::slice* run_last = s;
      for (std::size_t j = 1; j < per && run_last != last; ++j) run_last = run_last->next;
      s = run_last == last ? nullptr : run_last->next;
      lanes_[(start + k) % lanes]->submit(run_first, run_last);
    }
  }

  /// "QP to ERR" for `e` on every lane (endpoint::on_evict).  Any thread.
  void send_fail(endpoint& e) {
    for (auto& l : lanes_) {
      e.hold();
      l->send(lane_message{lane_message::kind::fail_qp, &e, nullptr, nullptr});
    }
  }

  /// "Connect your QP of `e` along `route`" to every lane; returns the latch
  /// their answers arrive on.  Setup threads.
  [[nodiscard]] std::shared_ptr<lane_latch> send_connect(endpoint& e, std::shared_ptr<const peer_route> route) {
    auto latch = std::make_shared<lane_latch>(lanes_.size());
    for (auto& l : lanes_) {
      e.hold();
      l->send(lane_message{lane_message::kind::connect, &e, route, latch});
    }
    return latch;
  }

  /// IBV_EVENT_CQ_ERR for `cq`: to the lane that owns it.  Monitor thread.
  void send_cq_error(const ibv_cq* cq) {
    for (auto& l : lanes_)
      if (l->native_cq() == cq) l->send(lane_message{lane_message::kind::cq_error, nullptr, nullptr, nullptr});
  }

  /// Wakes every lane (an endpoint came up, a connect failed).  Any thread.
  void wake_all() noexcept {
    for (auto& l : lanes_) l->wake();
  }

 private:
  void monitor() noexcept {
    if (numa_node_ >= 0 && numa_available() >= 0) (void)numa_run_on_node(numa_node_);
    auto last_reclaim = std::chrono::steady_clock::now();
    while (running_.load(std::memory_order_acquire)) {
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
  std::atomic<std::uint32_t> next_start_{0};  ///< rotates narrow dispatches over the lanes
  std::vector<std::unique_ptr<lane<P>>> lanes_;
  std::thread monitor_;
};

}  // namespace tide::rdma
