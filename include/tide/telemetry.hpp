#pragma once
/// Per-request telemetry and latency histograms.
///
/// Every task records, on the data path: when it was submitted (planned),
/// when its first WR went to ibv_post_send, when it turned final, the WRs
/// that carried its bytes (retries included), its retries, and the rails it
/// used (local NICs and peer NICs as bitmasks).  When a task turns final its
/// latency (final - submit) goes into the histogram of its op and size
/// class, and a task that did not complete counts under its reason.
///
/// Cost: two steady_clock reads per task (plan, final) and one per
/// ibv_post_send call (up to 32 WRs), relaxed atomics on the task's own
/// cache lines and on one histogram bucket; no lock, no allocation.
///
/// Threads: every reader (engine->task_telemetry, batch_telemetry,
/// transfer_meter::snapshot) may run on any thread at any time.  A task's
/// telemetry is complete once status_of reports it final; before that
/// `completion` is zero and the counters are partial.  The histograms are
/// per-bucket relaxed atomics: a snapshot taken during traffic may hold a
/// task in its bucket but not yet in its sum (never the other way round for
/// the count, which the formatter derives from the buckets).

#include <tide/errc.hpp>
#include <tide/transfer.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace tide {

/// What engine->task_telemetry / batch_telemetry return.  Times are on the
/// steady clock; a zero time_point means "not yet" (first_post: nothing
/// posted, e.g. every slice was dropped or failed before posting;
/// completion: not final).  For a batch: the earliest submit and first post,
/// the latest completion (zero until every task is final), sums and unions.
struct transfer_telemetry {
  using time_point = std::chrono::steady_clock::time_point;
  time_point submit{};
  time_point first_post{};
  time_point completion{};
  std::uint64_t bytes = 0;              ///< requested length
  std::uint64_t transferred_bytes = 0;  ///< bytes whose WRs completed
  std::uint32_t wrs = 0;                ///< WRs that carried its bytes (a retry is one more)
  std::uint32_t retries = 0;            ///< slices sent again after a failure
  std::uint32_t tasks = 0;              ///< 1 for a task; submitted tasks for a batch
  /// Local NICs used: bit i = the transport's context i (transport().context(i)).
  std::uint32_t local_nics = 0;
  /// Peer NICs used: bit i = index i of the peer's devices[]; bit 63 also
  /// stands for every index above it.
  std::uint64_t peer_nics = 0;
  /// Which transports carried its bytes: kViaRdma, kViaTcp (both when a
  /// slice failed over from RDMA to TCP).
  std::uint8_t transports = 0;
  static constexpr std::uint8_t kViaRdma = 1;
  static constexpr std::uint8_t kViaTcp = 2;
  transfer_state state = transfer_state::waiting;
  errc reason = errc::ok;  ///< as transfer_status::reason (first non-ok task for a batch)

  /// completion - submit (zero until final).
  [[nodiscard]] std::chrono::nanoseconds latency() const noexcept {
    return completion == time_point{} ? std::chrono::nanoseconds{0} : completion - submit;
  }
};

/// A latency histogram: log-scale buckets (1-2-5 per decade) from 1 us to
/// 10 s, plus +Inf.  record() is lock-free (one relaxed add on a bucket and
/// one on the sum).  Any thread.
class latency_histogram {
 public:
  /// Upper bounds in nanoseconds (Prometheus' `le`, inclusive).
  static constexpr std::array<std::int64_t, 22> kBoundsNs = {
      1'000,       2'000,       5'000,       10'000,        20'000,        50'000,
      100'000,     200'000,     500'000,     1'000'000,     2'000'000,     5'000'000,
      10'000'000,  20'000'000,  50'000'000,  100'000'000,   200'000'000,   500'000'000,
      1'000'000'000, 2'000'000'000, 5'000'000'000, 10'000'000'000};
  static constexpr std::size_t kBuckets = kBoundsNs.size() + 1;  ///< the last one is +Inf

  /// Bucket counts (not cumulative), the sum of the observations (ns).
  struct snapshot {
    std::array<std::uint64_t, kBuckets> buckets{};
    std::uint64_t sum_ns = 0;
    [[nodiscard]] std::uint64_t count() const noexcept {
      std::uint64_t n = 0;
      for (auto b : buckets) n += b;
      return n;
    }
    /// The upper bound (ns) of the bucket holding quantile q (0..1); -1 for
    /// +Inf, 0 when empty.  An estimate to the bucket's resolution.
    [[nodiscard]] std::int64_t quantile_bound_ns(double q) const noexcept {
      const std::uint64_t n = count();
      if (n == 0) return 0;
      // The rank of the q-quantile, 1-based, at least 1.
      auto rank = static_cast<std::uint64_t>(q * static_cast<double>(n) + 0.999999);
      if (rank == 0) rank = 1;
      std::uint64_t seen = 0;
      for (std::size_t i = 0; i < kBuckets; ++i) {
        seen += buckets[i];
        if (seen >= rank) return i < kBoundsNs.size() ? kBoundsNs[i] : -1;
      }
      return -1;
    }
  };

  [[nodiscard]] static constexpr std::size_t bucket_of(std::int64_t ns) noexcept {
    std::size_t i = 0;
    while (i < kBoundsNs.size() && ns > kBoundsNs[i]) ++i;
    return i;
  }
  void record(std::int64_t ns) noexcept {
    if (ns < 0) ns = 0;
    buckets_[bucket_of(ns)].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(static_cast<std::uint64_t>(ns), std::memory_order_relaxed);
  }
  [[nodiscard]] snapshot read() const noexcept {
    snapshot s;
    for (std::size_t i = 0; i < kBuckets; ++i) s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kBuckets> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

/// Size classes of the histograms: <= 4 KiB, <= 64 KiB, <= 1 MiB, larger.
inline constexpr std::array<std::uint64_t, 3> kSizeClassBounds = {4096, 65536, 1u << 20};
inline constexpr std::size_t kSizeClasses = kSizeClassBounds.size() + 1;
[[nodiscard]] constexpr std::size_t size_class_of(std::uint64_t bytes) noexcept {
  std::size_t i = 0;
  while (i < kSizeClassBounds.size() && bytes > kSizeClassBounds[i]) ++i;
  return i;
}
/// The label value of size class i ("4KiB", "64KiB", "1MiB", "inf").
[[nodiscard]] constexpr std::string_view size_class_name(std::size_t i) noexcept {
  constexpr std::array<std::string_view, kSizeClasses> names = {"4KiB", "64KiB", "1MiB", "inf"};
  return i < names.size() ? names[i] : "?";
}

/// Dense index of an errc (group * 32 + offset in the group); kErrcSlots of them.
inline constexpr std::size_t kErrcSlots = 5 * 32;
[[nodiscard]] constexpr std::size_t errc_slot(errc e) noexcept {
  const int v = static_cast<int>(e);
  const std::size_t s = static_cast<std::size_t>(v / 100) * 32 + static_cast<std::size_t>(v % 100);
  return s < kErrcSlots ? s : 0;
}

/// The engine-wide roll-up of final tasks: latency per op and size class,
/// tasks per final state, failed tasks per reason.  One per transport
/// (owned by its batch_table); every batch points at it.  Any thread.
class transfer_meter {
 public:
  /// Final states in the order of `finals` (completed, failed, timeout, canceled).
  static constexpr std::array<transfer_state, 4> kFinalStates = {transfer_state::completed, transfer_state::failed,
                                                                 transfer_state::timeout, transfer_state::canceled};

  struct snapshot {
    /// [op][size class], op 0 = read, 1 = write (transfer_op's values).
    std::array<std::array<latency_histogram::snapshot, kSizeClasses>, 2> latency{};
    std::array<std::uint64_t, 4> finals{};
    std::array<std::uint64_t, kErrcSlots> reasons{};  ///< by errc_slot
    /// Final tasks whose bytes went (at least partly) over RDMA, over TCP.
    std::array<std::uint64_t, 2> carried{};
  };

  /// `transports`: transfer_telemetry::kViaRdma / kViaTcp bits of the task.
  void record(transfer_op op, std::uint64_t length, std::int64_t latency_ns, transfer_state final_state, errc reason,
              std::uint8_t transports = 0) noexcept {
    latency_[op == transfer_op::read ? 0 : 1][size_class_of(length)].record(latency_ns);
    for (std::size_t i = 0; i < kFinalStates.size(); ++i)
      if (kFinalStates[i] == final_state) finals_[i].fetch_add(1, std::memory_order_relaxed);
    if (final_state != transfer_state::completed) reasons_[errc_slot(reason)].fetch_add(1, std::memory_order_relaxed);
    if ((transports & transfer_telemetry::kViaRdma) != 0) carried_[0].fetch_add(1, std::memory_order_relaxed);
    if ((transports & transfer_telemetry::kViaTcp) != 0) carried_[1].fetch_add(1, std::memory_order_relaxed);
  }
  [[nodiscard]] snapshot read() const noexcept {
    snapshot s;
    for (std::size_t o = 0; o < 2; ++o)
      for (std::size_t c = 0; c < kSizeClasses; ++c) s.latency[o][c] = latency_[o][c].read();
    for (std::size_t i = 0; i < finals_.size(); ++i) s.finals[i] = finals_[i].load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < kErrcSlots; ++i) s.reasons[i] = reasons_[i].load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < carried_.size(); ++i) s.carried[i] = carried_[i].load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::array<std::array<latency_histogram, kSizeClasses>, 2> latency_{};
  std::array<std::atomic<std::uint64_t>, 4> finals_{};
  std::array<std::atomic<std::uint64_t>, kErrcSlots> reasons_{};
  std::array<std::atomic<std::uint64_t>, 2> carried_{};
};

}  // namespace tide
