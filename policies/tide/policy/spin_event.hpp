#pragma once
/// tide::policy::spin_event — spin for a short window after the last useful
/// pass, then sleep on the completion channels like cq_event.

#include <tide/policy/cq_event.hpp>
#include <tide/policy/detail/cpu_headroom.hpp>
#include <tide/policy/detail/spin_window.hpp>
#include <tide/policy/idle.hpp>
#include <tide/result.hpp>

#include <chrono>
#include <cstdint>
#include <string_view>
#include <utility>

namespace tide::policy {

/// The spin catches what comes back within a round trip (a small request's
/// completion, the next request of a caller that submits right after
/// wait()), so one-request batches see a spinning worker.  Past the
/// window the worker sleeps until a completion or wake(), so a worker
/// whose WRs take milliseconds (large slices, slow links) leaves the CPU to
/// others: on Soft-RoCE, to the kernel threads that move the bytes.
/// hybrid spins 100 ms and its sleep ignores completions, so a streaming
/// worker never sleeps; cq_event sleeps at once and pays a wake-up on
/// every small request.
///
/// The spin only pays while a CPU is free for it: with `adapt` (the
/// default) a window opens only while the host has no more runnable
/// threads than CPUs (detail::cpu_headroom: /proc/loadavg, sampled at most
/// every 2 ms by one thread of the process), else the worker sleeps at once
/// as cq_event's does.  A window that has run past its first 50 us also
/// ends as soon as the host has more runnable threads than CPUs (a sample
/// at most 50 us old): the scheduler lets a spinner keep its CPU while the
/// thread it has just woken waits.  On a host whose every CPU is busy a
/// spinning worker would take the time slice of the work that completes
/// its requests and then wait for its own turn; a sleeping one is woken by
/// the completion and, having slept, runs at once.  The thread waiting for
/// the batch keeps its own short spin (engine_config::wait_spin): it is the
/// caller's, running already, and catching the completion awake saves the
/// second wake-up of the request (measured: bench/latency --load,
/// docs/performance.md).
class spin_event {
 public:
  static constexpr std::string_view kName = "spin_event";
  /// It sleeps on the completion channels of the attached CQs.
  static constexpr bool wakes_on_completion = true;

  struct config {
    /// Busy period after the last useful pass: a few wire round trips.  The
    /// clock is checked every 64 empty passes.  >= 0.
    std::chrono::nanoseconds spin = std::chrono::microseconds(200);
    /// cq_event's: longest single sleep (> 0) and CQ events acked per call (>= 1).
    std::chrono::milliseconds max_sleep{1000};
    unsigned ack_batch = 64;
    /// Spin only while the host has a CPU free for it (see above); false:
    /// always spin the window.
    bool adapt = true;
  };

  /// Errors: errc::config_invalid (spin < 0, or cq_event's), cq_event's
  /// errc::resource_exhausted.
  [[nodiscard]] static result<spin_event> create(const config& cfg) {
    if (cfg.spin.count() < 0) return fail(errc::config_invalid, "spin_event.spin must be >= 0");
    auto sleeper = cq_event::create({.max_sleep = cfg.max_sleep, .ack_batch = cfg.ack_batch});
    if (!sleeper) return fail(sleeper.error());
    return spin_event(cfg.spin, cfg.adapt, std::move(*sleeper));
  }

  /// create(config{}): the defaults.
  [[nodiscard]] static result<spin_event> create() { return create(config{}); }

  /// Only before any thread uses `o`.
  spin_event(spin_event&& o) noexcept
      : window_(std::move(o.window_)), adapt_(o.adapt_), sleeper_(std::move(o.sleeper_)) {}
  spin_event& operator=(spin_event&&) = delete;

  /// As cq_event::attach / detach.
  status attach(ibv_cq* cq, ibv_comp_channel* channel) { return sleeper_.attach(cq, channel); }
  void detach(ibv_cq* cq) noexcept { sleeper_.detach(cq); }

  void on_work() noexcept { window_.reset(); }

  template <class Repass>
  void on_empty(Repass&& repass) noexcept {
    if (adapt_ && window_.opening() && !detail::cpu_headroom::spin_pays()) window_.expire();
    if (window_.spin([this](std::chrono::nanoseconds spun) noexcept { return still_pays(spun); })) return;
    sleeper_.on_empty(std::forward<Repass>(repass));
  }

  /// Any thread, after publishing work: one relaxed load unless asleep.
  void wake() noexcept { sleeper_.wake(); }

  /// Sleeps entered and CQ events consumed so far (any thread may read).
  [[nodiscard]] std::uint64_t sleeps() const noexcept { return sleeper_.sleeps(); }
  [[nodiscard]] std::uint64_t cq_events() const noexcept { return sleeper_.cq_events(); }
  [[nodiscard]] static bool exact_wakeups() noexcept { return cq_event::exact_wakeups(); }

 private:
  spin_event(std::chrono::nanoseconds spin, bool adapt, cq_event sleeper) noexcept
      : window_(spin), adapt_(adapt), sleeper_(std::move(sleeper)) {}

  // Past the first kRecheckAfter of a window (a small request's completion
  // comes within it, so its wait costs no sample), the window ends as soon
  // as the host has more runnable threads than CPUs: someone is waiting for
  // a CPU now, often the thread this worker has just woken (a notification's
  // reader, a batch's waiter), and the scheduler lets a spinner keep its
  // CPU until its window ends (measured: bench/notify-latency).
  [[nodiscard]] bool still_pays(std::chrono::nanoseconds spun) const noexcept {
    return !adapt_ || spun < kRecheckAfter || !detail::cpu_headroom::crowded_now();
  }

  static constexpr std::chrono::microseconds kRecheckAfter{50};

  detail::spin_window window_;
  bool adapt_;
  cq_event sleeper_;
};

}  // namespace tide::policy
