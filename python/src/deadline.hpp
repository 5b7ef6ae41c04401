#pragma once
// Timeouts as Python passes them (float seconds) and the sliced waits made
// with them.  Every timeout argument goes through seconds_argument first, so
// a NaN or an infinity is a ValueError naming the argument and never reaches
// a float-to-integer conversion (undefined behaviour).

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

namespace tide::py {

/// Waits from Python run in slices of at most this, with a signal check
/// (Ctrl-C) between them.
constexpr std::chrono::milliseconds kWaitSlice{100};

/// `seconds` unchanged when it is finite; else ValueError naming `what`.
/// With the GIL (it raises).
inline double seconds_argument(double seconds, const char* what) {
  if (!std::isfinite(seconds))
    throw pybind11::value_error(std::string(what) + " must be a finite number of seconds, got " +
                                pybind11::repr(pybind11::float_(seconds)).cast<std::string>());
  return seconds;
}

/// The time `seconds` (finite: seconds_argument) from now, clamped to
/// 0 .. 1e9 s.
inline std::chrono::steady_clock::time_point deadline_in(double seconds) noexcept {
  using namespace std::chrono;
  return steady_clock::now() + duration_cast<steady_clock::duration>(duration<double>(std::clamp(seconds, 0.0, 1e9)));
}

/// No deadline (a wait for ever, still in slices).
constexpr std::chrono::steady_clock::time_point kNever = std::chrono::steady_clock::time_point::max();

/// The next slice of a wait until `deadline`: 0 .. kWaitSlice.
inline std::chrono::milliseconds next_slice(std::chrono::steady_clock::time_point deadline) noexcept {
  using namespace std::chrono;
  if (deadline == kNever) return kWaitSlice;
  return std::clamp(duration_cast<milliseconds>(deadline - steady_clock::now()), milliseconds(0), kWaitSlice);
}

}  // namespace tide::py
