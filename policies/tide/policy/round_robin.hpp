#pragma once
/// tide::policy::round_robin — WRs dealt to the preferred NICs in turn (all
/// NICs when none is preferred), each on its matched rail; TENT's baseline
/// when smart scheduling is off.  Even spraying without looking at load:
/// right when the NICs are equal and equally loaded.

#include <tide/policy/path.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tide::policy {

class round_robin {
 public:
  static constexpr std::string_view kName = "round_robin";

  void assign(const path_query& q, std::span<const std::uint32_t> wr_bytes, std::span<path_choice> out) noexcept {
    std::size_t preferred = 0;
    while (preferred < q.nics.size() && q.nics[preferred].tier == 0) ++preferred;
    const std::size_t pool = preferred != 0 ? preferred : q.nics.size();
    // One fetch_add per request, not per WR: the request takes the next wr_bytes.size() turns.
    std::size_t turn = next_.fetch_add(wr_bytes.size(), std::memory_order_relaxed);
    for (auto& c : out) {
      const auto nic = static_cast<std::uint16_t>(turn++ % pool);
      c = {nic, q.nics[nic].peer};
    }
  }

 private:
  std::atomic<std::size_t> next_{0};
};

}  // namespace tide::policy
