#pragma once
/// retire_wr: how the data path retires what it posted.  Last step of the
/// flow submit -> plan -> path -> lane -> NIC -> **completion**.
///
/// A posted slice heads a work request; when requests were coalesced the WR
/// also carries "riders", pieces of other tasks that are never posted
/// themselves.  Every place that finishes a posted slice (completion,
/// cancel, drop, final failure) calls retire_wr instead of
/// detail::retire_slice, so riders are retired with their head, the NIC's
/// in-flight bytes are released and the rail learns the outcome.
/// Any thread; lock-free (see detail::retire_slice for the batch roll-up).

#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/detail/stage_pool.hpp>
#include <tide/rdma/plan/nic_load.hpp>
#include <tide/rdma/plan/rail_health.hpp>

#include <chrono>

namespace tide::rdma::detail {

/// Steady-clock nanoseconds (dispatch and completion stamps).
[[nodiscard]] inline std::int64_t steady_now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// Gives up the NIC's in-flight charge of WR `s` (idempotent).  `error`:
/// count it as a failed WR of that NIC.
inline void release_charge(slice& s, bool error) noexcept {
  if (s.charged != nullptr) {
    s.charged->released(s.length, error);
    s.charged = nullptr;
  }
}

/// Retires the WR headed by `s` with outcome `e`: its riders, then `s`.
/// On success the NIC's bandwidth estimate gets a sample and the rail is
/// healthy again.  Nothing of `s` may be touched afterwards.
inline void retire_wr(slice& s, errc e) noexcept {
  if (s.hook != nullptr) [[unlikely]] {
    s.hook->wr_done(s, e);
    return;
  }
  if (s.chunk != nullptr) [[unlikely]] e = unstage(s, e);  // a READ's bytes reach the caller first
  if (e == errc::ok) {
    if (s.charged != nullptr) {
      s.charged->completed(s.length, steady_now_ns());
      s.charged = nullptr;
    }
    if (s.rail != nullptr) s.rail->succeed();
  } else {
    release_charge(s, e != errc::canceled && e != errc::timed_out);
  }
  // Riders first: the head's own retirement may be the batch's last touch.
  for (slice* r = s.rider; r != nullptr;) {
    slice* next = r->rider;
    retire_slice(*r, e);
    r = next;
  }
  s.rider = nullptr;
  if (s.share != 0) {
    s.length = s.share;
    s.share = 0;
  }
  retire_slice(s, e);
}

}  // namespace tide::rdma::detail
