#pragma once
/// tide::policy::load_aware — the default path policy: NICs scored by how
/// long they would take to finish what they already have plus this request,
///   score = (bytes in flight + bytes) / bandwidth x tier penalty,
/// with bandwidth measured from completions (the port's rate before any
/// sample) and the penalty 1 for NICs on the buffer's NUMA node, 5 for the
/// others (TENT's DeviceSelector, research/tent.md 1.2).
///
///  - A request of fewer than kSplitMinWrs WRs goes whole to the best NIC.
///  - A larger one is split so that every NIC it uses would finish at the
///    same time (water filling over backlog / bandwidth): with nothing in
///    flight, in proportion to bandwidth (200 and 50 Gb/s: 4:1).
///  - Every kProbeEvery-th small request goes round robin instead, so a NIC
///    that once looked slow keeps getting samples.
/// Each WR takes its NIC's matched rail.

#include <tide/policy/path.hpp>

#include <array>
#include <utility>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tide::policy {

class load_aware {
 public:
  static constexpr std::string_view kName = "load_aware";
  static constexpr double kTierPenalty[2] = {1.0, 5.0};
  static constexpr std::size_t kSplitMinWrs = 4;
  static constexpr unsigned kProbeEvery = 64;
  static constexpr std::size_t kMaxNics = 16;

  void assign(const path_query& q, std::span<const std::uint32_t> wr_bytes, std::span<path_choice> out) noexcept {
    const std::size_t m = q.nics.size() < kMaxNics ? q.nics.size() : kMaxNics;
    std::array<double, kMaxNics> rate{};     // effective bytes/s (bandwidth / penalty)
    std::array<double, kMaxNics> backlog{};  // seconds to drain what is in flight
    for (std::size_t i = 0; i < m; ++i) {
      const auto& n = q.nics[i];
      const double bw = n.bandwidth > 1.0 ? n.bandwidth : 1.0;
      rate[i] = bw / kTierPenalty[n.tier != 0 ? 1 : 0];
      backlog[i] = static_cast<double>(n.inflight_bytes) / rate[i];
    }
    if (m == 1 || wr_bytes.size() < kSplitMinWrs) {
      std::size_t best = 0;
      if (calls_.fetch_add(1, std::memory_order_relaxed) % kProbeEvery == kProbeEvery - 1) {
        best = q.random % m;
      } else {
        double best_t = 0;
        for (std::size_t i = 0; i < m; ++i) {
          const double t = backlog[i] + static_cast<double>(q.bytes) / rate[i];
          if (i == 0 || t < best_t) {
            best = i;
            best_t = t;
          }
        }
      }
      for (auto& c : out) c = {static_cast<std::uint16_t>(best), q.nics[best].peer};
      return;
    }
    // Water filling: the finish time T at which the NICs below it absorb q.bytes;
    // NIC i then takes (T - backlog_i) * rate_i bytes.
    std::array<std::size_t, kMaxNics> order{};
    for (std::size_t i = 0; i < m; ++i) order[i] = i;
    for (std::size_t i = 1; i < m; ++i)  // insertion sort by backlog (m <= 16)
      for (std::size_t j = i; j > 0 && backlog[order[j]] < backlog[order[j - 1]]; --j) std::swap(order[j], order[j - 1]);
    double total = 0;
    for (auto b : wr_bytes) total += b;
    double sum_rate = 0, sum_rate_backlog = 0, level = 0;
    std::size_t used = 0;
    while (used < m) {
      const std::size_t i = order[used];
      sum_rate += rate[i];
      sum_rate_backlog += rate[i] * backlog[i];
      ++used;
      level = (total + sum_rate_backlog) / sum_rate;
      if (used == m || level <= backlog[order[used]]) break;
    }
    std::array<double, kMaxNics> share{};  // bytes each NIC should still get
    for (std::size_t k = 0; k < used; ++k) {
      const std::size_t i = order[k];
      share[i] = (level - backlog[i]) * rate[i];
    }
    // Deal WRs to whichever NIC is furthest below its share.
    for (std::size_t w = 0; w < wr_bytes.size(); ++w) {
      std::size_t best = order[0];
      for (std::size_t i = 0; i < m; ++i)
        if (share[i] > share[best]) best = i;
      share[best] -= wr_bytes[w];
      out[w] = {static_cast<std::uint16_t>(best), q.nics[best].peer};
    }
  }

 private:
  std::atomic<unsigned> calls_{0};
};

}  // namespace tide::policy
