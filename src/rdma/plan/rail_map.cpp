#include <tide/rdma/plan/path_selector.hpp>

#include <algorithm>
#include <cstdlib>

namespace tide::rdma::plan {
namespace {

bool is_zero(const gid_raw& g) noexcept {
  return std::all_of(g.begin(), g.end(), [](std::uint8_t b) { return b == 0; });
}
bool is_ipv4_mapped(const gid_raw& g) noexcept {
  return std::all_of(g.begin(), g.begin() + 10, [](std::uint8_t b) { return b == 0; }) && g[10] == 0xff && g[11] == 0xff;
}
bool is_link_local(const gid_raw& g) noexcept { return g[0] == 0xfe && (g[1] & 0xc0) == 0x80; }

}  // namespace

bool same_subnet(const gid_raw& a, const gid_raw& b) noexcept {
  if (is_zero(a) || is_zero(b)) return false;
  if (is_ipv4_mapped(a) || is_ipv4_mapped(b))
    return is_ipv4_mapped(a) && is_ipv4_mapped(b) && std::equal(a.begin() + 12, a.begin() + 15, b.begin() + 12);
  if (is_link_local(a) || is_link_local(b)) return false;
  return std::equal(a.begin(), a.begin() + 8, b.begin());
}

rail_map rail_map::build(rail_table& rails, std::span<const gid_raw> local_gids, std::span<const std::string> peer_paths,
                         std::span<const gid_raw> peer_gids) {
  rail_map m;
  // Each id is held from peer_id() on, and `refs` gives them back with the
  // map (or the catch below, when a peer_id() throws half way).
  m.peer_ids.reserve(peer_paths.size());
  std::vector<std::uint32_t> held;
  held.reserve(peer_paths.size());
  try {
    for (const auto& p : peer_paths) {
      const std::uint32_t id = rails.peer_id(p);
      m.peer_ids.push_back(id);
      held.push_back(id);
    }
  } catch (...) {
    for (const std::uint32_t id : held) rails.release(id);
    throw;
  }
  m.refs = rails.hold_until_destroyed(std::move(held));
  m.ranked.resize(local_gids.size());
  for (std::size_t l = 0; l < local_gids.size(); ++l) {
    auto& r = m.ranked[l];
    for (std::size_t p = 0; p < peer_paths.size(); ++p) r.push_back(static_cast<std::uint16_t>(p));
    auto score = [&](std::size_t p) {
      const bool subnet = p < peer_gids.size() && same_subnet(local_gids[l], peer_gids[p]);
      return (subnet ? 2 : 0) + (p == l ? 1 : 0);
    };
    auto distance = [&](std::size_t p) { return p > l ? p - l : l - p; };
    std::stable_sort(r.begin(), r.end(), [&](std::uint16_t a, std::uint16_t b) {
      if (score(a) != score(b)) return score(a) > score(b);
      return distance(a) < distance(b);
    });
  }
  return m;
}

}  // namespace tide::rdma::plan
