// rdma::batch_table (see the header).
#include <tide/rdma/batch_table.hpp>
#include <tide/rdma/detail/task_telemetry.hpp>

#include <tide/detail/sharded_shared_mutex.hpp>  // cpu_relax

#include <bit>
#include <new>
#include <string>
#include <thread>

namespace tide::rdma {

namespace {
constexpr batch_id make_batch_id(std::uint32_t slot, std::uint64_t generation) noexcept {
  return (generation << 32) | slot;
}
constexpr std::uint64_t generation_of(std::uint64_t tag) noexcept { return tag >> 1; }
constexpr std::uint64_t tag_of(std::uint64_t generation, bool live) noexcept {
  return (generation << 1) | (live ? 1u : 0u);
}
// Generations live in the upper 32 bits of an id; 0 is never handed out, so
// a zeroed id never resolves.
constexpr std::uint64_t next_generation(std::uint64_t g) noexcept {
  const std::uint64_t n = (g + 1) & 0xffffffffu;
  return n == 0 ? 1 : n;
}

// The error paths build their detail strings here; a failed allocation
// still yields the right errc.
error describe(errc code, const char* what, batch_id id) noexcept {
  try {
    return error{code, std::string(what) + std::to_string(id)};
  } catch (...) {
    return error{code, {}};
  }
}
}  // namespace

batch_table::batch_table(std::size_t max_batches, std::size_t max_tasks)
    : max_batches_(max_batches), max_tasks_(max_tasks), slots_(new std::atomic<detail::batch_state*>[max_batches]) {
  for (std::size_t i = 0; i < max_batches; ++i) slots_[i].store(nullptr, std::memory_order_relaxed);
}

result<std::unique_ptr<batch_table>> batch_table::create(std::size_t max_batches, std::size_t max_tasks) {
  if (max_batches == 0 || max_batches > (1u << 24))
    return fail(errc::config_invalid, "max_batches must be 1..2^24, got " + std::to_string(max_batches));
  if (max_tasks == 0 || max_tasks > kMaxTasksLimit)
    return fail(errc::config_invalid, "max_tasks_per_batch must be 1..2^30, got " + std::to_string(max_tasks));
  return std::unique_ptr<batch_table>(new batch_table(max_batches, max_tasks));
}

detail::batch_state* batch_table::lookup(batch_id id) const noexcept {
  const auto slot = static_cast<std::uint32_t>(id & 0xffffffffu);
  if (slot >= max_batches_) return nullptr;
  detail::batch_state* b = slots_[slot].load(std::memory_order_acquire);
  if (b == nullptr || !still(*b, id)) return nullptr;
  return b;
}

std::size_t batch_table::live_batches() const {
  std::lock_guard lock(mu_);
  return slot_count_ - free_slots_.size();
}

result<batch_id> batch_table::allocate(std::size_t capacity) noexcept {
  if (capacity == 0) return fail(errc::capacity_zero, "allocate_batch: capacity 0");
  if (capacity > max_tasks_)
    return fail(errc::batch_too_large, "allocate_batch: capacity " + std::to_string(capacity) + " is above " +
                                           std::to_string(max_tasks_) + " (engine_config::max_tasks_per_batch)");
  try {
    std::lock_guard lock(mu_);
    // Best fit among the free slots: the smallest batch that is big enough.
    std::size_t best = free_slots_.size();
    for (std::size_t i = 0; i < free_slots_.size(); ++i) {
      const detail::batch_state* b = slots_[free_slots_[i]].load(std::memory_order_relaxed);
      if (b->capacity >= capacity &&
          (best == free_slots_.size() || b->capacity < slots_[free_slots_[best]].load(std::memory_order_relaxed)->capacity))
        best = i;
    }
    std::uint32_t slot;
    detail::batch_state* b;
    if (best != free_slots_.size()) {
      slot = free_slots_[best];
      b = slots_[slot].load(std::memory_order_relaxed);
      free_slots_[best] = free_slots_.back();
      free_slots_.pop_back();
    } else {
      const bool fresh = slot_count_ < max_batches_;
      if (!fresh && free_slots_.empty())
        return fail(errc::resource_exhausted, "allocate_batch: all " + std::to_string(max_batches_) +
                                                  " batches are allocated (engine_config::max_batches); "
                                                  "free one or raise the limit");
      // A fresh slot, or a free one whose batch is too small: a new batch,
      // the old one stays owned (all_) because a late worker may touch it.
      all_.reserve(all_.size() + 1);
      // free() pushes without allocating: room for every slot handed out.
      if (fresh) free_slots_.reserve(slot_count_ + 1);
      auto made = std::make_unique<detail::batch_state>(std::bit_ceil(capacity));
      made->meter = &meter_;
      made->paths = &paths_;
      slot = fresh ? static_cast<std::uint32_t>(slot_count_) : free_slots_.back();
      const detail::batch_state* old = slots_[slot].load(std::memory_order_relaxed);
      made->tag.store(old != nullptr ? old->tag.load(std::memory_order_relaxed) : tag_of(0, false),
                      std::memory_order_relaxed);
      b = made.get();
      all_.push_back(std::move(made));
      if (fresh) ++slot_count_;
      else free_slots_.pop_back();
      slots_[slot].store(b, std::memory_order_release);
    }
    const std::uint64_t gen = next_generation(generation_of(b->tag.load(std::memory_order_relaxed)));
    b->tag.store(tag_of(gen, true), std::memory_order_release);
    return make_batch_id(slot, gen);
  } catch (const std::bad_alloc&) {
    return fail(errc::out_of_memory, "allocate_batch: no memory for a batch of " + std::to_string(capacity) + " tasks");
  }
}

status batch_table::free(batch_id id) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "free_batch: unknown batch ", id));
  // A submit in progress on this batch finishes first; a later one sees the dead tag.
  std::lock_guard submit_lock(b->submit_mu);
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "free_batch: unknown batch ", id));
  expire(*b);
  // A task past its deadline (or canceled) is final once its posted WRs
  // have retired: give them a moment, then report what is still out.  Once
  // every task is final, what is still in flight are slices inside
  // retire_slice, between their task's final state and their last touch of
  // the batch: they leave within microseconds unless their thread is
  // preempted, which on a loaded machine can outlast the moment (a free
  // right after wait() was batch_busy, "0 task(s) unfinished, 1 slice(s) in
  // flight"), so they get longer.
  const auto start = std::chrono::steady_clock::now();
  const auto until = start + std::chrono::milliseconds(100);
  const auto until_all_final = start + std::chrono::seconds(10);
  while (b->unfinished.load(std::memory_order_acquire) != 0 || b->inflight.load(std::memory_order_acquire) != 0) {
    const auto now = std::chrono::steady_clock::now();
    const bool all_final = b->unfinished.load(std::memory_order_acquire) == 0;
    if (now > (all_final ? until_all_final : until)) {
      const std::size_t tasks = b->unfinished.load(std::memory_order_acquire);
      const std::size_t slices = b->inflight.load(std::memory_order_acquire);
      try {
        return fail(errc::batch_busy, "free_batch: " + std::to_string(tasks) + " task(s) unfinished, " +
                                          std::to_string(slices) + " slice(s) in flight");
      } catch (...) {
        return fail(error{errc::batch_busy, {}});
      }
    }
    std::this_thread::yield();
  }
  std::lock_guard lock(mu_);
  {
    // Dead from here: lookups of `id` fail; the next allocate bumps the
    // generation.  Under mu (a notifier still inside finish_task leaves
    // first) with the listener's clear, so a watch() racing this free sees
    // the dead tag or has its listener cleared.
    std::lock_guard wl(b->mu);
    const std::uint64_t tag = b->tag.load(std::memory_order_relaxed);
    b->tag.store(tag_of(generation_of(tag), false), std::memory_order_release);
    b->listener = nullptr;
    b->watched.store(false, std::memory_order_relaxed);
  }
  // Before the recycling: a status reader that reads a recycled task's
  // state (recycle_task stores it with release, status_of loads it with
  // acquire) then sees the dead tag when it checks again, instead of
  // reporting the recycled WAITING as its batch's state.
  for (std::size_t i = 0; i < b->used.load(std::memory_order_relaxed); ++i) detail::recycle_task(b->tasks[i]);
  b->used.store(0, std::memory_order_relaxed);
  b->canceled.store(false, std::memory_order_relaxed);
  // allocate reserved room for every slot it handed out: no allocation here.
  free_slots_.push_back(static_cast<std::uint32_t>(id & 0xffffffffu));
  return {};
}

void batch_table::expire(detail::batch_state& b) noexcept {
  const auto now = std::chrono::steady_clock::now();
  const std::size_t n = b.used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    auto& t = b.tasks[i];
    if (!is_final(t.state.load(std::memory_order_acquire)) && now > t.deadline.load(std::memory_order_relaxed))
      detail::stop_task(t, transfer_state::timeout, errc::timed_out);
  }
}

void batch_table::expire_live(detail::batch_state& b, batch_id id) noexcept {
  // free() recycles a batch (and the next owner submits to it) under this
  // mutex: holding it with the tag still `id`'s, every task read is this
  // batch's.  Without it a reader that saw a recycled task's old deadline
  // marked the next owner's task TIMEOUT (review 1ab3d99, finding 1).
  std::unique_lock lock(b.submit_mu, std::try_to_lock);
  if (!lock.owns_lock() || !still(b, id)) return;
  expire(b);
}

result<transfer_status> batch_table::task_status(batch_id id, std::size_t task) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "status: unknown batch ", id));
  if (task >= b->used.load(std::memory_order_acquire))
    return fail(describe(errc::unknown_task, "status: this task was not submitted: ", task));
  auto& t = b->tasks[task];
  // A mark changes no state at once (the last slice's retirement does), so
  // what is read here stays right after it.
  const transfer_status out = detail::status_of(t);
  if (!is_final(out.state) && std::chrono::steady_clock::now() > t.deadline.load(std::memory_order_relaxed))
    expire_live(*b, id);
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "status: batch freed meanwhile: ", id));
  return out;
}

result<transfer_status> batch_table::batch_status(batch_id id) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "status: unknown batch ", id));
  expire_live(*b, id);
  transfer_status out;
  out.state = transfer_state::completed;
  const std::size_t n = b->used.load(std::memory_order_acquire);
  if (n == 0) out.state = transfer_state::waiting;
  bool any_pending = false;
  for (std::size_t i = 0; i < n; ++i) {
    const transfer_status ts = detail::status_of(b->tasks[i]);
    out.transferred_bytes += ts.transferred_bytes;
    if (!is_final(ts.state)) {
      any_pending = true;
    } else if (ts.state != transfer_state::completed && out.state == transfer_state::completed) {
      const std::uint64_t bytes = out.transferred_bytes;
      out = ts;
      out.transferred_bytes = bytes;
    }
  }
  if (any_pending) out.state = transfer_state::pending;
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "status: batch freed meanwhile: ", id));
  return out;
}

result<transfer_telemetry> batch_table::task_telemetry(batch_id id, std::size_t task) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "telemetry: unknown batch ", id));
  if (task >= b->used.load(std::memory_order_acquire))
    return fail(describe(errc::unknown_task, "telemetry: this task was not submitted: ", task));
  const transfer_telemetry out = detail::telemetry_of(b->tasks[task]);
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "telemetry: batch freed meanwhile: ", id));
  return out;
}

result<transfer_telemetry> batch_table::batch_telemetry(batch_id id) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "telemetry: unknown batch ", id));
  transfer_telemetry out;
  const std::size_t n = b->used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) detail::add_telemetry(out, detail::telemetry_of(b->tasks[i]));
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "telemetry: batch freed meanwhile: ", id));
  return out;
}

// Spinning costs a core for as long as it runs: worth it while spins catch
// their batch, a waste where batches outlive it (on a small host, the core
// the transfer itself needs).
bool batch_table::spin_pays() noexcept {
  if (spin_misses_.load(std::memory_order_relaxed) < kSpinMisses) return true;
  return spins_skipped_.fetch_add(1, std::memory_order_relaxed) % kSpinProbe == kSpinProbe - 1;
}

status batch_table::wait(batch_id id, std::chrono::milliseconds timeout, std::chrono::microseconds spin) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "wait: unknown batch ", id));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  // The spin: a futex wake costs about as much as a small transfer's round
  // trip, so a batch that ends soon is caught awake.  The clock is read
  // every 64 polls.  A batch already done needs no spin and teaches nothing.
  if (spin.count() > 0) {
    if (b->unfinished.load(std::memory_order_acquire) != 0 && spin_pays()) {
      const auto spin_until = std::min(deadline, start + spin);
      for (std::uint32_t k = 1; b->unfinished.load(std::memory_order_acquire) != 0; ++k) {
        if ((k & 63) == 0 && std::chrono::steady_clock::now() >= spin_until) break;
        tide::detail::cpu_relax();
      }
      if (b->unfinished.load(std::memory_order_acquire) != 0) {
        spin_misses_.fetch_add(1, std::memory_order_relaxed);
      } else {
        spin_misses_.store(0, std::memory_order_relaxed);
      }
    }
    // Ended while spinning (or before): no lock, so the lane still finishing
    // the last task is not met on mu (a sleep and a wake on a small transfer's path).
    if (b->unfinished.load(std::memory_order_acquire) == 0) {
      if (!still(*b, id)) return fail(describe(errc::unknown_batch, "wait: batch freed meanwhile: ", id));
      return {};
    }
  }
  std::unique_lock lock(b->mu);
  b->sleepers.fetch_add(1, std::memory_order_seq_cst);
  struct awake {
    std::atomic<std::uint32_t>& n;
    ~awake() { n.fetch_sub(1, std::memory_order_relaxed); }
  } leaving{b->sleepers};
  while (b->unfinished.load(std::memory_order_seq_cst) != 0) {
    if (!still(*b, id)) return fail(describe(errc::unknown_batch, "wait: batch freed meanwhile: ", id));
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      try {
        return fail(errc::timed_out, "wait: " + std::to_string(b->unfinished.load()) + " task(s) unfinished after " +
                                         std::to_string(timeout.count()) + " ms");
      } catch (...) {
        return fail(error{errc::timed_out, {}});
      }
    }
    // Wake at least every 100 ms to expire tasks past their own deadline.
    b->cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)));
    lock.unlock();
    expire_live(*b, id);
    lock.lock();
  }
  // Freed (and perhaps handed out again, with nothing pending) since the
  // lookup: that is not this batch ending (review turn 3, finding 21).
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "wait: batch freed meanwhile: ", id));
  return {};
}

status batch_table::cancel(batch_id id) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "cancel: unknown batch ", id));
  // free() recycles a batch under its submit mutex: holding it, a tag that
  // still matches means this is still batch `id`, not the next owner of
  // the same batch_state.
  std::lock_guard submit_lock(b->submit_mu);
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "cancel: batch freed meanwhile: ", id));
  b->canceled.store(true, std::memory_order_release);
  const std::size_t n = b->used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) detail::stop_task(b->tasks[i], transfer_state::canceled, errc::canceled);
  return {};
}

status batch_table::watch(batch_id id, batch_listener* listener) noexcept {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(describe(errc::unknown_batch, "watch: unknown batch ", id));
  std::lock_guard lock(b->mu);
  // Re-checked under mu: free() clears the listener under mu after the tag dies.
  if (!still(*b, id)) return fail(describe(errc::unknown_batch, "watch: batch freed meanwhile: ", id));
  b->listener = listener;
  b->listener_id = id;
  b->watched.store(listener != nullptr, std::memory_order_seq_cst);  // before the load below (see finish_task)
  if (listener != nullptr && b->unfinished.load(std::memory_order_seq_cst) == 0) listener->batch_final(id);
  return {};
}

}  // namespace tide::rdma
