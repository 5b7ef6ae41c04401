#pragma once
/// Per-NIC load and counters: bytes in flight, bytes and WRs completed,
/// errors, and the NIC's estimated bandwidth.  What load_aware scores with,
/// and what engine->stats() reports.
///
/// Bandwidth: before any sample, the port's rate from sysfs (speed x width,
/// "100 Gb/sec (4X EDR)").  Then samples: when the NIC runs dry, the
/// bytes of the whole busy period over its length (exact: nothing of it is
/// in flight any more).  Inside a long busy period, windows: a window opens
/// at the later of the NIC's previous completion and the moment its
/// in-flight bytes last rose from zero (an idle NIC is not a slow one; a
/// WR dispatched late into a busy NIC does not shorten the window, or the
/// older WRs that complete with it would count as moved in no time: a
/// 50 Mbit/s link read as 50-190 MB/s that way) and gathers the bytes
/// completed.  It closes as a sample (bytes / length) at the end of a burst
/// of completions, once it is kMinBusyWindow long and holds more bytes
/// than are in flight (which may have moved in it unreported).  Single
/// completions are not samples: a signaled completion
/// retires the unsignaled WRs before it within microseconds, and
/// per-completion intervals read as tens of GB/s (a 50 Mbit/s rail was
/// estimated at the 100 Gb/s clamp that way).  The first sample replaces
/// the prior (a port rate can be wrong by 100x, as Soft-RoCE's is); later
/// ones enter an EWMA with weight 1/8.
///
/// Threads: one nic_load per local NIC, owned by the transport; every
/// member may be called from any thread.  Counters are relaxed atomics
/// (statistics); the window is under a mutex (one uncontended lock per
/// completed WR).

#include <tide/rdma/plan/rail_health.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

namespace tide::rdma::plan {

class nic_load {
 public:
  static constexpr double kWeight = 0.125;  ///< of a new sample in the EWMA
  static constexpr std::int64_t kMinWindowNs = 1'000'000;  ///< a busy period shorter than 1 ms is no sample
  /// A window inside a busy period spans at least 1 s: one signaled
  /// completion may retire megabytes moved over the whole window.
  static constexpr std::int64_t kMinBusyWindowNs = 1'000'000'000;
  static constexpr std::int64_t kBurstGapNs = 50'000;      ///< completions further apart start a new burst

  /// `prior_bps`: bytes per second assumed before the first sample (> 0).
  explicit nic_load(double prior_bps = 12.5e9) noexcept : prior_(prior_bps > 0 ? prior_bps : 12.5e9) {
    bw_.store(std::bit_cast<std::uint64_t>(prior_), std::memory_order_relaxed);
  }

  /// Sets the prior (and the estimate) before any traffic.  Setup path.
  void set_prior(double prior_bps) noexcept {
    prior_ = prior_bps > 0 ? prior_bps : 12.5e9;
    bw_.store(std::bit_cast<std::uint64_t>(prior_), std::memory_order_relaxed);
  }

  /// A WR of `bytes` was handed to a lane at `now_ns` (steady clock).
  void dispatched(std::uint64_t bytes, std::int64_t now_ns) noexcept {
    if (inflight_.fetch_add(bytes, std::memory_order_relaxed) == 0) busy_since_ns_.store(now_ns, std::memory_order_relaxed);
    wrs_.fetch_add(1, std::memory_order_relaxed);
    inflight_wrs_.fetch_add(1, std::memory_order_relaxed);
  }
  /// A dispatched WR left without completing on the wire (failed, canceled, dropped).
  void released(std::uint64_t bytes, bool error) noexcept {
    inflight_.fetch_sub(bytes, std::memory_order_relaxed);
    inflight_wrs_.fetch_sub(1, std::memory_order_relaxed);
    if (error) errors_.fetch_add(1, std::memory_order_relaxed);
  }
  /// A dispatched WR completed successfully at `now_ns` (steady clock).
  void completed(std::uint64_t bytes, std::int64_t now_ns) noexcept {
    const std::uint64_t left = inflight_.fetch_sub(bytes, std::memory_order_relaxed) - bytes;
    inflight_wrs_.fetch_sub(1, std::memory_order_relaxed);
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
    double bps = 0, dry_bps = 0;
    {
      std::lock_guard lock(window_mu_);
      const std::int64_t busy_since = busy_since_ns_.load(std::memory_order_relaxed);
      if (busy_since != period_start_ns_) {  // a new busy period
        period_start_ns_ = busy_since;
        period_bytes_ = 0;
      }
      period_bytes_ += bytes;
      if (left == 0) {
        // Ran dry: every byte of the busy period is done, so bytes / its
        // length is exact, whatever the signaling let us see in between
        // (dropped when too short to mean anything).
        if (now_ns - busy_since >= kMinWindowNs)
          dry_bps = static_cast<double>(period_bytes_) * 1e9 / static_cast<double>(now_ns - busy_since);
        window_bytes_ = 0;
      } else {
        // A new burst of completions ends the window with the previous one,
        // once it is long and holds more bytes than are still in flight:
        // those may have moved in it too, unreported (sparse signaling).
        if (window_bytes_ != 0 && now_ns - last_done_ns_ > kBurstGapNs &&
            last_done_ns_ - window_start_ns_ >= kMinBusyWindowNs && left + bytes <= window_bytes_) {
          bps = static_cast<double>(window_bytes_) * 1e9 / static_cast<double>(last_done_ns_ - window_start_ns_);
          window_bytes_ = 0;
        }
        if (window_bytes_ == 0) window_start_ns_ = std::max(last_done_ns_, busy_since);
        window_bytes_ += bytes;
      }
      last_done_ns_ = now_ns;
    }
    if (bps > 0) sample(bps);
    if (dry_bps > 0) sample(dry_bps);
  }
  /// Folds one bandwidth sample (bytes/s) into the estimate.
  void sample(double bps) noexcept {
    const bool first = !sampled_.exchange(true, std::memory_order_relaxed);
    std::uint64_t cur = bw_.load(std::memory_order_relaxed);
    for (;;) {
      const double old = std::bit_cast<double>(cur);
      double next = first ? bps : old + kWeight * (bps - old);
      // Keep a NIC that looked slow once from being starved forever, and a spike bounded.
      if (next < prior_ * 1e-4) next = prior_ * 1e-4;
      if (next > prior_ * 10) next = prior_ * 10;
      if (bw_.compare_exchange_weak(cur, std::bit_cast<std::uint64_t>(next), std::memory_order_relaxed)) return;
    }
  }
  /// Sets the estimate (tests, synthetic rails).
  void set_bandwidth(double bps) noexcept { bw_.store(std::bit_cast<std::uint64_t>(bps), std::memory_order_relaxed); }

  [[nodiscard]] std::uint64_t inflight_bytes() const noexcept { return inflight_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t inflight_wrs() const noexcept { return inflight_wrs_.load(std::memory_order_relaxed); }
  [[nodiscard]] double bandwidth() const noexcept { return std::bit_cast<double>(bw_.load(std::memory_order_relaxed)); }
  [[nodiscard]] double prior_bandwidth() const noexcept { return prior_; }
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t wrs() const noexcept { return wrs_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t errors() const noexcept { return errors_.load(std::memory_order_relaxed); }

 private:
  double prior_;
  std::atomic<std::uint64_t> inflight_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> wrs_{0};
  std::atomic<std::uint64_t> inflight_wrs_{0};
  std::atomic<std::uint64_t> errors_{0};
  std::atomic<std::uint64_t> bw_{0};  ///< a double's bits
  std::atomic<bool> sampled_{false};
  std::atomic<std::int64_t> busy_since_ns_{0};  ///< when inflight_ last rose from 0
  std::mutex window_mu_;
  std::int64_t window_start_ns_ = 0;  // under window_mu_
  std::uint64_t window_bytes_ = 0;    // under window_mu_
  std::int64_t period_start_ns_ = -1; // under window_mu_: the busy period period_bytes_ counts
  std::uint64_t period_bytes_ = 0;    // under window_mu_
  std::int64_t last_done_ns_ = 0;     // under window_mu_
};

/// Bytes per second of a port rate as sysfs prints it ("100 Gb/sec (4X
/// EDR)", "2.5 Gb/sec (1X SDR)"); 0 when the text does not start with a
/// number of Gb/sec.
[[nodiscard]] inline double rate_text_to_bps(std::string_view text) noexcept {
  double gbit = 0;
  double scale = 1;
  bool digits = false, dot = false;
  std::size_t i = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      if (dot) {
        scale /= 10;
        gbit += (c - '0') * scale;
      } else {
        gbit = gbit * 10 + (c - '0');
      }
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits || text.substr(i).find("Gb/sec") == std::string_view::npos) return 0;
  return gbit * 1e9 / 8;
}

/// One local NIC in engine->stats().
struct nic_stats {
  std::string name;
  std::uint64_t bytes = 0;           ///< completed payload bytes
  std::uint64_t wrs = 0;             ///< WRs dispatched
  std::uint64_t errors = 0;          ///< WRs that failed on this NIC
  std::uint64_t inflight_bytes = 0;  ///< dispatched, not yet completed
  double bandwidth_bps = 0;          ///< current estimate (bytes/s)
  double prior_bps = 0;              ///< the port's rate (bytes/s)
  std::uint64_t inflight_wrs = 0;    ///< dispatched, not yet completed or released
  std::uint64_t staged_bytes = 0;    ///< payload copied through its lanes' stage chunks
};

/// One rail that has ever failed, in engine->stats().
struct rail_stats {
  std::string local;  ///< local device name
  std::string peer;   ///< peer NIC path "server@device"
  rail_snapshot state;
};

struct transport_stats {
  std::vector<nic_stats> nics;    ///< by local device id
  std::vector<rail_stats> rails;  ///< rails with at least one failure (every rail: stats(true))
};

}  // namespace tide::rdma::plan
