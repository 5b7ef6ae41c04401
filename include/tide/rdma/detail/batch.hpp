#pragma once
/// Slices, tasks and batches: the objects a transfer is made of on its way
/// through the data path.  Not API.
///
/// Lifetime: a batch (and the tasks and slices inside it) is owned by the
/// transport's batch pool and recycled, never freed while the engine runs,
/// so a worker that touches a batch a moment after the user freed it still
/// touches valid memory.  A batch is handed back to the pool only when no
/// slice of it is in flight (free_batch checks `inflight`).

#include <tide/errc.hpp>
#include <tide/transfer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tide::rdma {
class endpoint;
}
namespace tide::rdma::plan {
class nic_load;
class rail_state;
struct rail_map;
}

namespace tide::rdma::detail {

struct task_state;
struct batch_state;

/// One work request's worth of a transfer (<= slice_size bytes).
struct slice {
  slice* next = nullptr;  ///< intrusive link for shard queues and post chains
  task_state* task = nullptr;
  std::uint64_t local_addr = 0;
  std::uint64_t remote_addr = 0;
  std::uint32_t length = 0;
  std::uint32_t lkey = 0;
  std::uint32_t rkey = 0;
  std::uint32_t local_buffer = 0;  ///< index into the local buffer table
  std::uint32_t peer_buffer = 0;   ///< index into the peer's buffer table
  std::uint16_t local_device = 0;  ///< device id of the local context
  std::uint16_t peer_device = 0;   ///< device id in the peer's devices[]
  transfer_op op = transfer_op::write;
  std::uint8_t retries = 0;        ///< paths tried so far after the first
  std::uint8_t qp = 0;             ///< QP index inside `ep`
  endpoint* ep = nullptr;          ///< where it was posted (outstanding accounting)
  const std::string* peer_path = nullptr;  ///< "<peer server>@<peer nic>", owned by the peer segment

  // ---- planning and rails (include/tide/rdma/plan/; retire with detail::retire_wr) ----
  /// This slice's own task's bytes when it heads a WR of coalesced requests
  /// (then `length` is the whole WR); 0 when the WR is this slice alone.
  std::uint32_t share = 0;
  slice* rider = nullptr;                  ///< next piece of the same WR (another task's), never posted
  plan::nic_load* charged = nullptr;       ///< the NIC whose in-flight bytes count this WR, until it leaves
  plan::rail_state* rail = nullptr;        ///< the rail it was sent on (health feedback)
  const plan::rail_map* rails = nullptr;   ///< the target's rail map (for a retry)
  std::uint32_t peer_nic = 0;              ///< rail_table id of the peer NIC
  std::int64_t dispatched_ns = 0;          ///< steady clock, when handed to a lane
  bool inline_data = false;                ///< small enough for IBV_SEND_INLINE; the lane decides
  bool probe = false;                      ///< the one slice a paused rail lets through
};

struct task_state {
  std::atomic<transfer_state> state{transfer_state::waiting};
  std::atomic<std::uint32_t> slices_left{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<errc> reason{errc::ok};
  std::atomic<bool> any_failed{false};
  batch_state* batch = nullptr;
  segment_id target = kInvalidSegment;
  std::chrono::steady_clock::time_point deadline{};
  std::vector<slice> slices;  ///< capacity kept across reuses of the batch
  std::shared_ptr<const void> keep_alive;  ///< the target segment's resolved view
};

struct batch_state {
  explicit batch_state(std::size_t capacity) : tasks(new task_state[capacity]), capacity(capacity) {
    for (std::size_t i = 0; i < capacity; ++i) tasks[i].batch = this;
  }

  std::unique_ptr<task_state[]> tasks;
  std::size_t capacity;
  std::mutex submit_mu;              ///< one submit at a time per batch
  std::atomic<std::size_t> used{0};  ///< tasks submitted so far
  std::atomic<std::size_t> unfinished{0};
  std::atomic<std::size_t> inflight{0};  ///< slices handed to workers, not yet retired
  std::atomic<bool> canceled{false};
  std::atomic<bool> live{false};     ///< allocated and not yet freed
  std::uint64_t generation = 0;      ///< bumps on every reuse (batch ids embed it)
  std::mutex mu;                     ///< pairs with cv for wait()
  std::condition_variable cv;
};

/// Moves a task to a final state once; the one that wins retires it from
/// its batch (and wakes waiters when it was the last).  Any thread.
inline bool finish_task(task_state& t, transfer_state final_state) noexcept {
  auto cur = t.state.load(std::memory_order_acquire);
  while (!is_final(cur)) {
    if (t.state.compare_exchange_weak(cur, final_state, std::memory_order_acq_rel)) {
      batch_state& b = *t.batch;
      // The last task of a batch notifies under the mutex so a waiter between its
      // predicate check and its sleep cannot miss it (pairs with wait()).
      if (b.unfinished.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(b.mu);
        b.cv.notify_all();
      }
      return true;
    }
  }
  return false;
}

/// Retires one slice with outcome `e`.  Giving up the batch's in-flight
/// count is its last touch of the batch (after which it may be recycled).  Any thread; lock-free except for the final
/// notification of a batch.
inline void retire_slice(slice& s, errc e) noexcept {
  task_state& t = *s.task;
  batch_state& b = *t.batch;
  if (e == errc::ok) {
    t.bytes.fetch_add(s.length, std::memory_order_relaxed);
  } else {
    t.reason.store(e, std::memory_order_relaxed);
    t.any_failed.store(true, std::memory_order_relaxed);
  }
  if (t.slices_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    const bool failed = t.any_failed.load(std::memory_order_relaxed);
    (void)finish_task(t, failed ? transfer_state::failed : transfer_state::completed);
  }
  // Last touch of the batch: free_batch recycles it once inflight is 0
  // (pairs with the acquire load there).
  b.inflight.fetch_sub(1, std::memory_order_release);
}

}  // namespace tide::rdma::detail
