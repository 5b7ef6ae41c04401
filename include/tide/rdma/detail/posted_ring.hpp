#pragma once
/// posted_ring — the slices one QP has handed to the NIC, in post order.
/// Not API.
///
/// Owner: the lane that owns the QP; only that lane's thread touches a ring
/// (push when it posts, pop when it polls a completion of that QP).  No
/// atomics: single thread.  The storage is allocated on first use by that
/// lane, so it lands on the lane's NUMA node (first touch).
///
/// Why a ring: with selective signaling most WRs raise no completion; RC
/// completes the WRs of one send queue in order, so a completion for the
/// slice at position p also completes every unsignaled slice before it.

#include <tide/rdma/detail/batch.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tide::rdma::detail {

class posted_ring {
 public:
  /// Sizes the ring for `depth` WRs (rounded up to a power of two).  Lane thread.
  void reserve(std::uint32_t depth) {
    if (cap_ != 0) return;
    cap_ = std::bit_ceil(std::max<std::uint32_t>(depth, 2));
    buf_ = std::make_unique<slice*[]>(cap_);
  }

  [[nodiscard]] std::uint32_t size() const noexcept { return tail_ - head_; }
  [[nodiscard]] bool empty() const noexcept { return tail_ == head_; }

  /// Appends a posted slice.  Requires: size() < the reserved depth.
  void push(slice* s) noexcept { buf_[tail_++ & (cap_ - 1)] = s; }
  /// Removes the last `n` pushes (a post that the device refused).
  void unpush(std::uint32_t n) noexcept { tail_ -= n; }
  [[nodiscard]] slice* front() const noexcept { return buf_[head_ & (cap_ - 1)]; }
  /// The k-th slice from the front (k < size()).
  [[nodiscard]] slice* at(std::uint32_t k) const noexcept { return buf_[(head_ + k) & (cap_ - 1)]; }
  slice* pop() noexcept { return buf_[head_++ & (cap_ - 1)]; }

 private:
  std::unique_ptr<slice*[]> buf_;
  std::uint32_t cap_ = 0;
  std::uint32_t head_ = 0;  // wraps: only the difference matters
  std::uint32_t tail_ = 0;
};

}  // namespace tide::rdma::detail
