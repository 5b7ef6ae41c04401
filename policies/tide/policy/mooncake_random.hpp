#pragma once
/// tide::policy::mooncake_random — Mooncake classic's NIC choice: one random
/// preferred NIC per request, every WR on it, and a random preferred peer
/// NIC (RdmaTransport::selectDevice on both sides).  "Each NIC is scheduled
/// with equal probability, so the transfer is limited by the farthest NIC"
/// (Mooncake #813): for comparison, and for peers that expect classic.

#include <tide/policy/path.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tide::policy {

struct mooncake_random {
  static constexpr std::string_view kName = "mooncake_random";

  void assign(const path_query& q, std::span<const std::uint32_t> wr_bytes, std::span<path_choice> out) noexcept {
    (void)wr_bytes;
    // nics lists tier 0 first: draw among the preferred ones, or all when none is.
    std::size_t preferred = 0;
    while (preferred < q.nics.size() && q.nics[preferred].tier == 0) ++preferred;
    const std::size_t pool = preferred != 0 ? preferred : q.nics.size();
    const auto nic = static_cast<std::uint16_t>(q.random % pool);
    std::uint16_t peer = q.nics[nic].peer;
    std::size_t peers_preferred = 0;
    for (const auto& p : q.peers) peers_preferred += p.tier == 0;
    if (!q.peers.empty()) {
      // The k-th preferred peer (or k-th of all), k from the upper bits of the same draw.
      const std::size_t ppool = peers_preferred != 0 ? peers_preferred : q.peers.size();
      std::size_t k = (q.random >> 16) % ppool;
      for (const auto& p : q.peers) {
        if (peers_preferred != 0 && p.tier != 0) continue;
        if (k-- == 0) {
          peer = p.device;
          break;
        }
      }
    }
    for (auto& c : out) c = {nic, peer};
  }
};

}  // namespace tide::policy
