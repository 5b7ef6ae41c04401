#pragma once
/// rdma::batch_table — the batches of one transport: allocation, lookup by
/// id, the roll-up users read (task and batch status), wait, cancel, expiry.
///
/// A batch_id is (generation << 32) | slot.  Each batch_state carries one
/// atomic word, its tag: (generation << 1) | live.  lookup() compares the
/// tag of the slot's batch with the id in one load, so a batch that is
/// freed, reused or never allocated does not resolve (unknown_batch).
///
/// Ownership: the table owns every batch_state and frees none while it
/// lives.  A slot whose batch is too small for a new allocation gets a
/// bigger one, and the old one stays in the table's list of all batches (all_) as long as
/// the table: a worker retiring a slice a moment after free_batch, or a
/// caller that looked the id up just before, still touches valid memory
/// (and then sees a dead tag).  Capacities are rounded up to powers of two,
/// so the replaced batches of a slot hold fewer tasks than its current one.
///
/// Threads: every member may be called from any thread.  allocate and free
/// serialise on one mutex (free also takes the batch's submit mutex, so a
/// submit in progress finishes first); lookup and the status calls take
/// no lock.  Using an id while another thread frees it is answered with
/// unknown_batch or with the state just before the free, never with
/// another batch's state (status calls re-check the tag after reading),
/// and it never changes another batch's tasks: the status calls and wait
/// mark a task past its deadline only under the batch's submit mutex
/// (try_lock) with the tag checked again under it, as cancel does; while a
/// submit or free holds it they leave the mark to a later call (or to the
/// free, which expires first).  What they return holds no pointer into the
/// batch: failed_peer_path views the table's copy of the path.

#include <tide/rdma/detail/batch.hpp>
#include <tide/telemetry.hpp>
#include <tide/result.hpp>
#include <tide/transfer.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace tide::rdma {

class batch_table {
 public:
  static constexpr std::size_t kDefaultMaxTasks = std::size_t{1} << 16;
  static constexpr std::size_t kMaxTasksLimit = std::size_t{1} << 30;

  /// A table of at most `max_batches` batches of at most `max_tasks` tasks
  /// each.  A batch's memory (~128 B per task, rounded up to a power of two
  /// of tasks) is never returned while the table lives, so the cap bounds
  /// what one allocate can pin for good.
  /// Errors: config_invalid (0 or more than 2^24 batches, 0 or more than
  /// 2^30 tasks).
  [[nodiscard]] static result<std::unique_ptr<batch_table>> create(std::size_t max_batches,
                                                                   std::size_t max_tasks = kDefaultMaxTasks);

  /// The live batch `id`, or nullptr (never allocated, freed, stale).
  [[nodiscard]] detail::batch_state* lookup(batch_id id) const noexcept;
  /// True while `b` is the live batch `id` (one acquire load).
  [[nodiscard]] static bool still(const detail::batch_state& b, batch_id id) noexcept {
    return b.tag.load(std::memory_order_acquire) == live_tag(id);
  }

  /// Errors: capacity_zero, batch_too_large (above max_tasks; the detail
  /// names the limit), resource_exhausted (max_batches alive; the detail
  /// names the limit), out_of_memory.
  [[nodiscard]] result<batch_id> allocate(std::size_t capacity) noexcept;
  /// Errors: unknown_batch, batch_busy (tasks unfinished or slices in flight).
  [[nodiscard]] status free(batch_id id) noexcept;

  /// Marks the tasks of `b` past their deadline for TIMEOUT.  The caller
  /// keeps `b` from being recycled meanwhile (holds its submit mutex, or
  /// the table's, as free and expire_all do).
  static void expire(detail::batch_state& b) noexcept;
  /// expire() on every live batch (a drain that nobody else polls).
  void expire_all() noexcept {
    for_each_task([](detail::task_state&) { return false; }, true);
  }
  /// Marks every unfinished task of a live batch for which pred(task) holds
  /// to end CANCELED (unregister_memory / close_segment with in_flight::cancel).
  template <class Pred>
  void cancel_where(Pred&& pred) noexcept {
    for_each_task(pred, false);
  }

  [[nodiscard]] result<transfer_status> task_status(batch_id id, std::size_t task) noexcept;
  [[nodiscard]] result<transfer_status> batch_status(batch_id id) noexcept;
  /// A task's telemetry (<tide/telemetry.hpp>); partial until it is final.
  /// Errors: unknown_batch, unknown_task.
  [[nodiscard]] result<transfer_telemetry> task_telemetry(batch_id id, std::size_t task) noexcept;
  /// The sum over the batch's submitted tasks.  Errors: unknown_batch.
  [[nodiscard]] result<transfer_telemetry> batch_telemetry(batch_id id) noexcept;
  /// Every batch's tasks record into this when they turn final.
  [[nodiscard]] const transfer_meter& meter() const noexcept { return meter_; }
  /// Polls for `spin` (bounded by `timeout`), then sleeps on the batch's
  /// condition variable until its last task ends or `timeout`.  The spin
  /// is adaptive: after kSpinMisses waits in a row whose batch outlived it
  /// (transfers longer than the spin, as large ones over TCP are), waits
  /// sleep at once, and one in kSpinProbe spins again to see whether
  /// batches end within it now; one that does turns spinning back on.
  [[nodiscard]] status wait(batch_id id, std::chrono::milliseconds timeout,
                            std::chrono::microseconds spin = {}) noexcept;
  static constexpr std::uint32_t kSpinMisses = 4, kSpinProbe = 16;
  /// Spins in a row that ran out before their batch ended (0 after one that caught it).
  [[nodiscard]] std::uint32_t spin_misses() const noexcept { return spin_misses_.load(std::memory_order_relaxed); }
  /// Marks every task of batch `id` to end CANCELED, and the batch: a later
  /// submit to it is refused (errc::canceled).  Serialised with submit and
  /// free by the batch's submit mutex, and the id is checked again under
  /// it, so a batch freed and handed out again meanwhile is left alone
  /// (unknown_batch).  Errors: unknown_batch.
  [[nodiscard]] status cancel(batch_id id) noexcept;
  /// Sets (or with nullptr clears) the listener told when the batch's last
  /// unfinished task turns final; told at once when none is unfinished.
  /// After a clear returns the old listener is not called for `id` again;
  /// free() clears it too.  Errors: unknown_batch.
  [[nodiscard]] status watch(batch_id id, batch_listener* listener) noexcept;

  [[nodiscard]] std::size_t max_batches() const noexcept { return max_batches_; }
  [[nodiscard]] std::size_t max_tasks() const noexcept { return max_tasks_; }
  /// Batches allocated and not freed (takes the allocation mutex).
  [[nodiscard]] std::size_t live_batches() const;
  /// Failed NIC paths kept so far (tests).
  [[nodiscard]] std::size_t failed_paths_kept() const { return paths_.size(); }

 private:
  // expire() on `b` while it is batch `id`: under its submit mutex, taken
  // with try_lock (a submit or free in progress: nothing now).
  static void expire_live(detail::batch_state& b, batch_id id) noexcept;

  batch_table(std::size_t max_batches, std::size_t max_tasks);

  // Walks the live batches under mu_ (so none is recycled meanwhile).
  template <class Pred>
  void for_each_task(Pred&& cancel_if, bool expire_too) noexcept {
    std::lock_guard lock(mu_);
    for (std::size_t s = 0; s < slot_count_; ++s) {
      detail::batch_state* b = slots_[s].load(std::memory_order_acquire);
      if ((b->tag.load(std::memory_order_acquire) & 1u) == 0) continue;
      if (expire_too) expire(*b);
      const std::size_t n = b->used.load(std::memory_order_acquire);
      for (std::size_t i = 0; i < n; ++i)
        if (cancel_if(b->tasks[i])) detail::stop_task(b->tasks[i], transfer_state::canceled, errc::canceled);
    }
  }

  static constexpr std::uint64_t live_tag(batch_id id) noexcept { return ((id >> 32) << 1) | 1u; }
  [[nodiscard]] bool spin_pays() noexcept;

  // wait()'s adaptive spin (relaxed: a hint shared by every waiting thread,
  // which a race only makes spin once more or once less).
  std::atomic<std::uint32_t> spin_misses_{0};
  std::atomic<std::uint32_t> spins_skipped_{0};

  transfer_meter meter_;  ///< before the batches: they point at it
  detail::path_names paths_;  ///< likewise
  std::size_t max_batches_;
  std::size_t max_tasks_;
  mutable std::mutex mu_;  ///< allocate / free; guards slot_count_, free_slots_, all_
  /// Slot i's current batch; written under mu_, read lock-free.
  std::unique_ptr<std::atomic<detail::batch_state*>[]> slots_;
  std::size_t slot_count_ = 0;
  std::vector<std::uint32_t> free_slots_;
  /// Every batch_state ever made, current or replaced (see the top); guarded by mu_.
  std::vector<std::unique_ptr<detail::batch_state>> all_;
};

}  // namespace tide::rdma
