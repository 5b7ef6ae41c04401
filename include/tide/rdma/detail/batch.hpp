#pragma once
/// Slices, tasks and batches: the objects a transfer is made of on its way
/// through the data path.  Not API.
///
/// Lifetime: a batch (and the tasks and slices inside it) is owned by the
/// transport's batch_table and recycled, never freed while the engine runs,
/// so a worker that touches a batch a moment after the user freed it still
/// touches valid memory.  A batch is handed back to the table only when no
/// slice of it is in flight (free_batch checks `inflight`).
///
/// The roll-up (slice -> task -> batch), its promises:
///  - Final means final.  A task's state becomes COMPLETED, FAILED, TIMEOUT
///    or CANCELED only when its last slice retires (completed, failed for
///    good, flushed, or dropped before posting), i.e. when none of its WRs
///    can still touch local or remote memory.  Timeout and cancel only mark
///    the task (stop_task: the pending-final state); workers then drop its
///    slices that are not posted yet (should_drop) and the transport does
///    not retry them; the mark becomes the final state when the last slice
///    retires.  wait() returns only then.  A task past its deadline whose
///    slices all arrived ends COMPLETED: its data is there.
///  - First cause.  A task's reason is the first error that hit it (a slice
///    failure, a timeout, a cancel), with one refinement: a flush
///    (work_request_flushed) is only a consequence of another failure on
///    the same QP, so the first other error replaces it.  Later errors do
///    not overwrite it.  The first failure on the wire also records the NIC
///    path it happened on, as a copy the batch table keeps (path_names), so
///    the view a status call hands out stays valid after the batch is freed
///    and after the segment view that named the path is gone.

#include <tide/errc.hpp>
#include <tide/telemetry.hpp>
#include <tide/transfer.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tide::memory {
class copy_engine;
}
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
struct stage_chunk;
struct notify_send;  // rdma/detail/notify_send.hpp

/// Tasks of one submit that someone waits on as a whole (a transfer-bound
/// notification, transfer_engine::submit with a notification): finish_task
/// counts each member down, and the last one to turn final calls done()
/// with whether every member ended COMPLETED.  done() runs once, on the
/// thread that retired the last member (a lane, or the submitting thread
/// for a slice that never reached a NIC), before that batch's waiters wake;
/// it must not block, throw or call into the transport (a lane's lock-free
/// notify_sink is the one thing it may hand work to).  The group must
/// outlive its members' retirement; whoever done() hands it to owns it then.
struct task_group {
  std::atomic<std::size_t> left{0};     ///< members not final yet; the submitter sets it first
  std::atomic<bool> failed{false};      ///< a member ended other than COMPLETED
  /// The notification these tasks end in, offered to ride behind their data
  /// (notify_send::rides); null: it waits for done().  Set before the submit.
  notify_send* message = nullptr;
  virtual void done(bool all_completed) noexcept = 0;

 protected:
  ~task_group() = default;
};

struct slice;

/// Owner of a WR in a QP's posted ring that is not part of a transfer (an
/// RDMA notification or credit SEND, rdma/detail/notify_qp.hpp): its slice
/// has no task, and retire_wr hands it here instead of to the roll-up.
/// Called on the lane that owns the QP, once per post.
struct wr_hook {
  virtual void wr_done(slice& s, errc e) noexcept = 0;

 protected:
  ~wr_hook() = default;
};

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
  bool inline_data = false;                ///< small enough for IBV_SEND_INLINE; the lane decides
  bool probe = false;                      ///< the one slice a paused rail lets through
  errc retry_error = errc::ok;             ///< while parked (detail/retry_timer.hpp): the failure it waits to retry
  wr_hook* hook = nullptr;                 ///< non-null: not a transfer's WR (no task)
  /// A submit's only WR, a WRITE: lane 0 posts this notification behind it
  /// (notify_send, "riding") and clears it; other lanes leave it.
  notify_send* then_notify = nullptr;

  // ---- staging (rdma/detail/stage_pool.hpp) ----
  /// The local buffer's copy engine when no NIC registered it (the lane
  /// stages the WR through a chunk); null otherwise.
  const memory::copy_engine* stager = nullptr;
  stage_chunk* chunk = nullptr;            ///< the lane's chunk while it is staged
};

/// The NIC paths of failed slices (task_state::failed_path points here),
/// kept as long as the batch table: a status call's failed_peer_path is a
/// view of one, which a caller may read after free_batch, when the batch's
/// hold on the segment view (task_state::keep_alive) is gone and a refresh
/// may have let that view go with it (review 1ab3d99, finding 1).  One copy
/// per distinct path that ever failed, at most kMax (then no path is
/// recorded: failed_local_device still names the local NIC).
class path_names {
 public:
  static constexpr std::size_t kMax = 65536;

  /// The kept copy of `path`, or nullptr (full, out of memory).  Any
  /// thread; takes a mutex, on the failure path only (note_cause).
  [[nodiscard]] const std::string* intern(std::string_view path) noexcept {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(path); it != index_.end()) return it->second;
    if (names_.size() >= kMax) return nullptr;
    try {
      names_.emplace_back(path);
    } catch (...) {
      return nullptr;
    }
    const std::string* kept = &names_.back();
    try {
      index_.emplace(std::string_view(*kept), kept);
    } catch (...) {
      names_.pop_back();
      return nullptr;
    }
    return kept;
  }
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mu_);
    return names_.size();
  }

 private:
  mutable std::mutex mu_;
  std::deque<std::string> names_;  ///< a deque: its elements never move
  std::unordered_map<std::string_view, const std::string*> index_;  ///< views of names_
};

struct task_state {
  std::atomic<transfer_state> state{transfer_state::waiting};
  /// pending, or timeout/canceled once stop_task marked it (the final state
  /// it takes when its last slice retires).
  std::atomic<transfer_state> stop{transfer_state::pending};
  std::atomic<std::uint32_t> slices_left{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<errc> reason{errc::ok};  ///< the first cause (see the top)
  std::atomic<bool> any_failed{false};
  /// Where the first wire failure happened (kNoDevice / null when none);
  /// the path is the batch table's copy (path_names), never freed while it lives.
  std::atomic<std::uint16_t> failed_device{kNoDevice};
  std::atomic<const std::string*> failed_path{nullptr};
  batch_state* batch = nullptr;
  segment_id target = kInvalidSegment;
  /// Atomic because status calls read it while a recycled batch's task is
  /// being refilled (a caller racing free_batch; they then see a dead tag).
  std::atomic<std::chrono::steady_clock::time_point> deadline{};
  std::vector<slice> slices;  ///< capacity kept across reuses of the batch
  std::shared_ptr<const void> keep_alive;  ///< the target segment's resolved view
  /// In-flight slice counters of the task's local buffer and target segment
  /// (owned by the transport, which outlives every batch); set by submit.
  std::atomic<std::size_t>* local_inflight = nullptr;
  std::atomic<std::size_t>* segment_inflight = nullptr;
  /// The group this task belongs to (null: none); set by submit before the
  /// task is published, read once by finish_task.
  task_group* group = nullptr;
  // ---- telemetry (<tide/telemetry.hpp>, detail/task_telemetry.hpp): relaxed;
  // done_ns is published with the final state. Steady-clock ns, 0 = not yet.
  std::atomic<std::int64_t> submit_ns{0};
  std::atomic<std::int64_t> first_post_ns{0};
  std::atomic<std::int64_t> done_ns{0};
  std::atomic<std::uint64_t> length{0};  ///< requested bytes
  std::atomic<transfer_op> op{transfer_op::write};
  std::atomic<std::uint32_t> wrs{0};
  std::atomic<std::uint32_t> retries{0};
  std::atomic<std::uint32_t> local_nics{0};  ///< bit per local device id
  std::atomic<std::uint64_t> peer_nics{0};   ///< bit per peer devices[] index (63: >= 63)
  std::atomic<std::uint8_t> transports{0};   ///< transfer_telemetry::kViaRdma / kViaTcp
};

struct batch_state {
  explicit batch_state(std::size_t capacity) : tasks(new task_state[capacity]), capacity(capacity) {
    for (std::size_t i = 0; i < capacity; ++i) tasks[i].batch = this;
  }

  std::unique_ptr<task_state[]> tasks;
  std::size_t capacity;
  std::mutex submit_mu;              ///< one submit at a time per batch; free_batch takes it too
  std::atomic<std::size_t> used{0};  ///< tasks submitted so far
  std::atomic<std::size_t> unfinished{0};
  std::atomic<std::size_t> inflight{0};  ///< slices handed to workers, not yet retired
  std::atomic<bool> canceled{false};
  /// (generation << 1) | live, in one word so a lookup checks both at once
  /// (batch_table owns it).
  std::atomic<std::uint64_t> tag{0};
  std::mutex mu;                     ///< pairs with cv for wait()
  std::condition_variable cv;
  /// Waiters about to sleep on cv (incremented under mu), and whether a
  /// listener is set: the last task takes mu to wake someone only when
  /// one of them says someone is there.  A waiter that caught the end while
  /// spinning never meets the finishing lane on mu.  Both are seq_cst
  /// against `unfinished` (see finish_task).
  std::atomic<std::uint32_t> sleepers{0};
  std::atomic<bool> watched{false};
  /// watch_batch's listener and the id it watches; guarded by mu (a lane
  /// calls it under mu, so clearing it under mu ends every call).
  batch_listener* listener = nullptr;
  batch_id listener_id = 0;
  /// The table's latency histograms and final-state counts (set by allocate).
  transfer_meter* meter = nullptr;
  /// The table's copies of failed NIC paths (set by allocate; null: none kept).
  path_names* paths = nullptr;
};

/// Records `e` as the task's cause unless it has one; a flush gives way to
/// any other error (see the top).  `where` (may be null) names the slice
/// whose failure it is, for the NIC path.  Any thread.
inline void note_cause(task_state& t, errc e, const slice* where) noexcept {
  errc cur = t.reason.load(std::memory_order_relaxed);
  for (;;) {
    const bool replace = cur == errc::ok || (cur == errc::work_request_flushed && e != errc::work_request_flushed);
    if (!replace) return;
    if (t.reason.compare_exchange_weak(cur, e, std::memory_order_relaxed)) break;
  }
  // Published to readers by the acq_rel decrement of slices_left that
  // follows (the final state is stored after it).  The path is the
  // table's copy: the slice's points into the segment view, which only the
  // task's keep_alive holds and free_batch lets go.
  if (where != nullptr && where->peer_path != nullptr) {
    t.failed_device.store(where->local_device, std::memory_order_relaxed);
    path_names* names = t.batch != nullptr ? t.batch->paths : nullptr;
    t.failed_path.store(names != nullptr ? names->intern(*where->peer_path) : nullptr, std::memory_order_relaxed);
  }
}

/// Prepares task `t` for a new transfer of `slice_count` slices.  The
/// submitting thread, before the task is published (batch `used`).  What
/// status_of reads is stored with release: a reader of a stale id that
/// reads one of these values (acquire) then sees the new tag when it checks
/// the id again (batch_table), never the new owner's state as its own.
/// (Plain stores on x86 either way.)
inline void reset_task(task_state& t, std::size_t slice_count, segment_id target,
                       std::chrono::steady_clock::time_point deadline) {
  t.slices.resize(slice_count);
  t.target = target;
  t.deadline.store(deadline, std::memory_order_relaxed);
  t.bytes.store(0, std::memory_order_release);
  t.reason.store(errc::ok, std::memory_order_release);
  t.any_failed.store(false, std::memory_order_relaxed);
  t.failed_device.store(kNoDevice, std::memory_order_release);
  t.failed_path.store(nullptr, std::memory_order_release);
  t.stop.store(transfer_state::pending, std::memory_order_relaxed);
  t.slices_left.store(static_cast<std::uint32_t>(slice_count), std::memory_order_relaxed);
  t.group = nullptr;
  t.state.store(transfer_state::pending, std::memory_order_release);
}

/// A freed batch's task goes back to WAITING (free_batch, no slice in
/// flight, after the batch's tag died: the release store of the state
/// carries that to status readers, as in reset_task).
inline void recycle_task(task_state& t) noexcept {
  t.keep_alive.reset();
  t.group = nullptr;
  t.local_inflight = nullptr;
  t.segment_inflight = nullptr;
  t.stop.store(transfer_state::pending, std::memory_order_relaxed);
  t.state.store(transfer_state::waiting, std::memory_order_release);
}

/// Publishes the final state once; the one that wins retires it from its
/// batch (and wakes waiters when it was the last).  Only the retirement of
/// a task's last slice calls it.
inline bool finish_task(task_state& t, transfer_state final_state) noexcept {
  auto cur = t.state.load(std::memory_order_acquire);
  // Stored before the state so a reader that sees the state final sees it.
  const std::int64_t done =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  t.done_ns.store(done, std::memory_order_relaxed);
  while (!is_final(cur)) {
    if (t.state.compare_exchange_weak(cur, final_state, std::memory_order_acq_rel)) {
      batch_state& b = *t.batch;
      if (b.meter != nullptr)
        b.meter->record(t.op.load(std::memory_order_relaxed), t.length.load(std::memory_order_relaxed),
                        done - t.submit_ns.load(std::memory_order_relaxed), final_state,
                        t.reason.load(std::memory_order_relaxed), t.transports.load(std::memory_order_relaxed));
      // Before the batch's count: when wait() returns, the group has been told.
      if (task_group* g = t.group) {
        if (final_state != transfer_state::completed) g->failed.store(true, std::memory_order_relaxed);
        // acq_rel: the last member sees every other member's `failed` store.
        if (g->left.fetch_sub(1, std::memory_order_acq_rel) == 1) g->done(!g->failed.load(std::memory_order_relaxed));
      }
      // The last task of a batch notifies under the mutex so a waiter between its
      // predicate check and its sleep cannot miss it (pairs with wait()), and
      // only when a waiter or a listener has said it is there: seq_cst on both
      // sides, so either it sees their mark or they see unfinished at 0.
      if (b.unfinished.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
          (b.sleepers.load(std::memory_order_seq_cst) != 0 || b.watched.load(std::memory_order_seq_cst))) {
        std::lock_guard lock(b.mu);
        b.cv.notify_all();
        if (b.listener != nullptr) b.listener->batch_final(b.listener_id);
      }
      return true;
    }
  }
  return false;
}

/// How many tasks have been marked to stop, process-wide: a lane that sees
/// it change looks at every slice it has queued once (the others only where
/// it posts next).  Relaxed: a lane that misses a mark for a pass drops the
/// slices a pass later, or just before it posts them.
inline std::atomic<std::uint64_t> stop_mark_count{0};
[[nodiscard]] inline std::uint64_t stop_marks() noexcept { return stop_mark_count.load(std::memory_order_relaxed); }

/// Marks task `t` to end as `why` (timeout or canceled) with cause `e`.
/// It becomes final when its last slice retires (see the top).  Any thread;
/// the first mark wins, a final task is left alone.
inline void stop_task(task_state& t, transfer_state why, errc e) noexcept {
  if (is_final(t.state.load(std::memory_order_acquire))) return;
  auto expected = transfer_state::pending;
  if (t.stop.compare_exchange_strong(expected, why, std::memory_order_acq_rel)) {
    note_cause(t, e, nullptr);
    stop_mark_count.fetch_add(1, std::memory_order_relaxed);
  }
}

/// ok, or why slice `s` must not be posted (or retried): its task was
/// marked to stop, or its batch was canceled (which marks the task).
/// Workers call it before posting; any thread.
inline errc should_drop(slice& s) noexcept {
  task_state& t = *s.task;
  if (t.batch->canceled.load(std::memory_order_acquire)) [[unlikely]]
    stop_task(t, transfer_state::canceled, errc::canceled);
  switch (t.stop.load(std::memory_order_acquire)) {
    case transfer_state::timeout: return errc::timed_out;
    case transfer_state::canceled: return errc::canceled;
    default: return errc::ok;
  }
}

/// Retires one slice with outcome `e`: completed (ok), failed for good,
/// flushed, or dropped before posting.  The last slice of a task publishes
/// its final state.  Giving up the batch's in-flight count is its last
/// touch of the batch (after which it may be recycled).  Any thread;
/// lock-free except for the final notification of a batch.
inline void retire_slice(slice& s, errc e) noexcept {
  task_state& t = *s.task;
  batch_state& b = *t.batch;
  if (e == errc::ok) {
    t.bytes.fetch_add(s.length, std::memory_order_relaxed);
  } else {
    note_cause(t, e, e == errc::timed_out || e == errc::canceled ? nullptr : &s);
    t.any_failed.store(true, std::memory_order_relaxed);
  }
  if (t.slices_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    const transfer_state stop = t.stop.load(std::memory_order_acquire);
    const bool failed = t.any_failed.load(std::memory_order_relaxed);
    // Every slice arrived: the data is there, so a deadline that passed
    // meanwhile does not make it TIMEOUT (a caller would redo the transfer;
    // review turn 3, finding 21).  A cancel still reads CANCELED.
    const transfer_state final_state = stop == transfer_state::timeout && !failed ? transfer_state::completed
                                       : stop != transfer_state::pending          ? stop
                                       : failed                                   ? transfer_state::failed
                                                                                  : transfer_state::completed;
    (void)finish_task(t, final_state);
  }
  // unregister_memory / close_segment may go ahead once these reach 0
  // (acquire loads there): the slice touches neither afterwards.
  if (t.local_inflight != nullptr) t.local_inflight->fetch_sub(1, std::memory_order_release);
  if (t.segment_inflight != nullptr) t.segment_inflight->fetch_sub(1, std::memory_order_release);
  // Last touch of the batch: free_batch recycles it once inflight is 0
  // (pairs with the acquire load there).
  b.inflight.fetch_sub(1, std::memory_order_release);
}

/// What status calls report for task `t`: the reason and failed path only
/// once it is final (and not COMPLETED).  The path views the table's copy,
/// valid while the table lives.  Any thread.
[[nodiscard]] inline transfer_status status_of(const task_state& t) noexcept {
  // Acquire loads throughout (free on x86): see reset_task.
  transfer_status out;
  out.state = t.state.load(std::memory_order_acquire);
  out.transferred_bytes = t.bytes.load(std::memory_order_acquire);
  if (is_final(out.state) && out.state != transfer_state::completed) {
    out.reason = t.reason.load(std::memory_order_acquire);
    if (const std::string* p = t.failed_path.load(std::memory_order_acquire)) {
      out.failed_local_device = t.failed_device.load(std::memory_order_acquire);
      out.failed_peer_path = *p;
    }
  }
  return out;
}

}  // namespace tide::rdma::detail
