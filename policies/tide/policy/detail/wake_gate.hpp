#pragma once
/// The sleeping flag of an idle strategy, the asymmetric barrier that keeps
/// wake() down to one load, and a futex-based event.  Not API.

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace tide::policy::detail {

/// True once this process is registered for private expedited membarrier.
/// Registration happens on first use (thread-safe static).
inline bool heavy_barrier_available() noexcept {
  static const bool ok = [] {
    const long cmds = ::syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
    return ::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  }();
  return ok;
}

/// Forces a full memory barrier on every running thread of the process.
/// Returns false when it could not (then the caller must bound its sleep).
inline bool heavy_barrier() noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!heavy_barrier_available()) return false;
  return ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}

/// The flag a sleeper raises before its last look for work.
class wake_gate {
 public:
  wake_gate() = default;
  wake_gate(const wake_gate&) = delete;
  wake_gate& operator=(const wake_gate&) = delete;

  /// Producer side, after publishing work: true when a wake-up must be sent.
  [[nodiscard]] bool sleeper_present() const noexcept {
    // Compiler barrier only: keeps the load after the caller's publication
    // in program order; the CPU-level ordering comes from the sleeper's
    // heavy_barrier() in announce() (asymmetric Dekker).
    std::atomic_signal_fence(std::memory_order_seq_cst);
    return sleeping_.load(std::memory_order_relaxed) != 0;
  }

  /// Sleeper side, before its final re-check.  Returns true when wake-ups
  /// are exact; false when the sleep must be capped (no membarrier).
  [[nodiscard]] bool announce() noexcept {
    sleeping_.store(1, std::memory_order_relaxed);
    return heavy_barrier();
  }

  void withdraw() noexcept { sleeping_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint32_t> sleeping_{0};
};

/// A futex word used as an event count: wait(seen) sleeps while the count
/// is still `seen`; signal() bumps it and wakes one waiter.
class futex_event {
 public:
  [[nodiscard]] std::uint32_t prepare() const noexcept { return seq_.load(std::memory_order_acquire); }

  /// Sleeps until signal() after prepare() returned `seen`, or `timeout`.
  void wait(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
    // Returns at once (EAGAIN) if the word moved since prepare().
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
  }

  void signal() noexcept {
    // Release pairs with prepare()'s acquire.
    seq_.fetch_add(1, std::memory_order_release);
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&seq_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
  }

 private:
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  std::atomic<std::uint32_t> seq_{0};
};

/// How long a sleep may last when wake-ups are not exact.
inline constexpr std::chrono::milliseconds kInexactSleepCap{1};

}  // namespace tide::policy::detail
