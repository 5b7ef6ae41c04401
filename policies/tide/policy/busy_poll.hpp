#pragma once
/// tide::policy::busy_poll — never sleep.

#include <tide/detail/sharded_shared_mutex.hpp>
#include <tide/policy/idle.hpp>
#include <tide/result.hpp>

#include <string_view>

namespace tide::policy {

/// Spins: an empty pass costs one PAUSE and the worker polls again at
/// once.  Lowest latency and a full core per worker, idle or not.  Choose
/// it when cores are dedicated and the NIC is real hardware; under
/// Soft-RoCE the spinning steals the CPU that rxe itself needs.
class busy_poll {
 public:
  static constexpr std::string_view kName = "busy_poll";
  /// Never sleeps, so there is nothing for a completion to wake.
  static constexpr bool wakes_on_completion = false;
  struct config {};

  [[nodiscard]] static result<busy_poll> create(const config& /*cfg*/) { return busy_poll{}; }

  /// create(config{}): the defaults.
  [[nodiscard]] static result<busy_poll> create() { return create(config{}); }

  status attach(ibv_cq* /*cq*/, ibv_comp_channel* /*channel*/) { return {}; }
  void detach(ibv_cq* /*cq*/) noexcept {}
  void on_work() noexcept {}
  template <class Repass>
  void on_empty(Repass&& /*repass*/) noexcept {
    tide::detail::cpu_relax();
  }
  /// Nothing to wake: costs nothing.
  void wake() noexcept {}
  /// Always true: a busy-polling worker never misses work.
  [[nodiscard]] static bool exact_wakeups() noexcept { return true; }
};

}  // namespace tide::policy
