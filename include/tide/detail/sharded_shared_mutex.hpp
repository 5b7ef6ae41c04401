#pragma once
/// tide::detail::sharded_shared_mutex — a reader-writer lock whose readers
/// touch only their own cache line.
///
/// std::shared_mutex (and Mooncake's RWSpinlock) make every reader do an
/// atomic read-modify-write on one shared word, so two threads that only
/// read still bounce that cache line between cores.  Here each reader
/// increments a counter in one of kSlots padded slots (chosen once per
/// thread), and a writer raises a flag and waits until every slot is zero.
/// Readers are cheap and scale; writers pay a scan of kSlots lines, which
/// suits the endpoint store (finds on every slice, inserts on a connect).
///
/// Not API: used by tide::endpoint_store.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace tide::detail {

/// One pause in a spin loop (PAUSE on x86, YIELD on AArch64).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// The slot a thread uses in every sharded_shared_mutex; assigned round
/// robin on first use so that the first kSlots threads never share one.
inline std::size_t this_thread_slot(std::size_t slots) noexcept {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine % slots;
}

class sharded_shared_mutex {
 public:
  static constexpr std::size_t kSlots = 32;

  sharded_shared_mutex() = default;
  sharded_shared_mutex(const sharded_shared_mutex&) = delete;
  sharded_shared_mutex& operator=(const sharded_shared_mutex&) = delete;

  /// Enters a shared section; returns the slot to hand to unlock_shared.
  /// Waits while a writer holds or is acquiring the lock (writers are
  /// preferred so that an insert is never starved by a stream of finds).
  /// Cost without a writer: one uncontended RMW on this thread's own line.
  [[nodiscard]] std::size_t lock_shared() noexcept {
    const std::size_t s = this_thread_slot(kSlots);
    for (;;) {
      // seq_cst RMW then seq_cst load, against the writer's seq_cst store
      // of writer_ then seq_cst loads of the slots (store-buffer pattern):
      // either this reader sees the flag or the writer sees this count.
      slots_[s].readers.fetch_add(1, std::memory_order_seq_cst);
      if (!writer_.load(std::memory_order_seq_cst)) [[likely]] return s;
      slots_[s].readers.fetch_sub(1, std::memory_order_release);
      wait_writer_gone();
    }
  }

  /// Leaves the shared section entered by lock_shared (same thread).
  void unlock_shared(std::size_t slot) noexcept {
    // Release pairs with the writer's acquire load of this slot: everything
    // the reader did happens before the writer's critical section.
    slots_[slot].readers.fetch_sub(1, std::memory_order_release);
  }

  /// Enters the exclusive section: serialises with other writers, then
  /// waits for every reader inside to leave (readers never block inside).
  void lock() noexcept {
    unsigned spins = 0;
    // The exchange is both the writers' mutex and the seq_cst store of the
    // store-buffer pattern described in lock_shared.
    while (writer_.load(std::memory_order_relaxed) ||
           writer_.exchange(true, std::memory_order_seq_cst)) {
      backoff(spins);
    }
    for (auto& slot : slots_) {
      spins = 0;
      while (slot.readers.load(std::memory_order_seq_cst) != 0) backoff(spins);
    }
  }

  void unlock() noexcept {
    // Release pairs with the seq_cst (acquire) load in lock_shared.
    writer_.store(false, std::memory_order_release);
  }

 private:
  struct alignas(64) slot {
    std::atomic<std::uint32_t> readers{0};
  };

  static void backoff(unsigned& spins) noexcept {
    if (++spins < 64) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }

  void wait_writer_gone() const noexcept {
    unsigned spins = 0;
    while (writer_.load(std::memory_order_relaxed)) backoff(spins);
  }

  std::array<slot, kSlots> slots_{};
  alignas(64) std::atomic<bool> writer_{false};
};

/// RAII shared section.
class shared_guard {
 public:
  explicit shared_guard(sharded_shared_mutex& m) noexcept : m_(m), slot_(m.lock_shared()) {}
  ~shared_guard() { m_.unlock_shared(slot_); }
  shared_guard(const shared_guard&) = delete;
  shared_guard& operator=(const shared_guard&) = delete;

 private:
  sharded_shared_mutex& m_;
  std::size_t slot_;
};

}  // namespace tide::detail
