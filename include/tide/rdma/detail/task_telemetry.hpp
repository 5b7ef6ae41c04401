#pragma once
/// The data path's telemetry stamps on a task (see <tide/telemetry.hpp>)
/// and how they are read back.  Not API.
///
///  - start_telemetry: the submitting thread, while planning (before the
///    task is published by the batch's `used`).
///  - note_posted: the lane, for the head and every rider of each WR it
///    hands to ibv_post_send (one clock read per post call).
///  - note_retry: on_failed, before a slice is dispatched again.
///  - finish_task (batch.hpp) stamps the completion and feeds the meter.
///  - telemetry_of: any thread; complete once the state reads final.

#include <tide/rdma/detail/batch.hpp>
#include <tide/telemetry.hpp>

#include <chrono>

namespace tide::rdma::detail {

inline void start_telemetry(task_state& t, transfer_op op, std::uint64_t length, std::int64_t now_ns) noexcept {
  t.submit_ns.store(now_ns, std::memory_order_relaxed);
  t.first_post_ns.store(0, std::memory_order_relaxed);
  t.done_ns.store(0, std::memory_order_relaxed);
  t.length.store(length, std::memory_order_relaxed);
  t.op.store(op, std::memory_order_relaxed);
  t.wrs.store(0, std::memory_order_relaxed);
  t.retries.store(0, std::memory_order_relaxed);
  t.local_nics.store(0, std::memory_order_relaxed);
  t.peer_nics.store(0, std::memory_order_relaxed);
  t.transports.store(0, std::memory_order_relaxed);
}

inline void note_transport(task_state& t, std::uint8_t bit) noexcept {
  if ((t.transports.load(std::memory_order_relaxed) & bit) == 0) t.transports.fetch_or(bit, std::memory_order_relaxed);
}

/// One WR carrying bytes of `t` goes to the NIC on (local_device, peer_device).
inline void note_posted(task_state& t, std::uint16_t local_device, std::uint16_t peer_device,
                        std::int64_t now_ns) noexcept {
  if (t.first_post_ns.load(std::memory_order_relaxed) == 0) {
    std::int64_t none = 0;
    (void)t.first_post_ns.compare_exchange_strong(none, now_ns, std::memory_order_relaxed);
  }
  t.wrs.fetch_add(1, std::memory_order_relaxed);
  // Loads first: after the first WR the bits are set and nothing is written.
  const std::uint32_t lbit = local_device < 32 ? 1u << local_device : 0u;
  if ((t.local_nics.load(std::memory_order_relaxed) & lbit) != lbit)
    t.local_nics.fetch_or(lbit, std::memory_order_relaxed);
  const std::uint64_t pbit = std::uint64_t{1} << (peer_device < 63 ? peer_device : 63);
  if ((t.peer_nics.load(std::memory_order_relaxed) & pbit) == 0) t.peer_nics.fetch_or(pbit, std::memory_order_relaxed);
  note_transport(t, transfer_telemetry::kViaRdma);
}

/// The WR headed by `s` goes to another transport (detail/carrier.hpp):
/// its tasks' first post, WR count and transport bit.
inline void note_carried_wr(const slice& s, std::int64_t now_ns) noexcept {
  for (const slice* x = &s; x != nullptr; x = x->rider) {
    task_state& t = *x->task;
    if (t.first_post_ns.load(std::memory_order_relaxed) == 0) {
      std::int64_t none = 0;
      (void)t.first_post_ns.compare_exchange_strong(none, now_ns, std::memory_order_relaxed);
    }
    t.wrs.fetch_add(1, std::memory_order_relaxed);
    note_transport(t, transfer_telemetry::kViaTcp);
  }
}

/// note_posted for the WR headed by `s`: its own task and every rider's.
inline void note_posted_wr(const slice& s, std::int64_t now_ns) noexcept {
  note_posted(*s.task, s.local_device, s.peer_device, now_ns);
  for (const slice* r = s.rider; r != nullptr; r = r->rider)
    note_posted(*r->task, s.local_device, s.peer_device, now_ns);
}

inline void note_retry(task_state& t) noexcept { t.retries.fetch_add(1, std::memory_order_relaxed); }

[[nodiscard]] inline transfer_telemetry::time_point from_ns(std::int64_t ns) noexcept {
  return ns == 0 ? transfer_telemetry::time_point{}
                 : transfer_telemetry::time_point{std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::nanoseconds{ns})};
}

[[nodiscard]] inline transfer_telemetry telemetry_of(const task_state& t) noexcept {
  transfer_telemetry out;
  out.state = t.state.load(std::memory_order_acquire);  // first: publishes done_ns
  out.submit = from_ns(t.submit_ns.load(std::memory_order_relaxed));
  out.first_post = from_ns(t.first_post_ns.load(std::memory_order_relaxed));
  out.completion = is_final(out.state) ? from_ns(t.done_ns.load(std::memory_order_relaxed)) : transfer_telemetry::time_point{};
  out.bytes = t.length.load(std::memory_order_relaxed);
  out.transferred_bytes = t.bytes.load(std::memory_order_relaxed);
  out.wrs = t.wrs.load(std::memory_order_relaxed);
  out.retries = t.retries.load(std::memory_order_relaxed);
  out.tasks = 1;
  out.local_nics = t.local_nics.load(std::memory_order_relaxed);
  out.peer_nics = t.peer_nics.load(std::memory_order_relaxed);
  out.transports = t.transports.load(std::memory_order_relaxed);
  if (is_final(out.state) && out.state != transfer_state::completed) out.reason = t.reason.load(std::memory_order_relaxed);
  return out;
}

/// Folds task telemetry `t` into batch telemetry `b` (b.tasks == 0: the first).
inline void add_telemetry(transfer_telemetry& b, const transfer_telemetry& t) noexcept {
  const bool first = b.tasks == 0;
  const bool all_final_before = first || b.completion != transfer_telemetry::time_point{};
  if (first || (t.submit != transfer_telemetry::time_point{} && t.submit < b.submit)) b.submit = t.submit;
  if (t.first_post != transfer_telemetry::time_point{} &&
      (b.first_post == transfer_telemetry::time_point{} || t.first_post < b.first_post))
    b.first_post = t.first_post;
  // The latest completion, once every task has one.
  if (!all_final_before || t.completion == transfer_telemetry::time_point{}) b.completion = {};
  else if (first || t.completion > b.completion) b.completion = t.completion;
  b.bytes += t.bytes;
  b.transferred_bytes += t.transferred_bytes;
  b.wrs += t.wrs;
  b.retries += t.retries;
  b.tasks += 1;
  b.local_nics |= t.local_nics;
  b.peer_nics |= t.peer_nics;
  b.transports |= t.transports;
  if (b.reason == errc::ok) b.reason = t.reason;
  // The batch's state as batch_status: pending while any is, else the first
  // task that did not complete.
  if (first) b.state = t.state;
  else if (!is_final(t.state) || !is_final(b.state)) b.state = transfer_state::pending;
  else if (b.state == transfer_state::completed) b.state = t.state;
}

}  // namespace tide::rdma::detail
