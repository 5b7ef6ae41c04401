#include "core.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <string>

namespace tide::py {
using namespace std::chrono;

namespace {
std::string hex(std::uintptr_t v) {
  char buf[2 * sizeof v];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, 16);
  return {buf, end};
}
}  // namespace

void orphan_list::park(batch_id b) {
  std::lock_guard lock(mu_);
  ids_.push_back(b);
  count_.store(ids_.size(), std::memory_order_relaxed);
}

std::vector<batch_id> orphan_list::reap(engine_iface& e) {
  std::vector<batch_id> ids;
  {
    std::lock_guard lock(mu_);
    ids.swap(ids_);
  }
  std::vector<batch_id> left;
  for (const batch_id b : ids) {
    // wait(0) first: free_batch of an unfinished batch would spin for its 100 ms.
    const auto final = e.wait(b, milliseconds(0));
    if (!final && final.error().code == errc::timed_out) {
      left.push_back(b);
      continue;
    }
    if (!final) continue;  // unknown: freed by someone else
    if (auto r = e.free_batch(b); !r && r.error().code == errc::batch_busy) left.push_back(b);
  }
  std::lock_guard lock(mu_);
  ids_.insert(ids_.end(), left.begin(), left.end());
  count_.store(ids_.size(), std::memory_order_relaxed);
  return ids_;
}

std::vector<batch_id> orphan_list::take_all() {
  std::lock_guard lock(mu_);
  count_.store(0, std::memory_order_relaxed);
  return std::exchange(ids_, {});
}

status watch_table::watch(engine_iface& e, batch_id b, const std::shared_ptr<completion_queue>& q) {
  {
    // Recorded before the engine may call q: forget() must find every watch.
    std::lock_guard lock(mu_);
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const entry& x) { return x.queue == q; });
    if (it == entries_.end()) it = entries_.insert(entries_.end(), entry{q, {}});
    if (std::find(it->batches.begin(), it->batches.end(), b) == it->batches.end()) it->batches.push_back(b);
  }
  auto r = e.watch_batch(b, q.get());
  if (!r) (void)unwatch(e, b);
  return r;
}

status watch_table::unwatch(engine_iface& e, batch_id b) {
  auto r = e.watch_batch(b, nullptr);
  std::lock_guard lock(mu_);
  for (auto& x : entries_) std::erase(x.batches, b);
  return r;
}

void watch_table::forget(engine_iface& e, const std::shared_ptr<completion_queue>& q) {
  std::vector<batch_id> batches;
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(entries_.begin(), entries_.end(), [&](const entry& x) { return x.queue == q; });
    if (it == entries_.end()) return;
    batches = std::move(it->batches);
    entries_.erase(it);
  }
  // `q` (the caller's reference) keeps the listener alive until these return;
  // afterwards the engine never calls it again.
  for (const batch_id b : batches) (void)e.watch_batch(b, nullptr);
}

std::size_t watch_table::queues() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

managed_blocks::~managed_blocks() {
  for (const auto& [addr, len] : blocks_) ::munmap(as_pointer(addr), len);
}

result<std::uintptr_t> managed_blocks::allocate(engine_iface& e, std::size_t length) {
  const std::size_t len = std::max<std::size_t>(length, 1);
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(errc::out_of_memory, std::string("mmap: ") + std::strerror(errno));
  if (auto r = e.register_memory(p, len, "*", buffer_access::remote_read_write); !r) {
    ::munmap(p, len);
    return fail(r.error());
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard lock(mu_);
  blocks_.emplace(addr, len);
  return addr;
}

status managed_blocks::free(engine_iface& e, std::uintptr_t addr) {
  std::size_t len = 0;
  {
    // Taken out while it unregisters: a second free of it fails at once.
    std::lock_guard lock(mu_);
    auto it = blocks_.find(addr);
    if (it == blocks_.end())
      return fail(errc::not_registered, "free_managed_buffer: 0x" + hex(addr) + " is not a managed buffer");
    len = it->second;
    blocks_.erase(it);
  }
  if (auto r = e.unregister_memory(as_pointer(addr), in_flight::drain); !r) {
    // Still registered (transfers did not drain in time): keep it mapped.
    std::lock_guard lock(mu_);
    blocks_.emplace(addr, len);
    return r;
  }
  ::munmap(as_pointer(addr), len);
  return {};
}

void async_deadlines::put(batch_id b, steady_clock::time_point deadline) {
  std::lock_guard lock(mu_);
  by_batch_[b] = deadline;
}

std::optional<steady_clock::time_point> async_deadlines::take(batch_id b) {
  std::lock_guard lock(mu_);
  auto it = by_batch_.find(b);
  if (it == by_batch_.end()) return std::nullopt;
  const auto d = it->second;
  by_batch_.erase(it);
  return d;
}

}  // namespace tide::py
