#pragma once
/// tide::policy::cq_event — sleep in the kernel until a completion or a
/// wake-up arrives (the completion-channel mode Mooncake never enabled).

#include <tide/policy/detail/wake_gate.hpp>
#include <tide/policy/idle.hpp>
#include <tide/result.hpp>

#include <infiniband/verbs.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tide::policy {

/// On an empty pass: arm every attached CQ that is not armed
/// (ibv_req_notify_cq, next completion of any kind), announce the sleep,
/// re-poll once (repass), then epoll_wait on the completion channels' fds
/// and an eventfd that wake() writes, for at most max_sleep.  Events read
/// with ibv_get_cq_event are acknowledged in batches of ack_batch
/// (ibv_ack_cq_events takes a mutex in libibverbs), and all at detach().
/// An idle worker uses no CPU; a wake-up costs a few system calls (about
/// 5-20 us), so bursts of small transfers pay latency that busy_poll
/// does not.  Without any attached CQ it waits on the eventfd alone.
class cq_event {
 public:
  static constexpr std::string_view kName = "cq_event";
  /// epoll_wait returns on an event of any armed, attached CQ.
  static constexpr bool wakes_on_completion = true;

  struct config {
    /// Longest single sleep (a safety net; wake-ups do not depend on it).  > 0.
    std::chrono::milliseconds max_sleep{1000};
    /// CQ events acknowledged per ibv_ack_cq_events call.  >= 1.
    unsigned ack_batch = 64;
  };

  /// Makes the epoll set and the wake-up eventfd.
  /// Errors: errc::config_invalid (max_sleep <= 0, ack_batch == 0);
  /// errc::resource_exhausted when an fd cannot be created (errno text).
  [[nodiscard]] static result<cq_event> create(const config& cfg) {
    if (cfg.max_sleep.count() <= 0) return fail(errc::config_invalid, "cq_event.max_sleep must be > 0 ms");
    if (cfg.ack_batch == 0) return fail(errc::config_invalid, "cq_event.ack_batch must be >= 1");
    cq_event ev(cfg);
    ev.epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (ev.epfd_ < 0) return fail(errc::resource_exhausted, std::string("cq_event: epoll_create1: ") + std::strerror(errno));
    ev.wakefd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ev.wakefd_ < 0) return fail(errc::resource_exhausted, std::string("cq_event: eventfd: ") + std::strerror(errno));
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = kWakeTag;
    if (::epoll_ctl(ev.epfd_, EPOLL_CTL_ADD, ev.wakefd_, &e) != 0) {
      return fail(errc::resource_exhausted, std::string("cq_event: epoll_ctl(eventfd): ") + std::strerror(errno));
    }
    return ev;
  }

  /// create(config{}): the defaults.
  [[nodiscard]] static result<cq_event> create() { return create(config{}); }

  /// Only before any thread uses `o`.
  cq_event(cq_event&& o) noexcept
      : cfg_(o.cfg_),
        epfd_(std::exchange(o.epfd_, -1)),
        wakefd_(std::exchange(o.wakefd_, -1)),
        cqs_(std::move(o.cqs_)),
        channels_(std::move(o.channels_)) {}
  cq_event& operator=(cq_event&&) = delete;

  /// Acknowledges every event still held, closes the fds.  The CQs stay
  /// the caller's.
  ~cq_event() {
    for (auto& c : cqs_) ack(c);
    if (wakefd_ >= 0) ::close(wakefd_);
    if (epfd_ >= 0) ::close(epfd_);
  }

  /// Adds `cq`, whose events go to `channel` (the channel it was created
  /// with).  Makes the channel's fd non-blocking.  Several CQs may share one
  /// channel; events that arrive on it for CQs not attached here are
  /// acknowledged and dropped.  Worker thread, before the loop.
  /// Errors: errc::invalid_argument (null cq or channel, or a cq created
  /// with another channel or none); errc::already_exists (cq attached twice);
  /// errc::resource_exhausted (fcntl/epoll_ctl failed, errno text).
  status attach(ibv_cq* cq, ibv_comp_channel* channel) {
    if (cq == nullptr) return fail(errc::invalid_argument, "cq_event.attach: cq is null");
    if (channel == nullptr) {
      return fail(errc::invalid_argument,
                  "cq_event.attach: the CQ has no completion channel; create it with one "
                  "(ibv_create_comp_channel) to use the cq_event idle strategy");
    }
    if (cq->channel != channel) {
      return fail(errc::invalid_argument,
                  "cq_event.attach: the CQ was created with another completion channel, or none");
    }
    for (const auto& c : cqs_) {
      if (c.cq == cq) return fail(errc::already_exists, "cq_event.attach: this CQ is already attached");
    }
    if (std::find(channels_.begin(), channels_.end(), channel) == channels_.end()) {
      const int flags = ::fcntl(channel->fd, F_GETFL);
      if (flags < 0 || ::fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
        return fail(errc::resource_exhausted, std::string("cq_event.attach: fcntl(O_NONBLOCK): ") + std::strerror(errno));
      }
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u64 = channels_.size();
      if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, channel->fd, &e) != 0) {
        return fail(errc::resource_exhausted, std::string("cq_event.attach: epoll_ctl: ") + std::strerror(errno));
      }
      channels_.push_back(channel);
    }
    cqs_.push_back(attached{cq, false, 0});
    return {};
  }

  /// Acknowledges the events held for `cq` and forgets it; call before
  /// ibv_destroy_cq (which waits for every event to be acknowledged).
  /// The channel stays in the epoll set.  Unknown cq: no effect.
  void detach(ibv_cq* cq) noexcept {
    auto it = std::find_if(cqs_.begin(), cqs_.end(), [&](const attached& c) { return c.cq == cq; });
    if (it == cqs_.end()) return;
    ack(*it);
    cqs_.erase(it);
  }

  void on_work() noexcept {}

  template <class Repass>
  void on_empty(Repass&& repass) noexcept {
    for (auto& c : cqs_) {
      // A notification stays armed until it fires, so only CQs whose event
      // we consumed need arming again.  A failure leaves it unarmed: the
      // sleep cap then bounds the delay, and the next empty pass retries.
      if (!c.armed) c.armed = ::ibv_req_notify_cq(c.cq, 0) == 0;
    }
    const bool exact = gate_.announce();
    // Completions that landed before the arm raise no event: poll once more.
    if (repass()) {
      gate_.withdraw();
      return;
    }
    const bool all_armed = std::all_of(cqs_.begin(), cqs_.end(), [](const attached& c) { return c.armed; });
    const auto cap = exact && all_armed ? cfg_.max_sleep : std::min(cfg_.max_sleep, detail::kInexactSleepCap);
    epoll_event evs[8];
    sleeps_.store(sleeps_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const int n = ::epoll_wait(epfd_, evs, 8, static_cast<int>(cap.count()));
    gate_.withdraw();
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.u64 == kWakeTag) {
        std::uint64_t count = 0;
        [[maybe_unused]] const auto r = ::read(wakefd_, &count, sizeof count);
      } else {
        drain_channel(channels_[evs[i].data.u64]);
      }
    }
  }

  /// Any thread, after publishing work.  One relaxed load when the worker
  /// is not asleep; else one eventfd write.
  void wake() noexcept {
    if (gate_.sleeper_present()) [[unlikely]] {
      const std::uint64_t one = 1;
      [[maybe_unused]] const auto r = ::write(wakefd_, &one, sizeof one);
    }
  }

  /// Sleeps entered and CQ events consumed so far (any thread may read).
  [[nodiscard]] std::uint64_t sleeps() const noexcept { return sleeps_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t cq_events() const noexcept { return events_.load(std::memory_order_relaxed); }
  /// False where membarrier is unavailable and sleeps are capped at 1 ms.
  [[nodiscard]] static bool exact_wakeups() noexcept { return detail::heavy_barrier_available(); }

 private:
  static constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};

  struct attached {
    ibv_cq* cq;
    bool armed;
    unsigned unacked;
  };

  explicit cq_event(const config& cfg) noexcept : cfg_(cfg) {}

  static void ack(attached& c) noexcept {
    if (c.unacked != 0) ::ibv_ack_cq_events(c.cq, c.unacked);
    c.unacked = 0;
  }

  void drain_channel(ibv_comp_channel* channel) noexcept {
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    // Non-blocking fd: loops until EAGAIN.
    while (::ibv_get_cq_event(channel, &cq, &cq_context) == 0) {
      events_.store(events_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      auto it = std::find_if(cqs_.begin(), cqs_.end(), [&](const attached& c) { return c.cq == cq; });
      if (it == cqs_.end()) {
        ::ibv_ack_cq_events(cq, 1);  // a CQ on a shared channel that is not ours
        continue;
      }
      it->armed = false;
      if (++it->unacked >= cfg_.ack_batch) ack(*it);
    }
  }

  config cfg_;
  int epfd_ = -1;
  int wakefd_ = -1;
  std::vector<attached> cqs_;
  std::vector<ibv_comp_channel*> channels_;
  std::atomic<std::uint64_t> sleeps_{0};
  std::atomic<std::uint64_t> events_{0};
  alignas(64) detail::wake_gate gate_;
};

}  // namespace tide::policy
