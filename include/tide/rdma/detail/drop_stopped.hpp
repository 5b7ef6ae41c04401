#pragma once
/// drop_stopped: how a lane drops queued slices whose task was marked to stop
/// (timeout, cancel) before it posts them.  A walk of the whole queue on
/// every pass made a big batch to one peer O(n^2) on the lane (review turn 3,
/// finding 12): a post takes at most a few dozen WRs, so only that window is
/// looked at, and the rest of the queue when some task was marked since the
/// lane's last sweep.  Lane thread only (the chain is the lane's).

#include <tide/rdma/detail/retire_wr.hpp>

#include <cstddef>

namespace tide::rdma::detail {

/// Retires the slices of stopped tasks among the first `window` live slices
/// of the chain `head` .. `tail` and keeps the chain whole.  Returns how many
/// slices it looked at (kept and dropped), the work the lane pays.
inline std::size_t drop_stopped(slice*& head, slice*& tail, std::size_t window) noexcept {
  slice** link = &head;
  slice* last_kept = nullptr;
  std::size_t looked = 0;
  for (std::size_t kept = 0; *link != nullptr && kept < window; ++looked) {
    slice* s = *link;
    if (const errc why = should_drop(*s); why != errc::ok) [[unlikely]] {
      *link = s->next;
      s->next = nullptr;
      retire_wr(*s, why);
      continue;
    }
    last_kept = s;
    link = &s->next;
    ++kept;
  }
  if (*link == nullptr) tail = last_kept;  // walked to the end (the old tail may be gone)
  return looked;
}

}  // namespace tide::rdma::detail
