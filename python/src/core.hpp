#pragma once
// tide::py::core — what one tide._tide.Engine owns: the engine, and the
// binding's state that must live exactly as long as it (completion queues
// a lane may still call, batches given up on, Mooncake's managed blocks).
//
// Ownership: the Python Engine holds a shared_ptr<core>; each call copies it
// (GIL held) and drops the copy without the GIL, so the engine is destroyed
// without the GIL by whoever used it last.  Every member may be used from
// any thread; each guards itself.

#include "completion.hpp"
#include "engine_iface.hpp"
#include "mooncake_args.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tide::py {

/// Batches the binding stopped waiting for: canceled, but not final within
/// their bound (or a signal came first), so not freed.  Each is freed by a
/// later reap() once final; the engine's teardown ends the rest.  Keeps a
/// dropped or interrupted batch from holding its slot for ever.
class orphan_list {
 public:
  void park(batch_id b);
  /// Frees the parked batches that are final now (or unknown); returns the
  /// ids still parked.  Without the GIL (it calls the engine).
  std::vector<batch_id> reap(engine_iface& e);
  /// Takes every parked id (close() finishes them).
  std::vector<batch_id> take_all();
  [[nodiscard]] bool empty() const noexcept { return count_.load(std::memory_order_relaxed) == 0; }

 private:
  std::mutex mu_;
  std::vector<batch_id> ids_;  ///< guarded by mu_
  std::atomic<std::size_t> count_{0};
};

/// The completion queues (asyncio's, one per event loop) that batches are
/// watched with, and which batches each one watches.  A queue is kept
/// here while it watches anything, so a lane never calls a freed listener;
/// forget() stops every watch of a queue, after which the engine never
/// calls it again and it may be destroyed.  With the GIL: watch_batch takes
/// only a batch's mutex, which no holder keeps while taking the GIL.
class watch_table {
 public:
  status watch(engine_iface& e, batch_id b, const std::shared_ptr<completion_queue>& q);
  /// Stops watching b (whichever queue watched it).
  status unwatch(engine_iface& e, batch_id b);
  /// Stops every watch of q and lets it go.
  void forget(engine_iface& e, const std::shared_ptr<completion_queue>& q);
  /// How many queues are kept (tests: one per live event loop at most).
  [[nodiscard]] std::size_t queues() const;

 private:
  struct entry {
    std::shared_ptr<completion_queue> queue;
    std::vector<batch_id> batches;
  };
  mutable std::mutex mu_;
  std::vector<entry> entries_;  ///< guarded by mu_
};

/// Mooncake's allocate_managed_buffer: anonymous pages registered with the
/// engine.  A block is unmapped only once unregistered, or when the core
/// (so the engine, and every call using the block) is gone: never while
/// the engine may still DMA into it or a copy reads it.
class managed_blocks {
 public:
  managed_blocks() = default;
  managed_blocks(const managed_blocks&) = delete;
  managed_blocks& operator=(const managed_blocks&) = delete;
  /// Unmaps what is left: run after the engine is destroyed (core's order).
  ~managed_blocks();
  /// Maps and registers `length` bytes (at least one page); the address.
  [[nodiscard]] result<std::uintptr_t> allocate(engine_iface& e, std::size_t length);
  /// Unregisters (draining transfers still using it), then unmaps.  When the
  /// unregister fails the block stays mapped and registered, and a later
  /// free may try again.  Errors: not_registered (not a managed block), the
  /// unregister's.
  [[nodiscard]] status free(engine_iface& e, std::uintptr_t addr);

 private:
  std::mutex mu_;
  std::unordered_map<std::uintptr_t, std::size_t> blocks_;  ///< guarded by mu_
};

/// The deadline of each batch Mooncake's batch_transfer_async_* submitted
/// (its submission + base + per byte), until the batch is finished.
class async_deadlines {
 public:
  void put(batch_id b, std::chrono::steady_clock::time_point deadline);
  /// The batch's deadline (forgotten), or nothing for an id submitted otherwise.
  [[nodiscard]] std::optional<std::chrono::steady_clock::time_point> take(batch_id b);

 private:
  std::mutex mu_;
  std::unordered_map<batch_id, std::chrono::steady_clock::time_point> by_batch_;  ///< guarded by mu_
};

struct core {
  explicit core(std::chrono::milliseconds transfer_timeout)
      : drain_bound(transfer_timeout + std::chrono::seconds(10)) {}
  core(const core&) = delete;
  core& operator=(const core&) = delete;
  /// The engine first: no lane can call a watch queue, and no DMA reaches
  /// a managed block, once the members below go.
  ~core() { engine.reset(); }

  std::unique_ptr<engine_iface> engine;
  /// How long a canceled batch may take to become final before the binding
  /// gives up on it (parks it): transfer_timeout + 10 s, unregister_memory's
  /// bound for the same drain.
  const std::chrono::milliseconds drain_bound;
  /// Set by close(): a batch run in progress cancels, drains and returns.
  std::atomic<bool> closing{false};
  managed_blocks managed;
  watch_table watches;
  orphan_list orphans;
  async_deadlines deadlines;
  named_segments segments;  ///< tide.TransferEngine's, by name
};

}  // namespace tide::py
