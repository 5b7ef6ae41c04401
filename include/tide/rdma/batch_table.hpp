#pragma once
/// rdma::batch_table — the batches of one transport: allocation, lookup by
/// id, the roll-up users read (task and batch status), wait, cancel, expiry.
///
/// A batch_id is (generation << 32) | slot.  Slots are owned by the table
/// and never freed while it lives (a worker touching a batch a moment after
/// free_batch still touches valid memory); a freed slot bumps its
/// generation, so a stale id no longer resolves.
///
/// Threads: every member may be called from any thread.  allocate/free
/// serialise on one mutex; lookup and the status calls take no lock.

#include <tide/rdma/detail/batch.hpp>
#include <tide/result.hpp>
#include <tide/transfer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace tide::rdma {

class batch_table {
 public:
  /// Errors: config_invalid (0 or more than 2^24 batches).
  [[nodiscard]] static result<std::unique_ptr<batch_table>> create(std::size_t max_batches);

  /// The live batch `id`, or nullptr (never allocated, freed, stale).
  [[nodiscard]] detail::batch_state* lookup(batch_id id) const noexcept;

  /// Errors: capacity_zero, resource_exhausted (max_batches alive).
  [[nodiscard]] result<batch_id> allocate(std::size_t capacity);
  /// Errors: unknown_batch, batch_busy (tasks unfinished or slices in flight).
  [[nodiscard]] status free(batch_id id);

  /// Moves the tasks of `b` past their deadline to TIMEOUT.
  static void expire(detail::batch_state& b) noexcept;

  [[nodiscard]] result<transfer_status> task_status(batch_id id, std::size_t task);
  [[nodiscard]] result<transfer_status> batch_status(batch_id id);
  [[nodiscard]] status wait(batch_id id, std::chrono::milliseconds timeout);
  [[nodiscard]] status cancel(batch_id id);

 private:
  explicit batch_table(std::size_t max_batches)
      : max_batches_(max_batches), slots_(new std::unique_ptr<detail::batch_state>[max_batches]) {}

  std::size_t max_batches_;
  std::mutex mu_;  ///< allocate / free
  std::unique_ptr<std::unique_ptr<detail::batch_state>[]> slots_;
  std::size_t slot_count_ = 0;
  std::vector<std::uint32_t> free_slots_;
};

}  // namespace tide::rdma
