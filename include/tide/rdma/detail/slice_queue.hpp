#pragma once
/// A multi-producer, single-consumer intrusive queue of slices: producers
/// push a whole chain with one CAS, the consumer takes everything with one
/// exchange.  No allocation, no lock (a Treiber stack drained in one go).
/// Not API.

#include <tide/rdma/detail/batch.hpp>

#include <atomic>

namespace tide::rdma::detail {

class slice_queue {
 public:
  /// Pushes the chain first..last (linked by next; last->next is overwritten).
  /// Thread-safe and lock-free; any number of producers.
  void push(slice* first, slice* last) noexcept {
    slice* head = head_.load(std::memory_order_relaxed);
    do {
      last->next = head;
      // release: the consumer's acquire exchange sees the slices' fields.
    } while (!head_.compare_exchange_weak(head, first, std::memory_order_release, std::memory_order_relaxed));
  }

  /// Takes every queued slice as a chain (nullptr when empty).  Order is
  /// not kept: one-sided READ/WRITE slices of a batch need none.  One
  /// consumer thread at a time; one atomic exchange.
  [[nodiscard]] slice* take_all() noexcept {
    if (head_.load(std::memory_order_relaxed) == nullptr) return nullptr;
    return head_.exchange(nullptr, std::memory_order_acquire);  // pairs with push's release
  }

  [[nodiscard]] bool empty() const noexcept { return head_.load(std::memory_order_relaxed) == nullptr; }

 private:
  std::atomic<slice*> head_{nullptr};
};

}  // namespace tide::rdma::detail
