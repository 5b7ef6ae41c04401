#pragma once
/// What other threads hand a lane besides slices (rdma/lane.hpp): control
/// messages (connect, fail a QP, a CQ error) and the latch a setup thread
/// waits on for the lanes' answers to a connect.  Not API.

#include <tide/errc.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/result.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace tide::rdma {

/// Collects the lanes' answers to a connect message (a setup thread waits,
/// bounded).  Shared by the waiter and the lanes (shared_ptr), so a waiter
/// that timed out leaves nothing dangling.
struct lane_latch {
  explicit lane_latch(std::size_t n) : remaining(n) {}
  void arrive(const status& s) {
    std::lock_guard lock(mu);
    if (!s && first_error.code == errc::ok) first_error = s.error();
    if (--remaining == 0) cv.notify_all();
  }
  /// Waits until every lane answered or `timeout`.  Setup thread.
  [[nodiscard]] status wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return remaining == 0; }))
      return fail(errc::qp_state_error, "lanes did not answer within " + std::to_string(timeout.count()) + " ms");
    if (first_error.code != errc::ok) return fail(first_error);
    return {};
  }
  std::mutex mu;
  std::condition_variable cv;
  std::size_t remaining;
  error first_error{errc::ok, {}};
};

/// A control message for one lane.  `ep` was hold()-ed by the sender; the
/// lane release()s it after handling the message.
struct lane_message {
  enum class kind : std::uint8_t { connect, fail_qp, cq_error };
  kind what = kind::fail_qp;
  endpoint* ep = nullptr;
  std::shared_ptr<const peer_route> route;  ///< connect
  std::shared_ptr<lane_latch> latch;        ///< connect
};

}  // namespace tide::rdma
