#pragma once
/// The spin phase of an idle strategy (hybrid, spin_event): how long a
/// worker keeps polling after its last useful pass before it may sleep.
/// Not API.  Owned by the worker thread.

#include <tide/detail/sharded_shared_mutex.hpp>

#include <chrono>
#include <cstdint>

namespace tide::policy::detail {

class spin_window {
 public:
  explicit spin_window(std::chrono::nanoseconds length) noexcept : length_(length) {}

  /// A pass found work: the next empty pass opens a new window.
  void reset() noexcept {
    empty_passes_ = 0;
    expired_ = false;
  }

  /// True before the first empty pass of a window: the moment to decide
  /// whether to spin at all.
  [[nodiscard]] bool opening() const noexcept { return empty_passes_ == 0 && !expired_; }

  /// Ends the window now (no spinning until reset()).
  void expire() noexcept { expired_ = true; }

  /// An empty pass: pauses once and returns true while the window lasts;
  /// false from the moment it has expired until reset().  The clock is read
  /// on the first empty pass and then every 64th, so an empty pass mostly
  /// costs one PAUSE (and even a window of 0 spins 64 passes).
  [[nodiscard]] bool spin() noexcept {
    return spin([](std::chrono::nanoseconds) noexcept { return true; });
  }

  /// spin(), and where it reads the clock it also asks
  /// `still_pays(time spun so far)`: false ends the window there.
  template <class StillPays>
  [[nodiscard]] bool spin(StillPays&& still_pays) noexcept {
    if (expired_) return false;
    if (empty_passes_++ == 0) {
      idle_since_ = clock::now();
    } else if ((empty_passes_ & 63) == 0) {
      const auto spun = clock::now() - idle_since_;
      if (spun >= length_ || !still_pays(std::chrono::nanoseconds(spun))) {
        expired_ = true;
        return false;
      }
    }
    tide::detail::cpu_relax();
    return true;
  }

 private:
  using clock = std::chrono::steady_clock;
  std::chrono::nanoseconds length_;
  clock::time_point idle_since_{};
  std::uint64_t empty_passes_ = 0;
  bool expired_ = false;
};

}  // namespace tide::policy::detail
