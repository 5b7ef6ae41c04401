#pragma once
/// tide::policy::hybrid — spin for a while, then sleep until woken or a cap
/// (Mooncake's transfer worker: 100 ms, then condition-variable waits of 1 s).

#include <tide/policy/detail/spin_window.hpp>
#include <tide/policy/detail/wake_gate.hpp>
#include <tide/policy/idle.hpp>
#include <tide/result.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace tide::policy {

/// Spins for `spin` after the last pass that found work, then sleeps on a
/// futex until wake() or `max_sleep`, and keeps sleeping (pass, sleep,
/// pass, ...) until a pass finds work.  Completions that arrive while it
/// sleeps wait for the next wake() or the cap: with nothing else submitted,
/// a completion can sit in the CQ for up to max_sleep (Mooncake's
/// behaviour; cq_event has no such gap).
class hybrid {
 public:
  static constexpr std::string_view kName = "hybrid";
  /// Completions do not wake it (only wake() and the cap do).
  static constexpr bool wakes_on_completion = false;

  struct config {
    /// Busy period after the last useful pass.  Shorter saves CPU between
    /// bursts; longer keeps latency low for bursts closer than this.  The
    /// clock is checked every 64 empty passes, so even 0 spins that long.
    std::chrono::nanoseconds spin = std::chrono::milliseconds(100);
    /// Longest single sleep.  Bounds how long a completion (which does not
    /// wake this strategy) may wait when nothing else arrives.  > 0.
    std::chrono::nanoseconds max_sleep = std::chrono::seconds(1);
  };

  /// Errors: errc::config_invalid when spin < 0 or max_sleep <= 0.
  [[nodiscard]] static result<hybrid> create(const config& cfg) {
    if (cfg.spin.count() < 0) return fail(errc::config_invalid, "hybrid.spin must be >= 0");
    if (cfg.max_sleep.count() <= 0) {
      return fail(errc::config_invalid,
                  "hybrid.max_sleep must be > 0 (got " + std::to_string(cfg.max_sleep.count()) + " ns)");
    }
    return hybrid{cfg};
  }

  /// create(config{}): the defaults.
  [[nodiscard]] static result<hybrid> create() { return create(config{}); }

  /// Only before any thread uses `o`.
  hybrid(hybrid&& o) noexcept : cfg_(o.cfg_), window_(o.cfg_.spin) {}
  hybrid& operator=(hybrid&&) = delete;

  status attach(ibv_cq* /*cq*/, ibv_comp_channel* /*channel*/) { return {}; }
  void detach(ibv_cq* /*cq*/) noexcept {}

  void on_work() noexcept { window_.reset(); }

  template <class Repass>
  void on_empty(Repass&& repass) noexcept {
    if (window_.spin()) return;
    const std::uint32_t seen = event_.prepare();
    const bool exact = gate_.announce();
    if (repass()) {
      gate_.withdraw();
      on_work();
      return;
    }
    sleeps_.store(sleeps_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    event_.wait(seen, exact ? cfg_.max_sleep : std::min<std::chrono::nanoseconds>(cfg_.max_sleep, detail::kInexactSleepCap));
    gate_.withdraw();
  }

  /// Any thread, after publishing work.  One relaxed load when the worker
  /// is not asleep; else a futex wake.
  void wake() noexcept {
    if (gate_.sleeper_present()) [[unlikely]] event_.signal();
  }

  /// Sleeps entered so far (any thread may read it).
  [[nodiscard]] std::uint64_t sleeps() const noexcept { return sleeps_.load(std::memory_order_relaxed); }
  /// False where membarrier is unavailable and sleeps are capped at 1 ms.
  [[nodiscard]] static bool exact_wakeups() noexcept { return detail::heavy_barrier_available(); }

 private:
  explicit hybrid(const config& cfg) noexcept : cfg_(cfg), window_(cfg.spin) {}

  config cfg_;
  detail::spin_window window_;
  std::atomic<std::uint64_t> sleeps_{0};
  alignas(64) detail::wake_gate gate_;
  detail::futex_event event_;
};

}  // namespace tide::policy
