// rdma::batch_table (see the header).
#include <tide/rdma/batch_table.hpp>

#include <string>
#include <thread>

namespace tide::rdma {

result<std::unique_ptr<batch_table>> batch_table::create(std::size_t max_batches) {
  if (max_batches == 0 || max_batches > (1u << 24))
    return fail(errc::config_invalid, "max_batches must be 1..2^24");
  return std::unique_ptr<batch_table>(new batch_table(max_batches));
}

namespace {
batch_id make_batch_id(std::uint32_t slot, std::uint64_t generation) noexcept {
  return (generation << 32) | slot;
}
}  // namespace

detail::batch_state* batch_table::lookup(batch_id id) const noexcept {
  const auto slot = static_cast<std::uint32_t>(id & 0xffffffffu);
  if (slot >= max_batches_) return nullptr;
  detail::batch_state* b = slots_[slot].get();
  if (b == nullptr || !b->live.load(std::memory_order_acquire) || b->generation != (id >> 32)) return nullptr;
  return b;
}

result<batch_id> batch_table::allocate(std::size_t capacity) {
  if (capacity == 0) return fail(errc::capacity_zero, "allocate_batch: capacity 0");
  std::lock_guard lock(mu_);
  // Reuse a free slot whose batch is big enough (the bench allocates one size over and over).
  for (std::size_t i = free_slots_.size(); i-- > 0;) {
    detail::batch_state* b = slots_[free_slots_[i]].get();
    if (b->capacity >= capacity && b->capacity <= capacity * 2) {
      const std::uint32_t slot = free_slots_[i];
      free_slots_.erase(free_slots_.begin() + static_cast<std::ptrdiff_t>(i));
      b->live.store(true, std::memory_order_release);
      return make_batch_id(slot, b->generation);
    }
  }
  std::uint32_t slot;
  if (slot_count_ < max_batches_) {
    slot = static_cast<std::uint32_t>(slot_count_++);
  } else if (!free_slots_.empty()) {
    slot = free_slots_.front();  // too small: replace it
    free_slots_.erase(free_slots_.begin());
  } else {
    return fail(errc::resource_exhausted, "allocate_batch: " + std::to_string(max_batches_) + " batches alive");
  }
  const std::uint64_t gen = slots_[slot] ? slots_[slot]->generation + 1 : 1;
  slots_[slot] = std::make_unique<detail::batch_state>(capacity);
  slots_[slot]->generation = gen;
  slots_[slot]->live.store(true, std::memory_order_release);
  return make_batch_id(slot, gen);
}

status batch_table::free(batch_id id) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "free_batch: unknown batch " + std::to_string(id));
  if (b->unfinished.load(std::memory_order_acquire) != 0) expire(*b);
  if (b->unfinished.load(std::memory_order_acquire) != 0)
    return fail(errc::batch_busy, "free_batch: " + std::to_string(b->unfinished.load()) + " task(s) unfinished");
  // The worker retiring the last slice drops `inflight` right after finishing its task.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (b->inflight.load(std::memory_order_acquire) != 0) {
    if (std::chrono::steady_clock::now() > until)
      return fail(errc::batch_busy, "free_batch: " + std::to_string(b->inflight.load()) +
                                        " slice(s) of finished tasks still in flight");
    std::this_thread::yield();
  }
  std::lock_guard lock(mu_);
  {
    std::lock_guard wl(b->mu);  // a notifier still inside finish_task leaves first
  }
  for (std::size_t i = 0; i < b->used.load(std::memory_order_relaxed); ++i) {
    auto& t = b->tasks[i];
    t.keep_alive.reset();
    t.state.store(transfer_state::waiting, std::memory_order_relaxed);
  }
  b->used.store(0, std::memory_order_relaxed);
  b->canceled.store(false, std::memory_order_relaxed);
  b->live.store(false, std::memory_order_release);
  ++b->generation;
  free_slots_.push_back(static_cast<std::uint32_t>(id & 0xffffffffu));
  return {};
}

void batch_table::expire(detail::batch_state& b) noexcept {
  const auto now = std::chrono::steady_clock::now();
  const std::size_t n = b.used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    auto& t = b.tasks[i];
    if (!is_final(t.state.load(std::memory_order_acquire)) && now > t.deadline) {
      t.reason.store(errc::timed_out, std::memory_order_relaxed);
      (void)detail::finish_task(t, transfer_state::timeout);
    }
  }
}

result<transfer_status> batch_table::task_status(batch_id id, std::size_t task) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "status: unknown batch " + std::to_string(id));
  if (task >= b->used.load(std::memory_order_acquire))
    return fail(errc::unknown_task, "status: task " + std::to_string(task) + " was not submitted");
  auto& t = b->tasks[task];
  auto st = t.state.load(std::memory_order_acquire);
  if (!is_final(st) && std::chrono::steady_clock::now() > t.deadline) {
    t.reason.store(errc::timed_out, std::memory_order_relaxed);
    (void)detail::finish_task(t, transfer_state::timeout);
    st = t.state.load(std::memory_order_acquire);
  }
  return transfer_status{st, t.bytes.load(std::memory_order_relaxed),
                         st == transfer_state::completed ? errc::ok : t.reason.load(std::memory_order_relaxed)};
}

result<transfer_status> batch_table::batch_status(batch_id id) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "status: unknown batch " + std::to_string(id));
  expire(*b);
  transfer_status out{transfer_state::completed, 0, errc::ok};
  const std::size_t n = b->used.load(std::memory_order_acquire);
  if (n == 0) out.state = transfer_state::waiting;
  bool any_pending = false;
  for (std::size_t i = 0; i < n; ++i) {
    auto& t = b->tasks[i];
    const auto st = t.state.load(std::memory_order_acquire);
    out.transferred_bytes += t.bytes.load(std::memory_order_relaxed);
    if (!is_final(st)) any_pending = true;
    else if (st != transfer_state::completed && out.state == transfer_state::completed) {
      out.state = st;
      out.reason = t.reason.load(std::memory_order_relaxed);
    }
  }
  if (any_pending) out.state = transfer_state::pending;
  return out;
}

status batch_table::wait(batch_id id, std::chrono::milliseconds timeout) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "wait: unknown batch " + std::to_string(id));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(b->mu);
  while (b->unfinished.load(std::memory_order_acquire) != 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return fail(errc::timed_out, "wait: " + std::to_string(b->unfinished.load()) + " task(s) unfinished after " +
                                       std::to_string(timeout.count()) + " ms");
    // Wake at least every 100 ms to expire tasks past their own deadline.
    b->cv.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)));
    lock.unlock();
    expire(*b);
    lock.lock();
  }
  return {};
}

status batch_table::cancel(batch_id id) {
  detail::batch_state* b = lookup(id);
  if (b == nullptr) return fail(errc::unknown_batch, "cancel: unknown batch " + std::to_string(id));
  b->canceled.store(true, std::memory_order_release);
  const std::size_t n = b->used.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < n; ++i) {
    b->tasks[i].reason.store(errc::canceled, std::memory_order_relaxed);
    (void)detail::finish_task(b->tasks[i], transfer_state::canceled);
  }
  return {};
}


}  // namespace tide::rdma
