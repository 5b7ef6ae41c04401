#pragma once
/// The path selector: second step of the data path (submit -> plan ->
/// **path** -> lane -> NIC -> completion).  For the WRs of one planned
/// extent it lists the usable rails (local NICs of the buffer's location
/// whose rail to a peer NIC of the target buffer is healthy), asks the path
/// policy P::path to assign them, and checks its answer.  For a failed
/// slice it picks the next healthy rail, never the one that just failed.
///
/// Rails are matched once per peer segment (rail_map, setup path): for each
/// local NIC, the peer NICs ranked same subnet first (GIDs), then same
/// index, then the rest by index distance.  A paused rail whose cooldown has
/// passed gets exactly one probe WR (rail_state::claim_probe).  When no
/// rail is healthy and none may probe, the WRs go to the best-ranked rail
/// regardless, so they fail (and their tasks with them) instead of waiting.
///
/// Threads: a path_selector is shared by every submitting thread and every
/// lane that retries; it holds no mutable state of its own besides the
/// policy (which is thread-safe by its concept).  rail_map is immutable
/// after build.

#include <tide/policy/path.hpp>
#include <tide/rdma/plan/nic_load.hpp>
#include <tide/rdma/plan/rail_health.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tide::rdma::plan {

/// A rail: local device id, peer device (descriptor index), and whether the
/// WR on it is the rail's probe.
struct rail {
  std::uint16_t local = 0;
  std::uint16_t peer = 0;
  bool probe = false;
  friend bool operator==(const rail& a, const rail& b) noexcept { return a.local == b.local && a.peer == b.peer; }
};

using gid_raw = std::array<std::uint8_t, 16>;

/// Same subnet: IPv4-mapped GIDs share their /24, other GIDs their 64-bit
/// prefix (link-local fe80:: GIDs say nothing and never match).  Zero GIDs never match.
[[nodiscard]] bool same_subnet(const gid_raw& a, const gid_raw& b) noexcept;

/// How the NICs of one peer segment pair with the local NICs.
struct rail_map {
  std::vector<std::uint32_t> peer_ids;             ///< per peer device: id in the rail_table
  std::vector<std::vector<std::uint16_t>> ranked;  ///< per local device: peer devices, best rail first
  /// Holds peer_ids in the table while the map lives (move-only): the table
  /// recycles only ids no map holds.
  peer_refs refs;

  /// Ranks every peer device for every local device and registers the peer
  /// NICs in `rails`.  `local_gids` by local device id; `peer_paths` and
  /// `peer_gids` by peer device.  Setup path.
  [[nodiscard]] static rail_map build(rail_table& rails, std::span<const gid_raw> local_gids,
                                      std::span<const std::string> peer_paths, std::span<const gid_raw> peer_gids);
};

/// The candidates of one extent, as device ids: local NICs of the local
/// buffer's location (tiers), peer NICs of the peer buffer's location
/// (descriptor indices; both empty lists mean every peer NIC, tier 0).
struct candidates {
  std::span<const std::uint16_t> local_preferred;
  std::span<const std::uint16_t> local_available;
  std::span<const std::uint16_t> peer_preferred;
  std::span<const std::uint16_t> peer_available;
};

template <class Path>
class path_selector {
 public:
  static constexpr std::size_t kMaxLocal = rail_table::kMaxLocal;
  static constexpr std::size_t kMaxPeers = 64;  ///< peer devices considered per segment

  /// `loads` by local device id (at most kMaxLocal); both outlive the selector.
  path_selector(rail_table& rails, std::span<nic_load> loads) noexcept : rails_(rails), loads_(loads) {}

  [[nodiscard]] Path& policy() noexcept { return policy_; }
  [[nodiscard]] rail_table& rails() noexcept { return rails_; }
  [[nodiscard]] nic_load& load(std::size_t local) noexcept { return loads_[local]; }

  /// Assigns a rail to each WR of an extent (`out[i]` for `wr_bytes[i]`).
  /// `active_mask` bit d: local device d may be used.  Returns false when
  /// there is no candidate at all (no local NIC active or no peer NIC):
  /// the caller fails the WRs.  `any_healthy` (optional): whether a healthy
  /// rail took them, or only a probe and the fallback (every rail paused).
  /// Hot path: no allocation, no lock.
  [[nodiscard]] bool choose(const candidates& c, const rail_map& m, std::uint32_t active_mask,
                            std::span<const std::uint32_t> wr_bytes, std::uint64_t bytes, std::uint32_t random,
                            std::int64_t now_us, std::span<rail> out, bool* any_healthy = nullptr) noexcept {
    std::array<std::uint8_t, kMaxPeers> peer_tier;
    const std::size_t npeers = peer_tiers(c, m, peer_tier);
    std::array<path_nic, kMaxLocal> nics;
    std::array<path_peer, kMaxPeers> peers;
    std::size_t nn = 0, np = 0;
    for (std::size_t p = 0; p < npeers; ++p)
      if (peer_tier[p] != kNone) peers[np++] = {static_cast<std::uint16_t>(p), peer_tier[p]};
    rail probe{};
    bool have_probe = false;
    rail fallback{};
    bool have_fallback = false;
    std::uint32_t seen = 0;
    auto consider = [&](std::uint16_t l, std::uint8_t tier) {
      if (l >= loads_.size() || l >= m.ranked.size() || (seen & (1u << l)) != 0 || (active_mask & (1u << l)) == 0) return;
      seen |= 1u << l;
      for (std::uint16_t p : m.ranked[l]) {
        if (p >= npeers || peer_tier[p] == kNone) continue;
        if (!have_fallback) {
          fallback = {l, p, false};
          have_fallback = true;
        }
        if (rails_.healthy(l, m.peer_ids[p])) {
          nics[nn++] = {l, p, tier, loads_[l].inflight_bytes(), loads_[l].bandwidth()};
          return;
        }
      }
      if (have_probe) return;
      for (std::uint16_t p : m.ranked[l]) {
        if (p >= npeers || peer_tier[p] == kNone) continue;
        if (rails_.claim_probe(l, m.peer_ids[p], now_us)) {
          probe = {l, p, true};
          have_probe = true;
          return;
        }
      }
    };
    for (auto l : c.local_preferred) consider(l, 0);
    for (auto l : c.local_available) consider(l, 1);
    if (!have_fallback) return false;
    if (any_healthy != nullptr) *any_healthy = nn != 0;
    if (nn == 0) {
      // No healthy rail: the probe if there is one, else the best-ranked rail (its WRs fail fast).
      const rail r = have_probe ? probe : fallback;
      for (auto& o : out) o = {r.local, r.peer, false};
      if (have_probe && !out.empty()) out[0].probe = true;
      return true;
    }
    std::array<path_choice, 64> small;
    std::span<path_choice> choices(small.data(), std::min(out.size(), small.size()));
    // WRs past 64 (only with a max_msg_sz that forces more) repeat the first 64 choices.
    path_query q{std::span<const path_nic>(nics.data(), nn), std::span<const path_peer>(peers.data(), np), bytes, random};
    policy_.assign(q, wr_bytes.first(choices.size()), choices);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const path_choice& ch = choices[i % choices.size()];
      const path_nic& n = nics[ch.nic < nn ? ch.nic : 0];
      std::uint16_t peer = ch.peer;
      if (peer >= npeers || peer_tier[peer] == kNone || !rails_.healthy(n.device, m.peer_ids[peer])) peer = n.peer;
      out[i] = {n.device, peer, false};
    }
    if (have_probe && !out.empty()) out[0] = probe;
    return true;
  }

  /// The rail for a slice that failed on `failed`: the first healthy rail in
  /// rank order (every local NIC's best peer first, then second best...)
  /// other than `failed`, else one whose cooldown passed (as its probe).
  /// Returns false when there is none: the slice fails.
  [[nodiscard]] bool next_rail(const candidates& c, const rail_map& m, std::uint32_t active_mask, rail failed,
                               std::int64_t now_us, rail& out) noexcept {
    std::array<std::uint8_t, kMaxPeers> peer_tier;
    const std::size_t npeers = peer_tiers(c, m, peer_tier);
    std::array<std::uint16_t, kMaxLocal> locals;
    std::size_t nl = 0;
    std::uint32_t seen = 0;
    auto add = [&](std::uint16_t l) {
      if (l >= loads_.size() || l >= m.ranked.size() || (seen & (1u << l)) != 0 || (active_mask & (1u << l)) == 0) return;
      seen |= 1u << l;
      locals[nl++] = l;
    };
    for (auto l : c.local_preferred) add(l);
    for (auto l : c.local_available) add(l);
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < npeers; ++k) {
        for (std::size_t i = 0; i < nl; ++i) {
          const std::uint16_t l = locals[i];
          if (k >= m.ranked[l].size()) continue;
          const std::uint16_t p = m.ranked[l][k];
          if (p >= npeers || peer_tier[p] == kNone || rail{l, p} == failed) continue;
          const bool ok = pass == 0 ? rails_.healthy(l, m.peer_ids[p]) : rails_.claim_probe(l, m.peer_ids[p], now_us);
          if (ok) {
            out = {l, p, pass == 1};
            return true;
          }
        }
      }
    }
    return false;
  }

 private:
  static constexpr std::uint8_t kNone = 0xff;

  // peer_tier[p]: the tier of peer device p for this extent, kNone when not a candidate.
  static std::size_t peer_tiers(const candidates& c, const rail_map& m, std::array<std::uint8_t, kMaxPeers>& t) noexcept {
    const std::size_t n = m.peer_ids.size() < kMaxPeers ? m.peer_ids.size() : kMaxPeers;
    const bool every = c.peer_preferred.empty() && c.peer_available.empty();
    for (std::size_t p = 0; p < n; ++p) t[p] = every ? 0 : kNone;
    for (auto p : c.peer_available)
      if (p < n) t[p] = 1;
    for (auto p : c.peer_preferred)
      if (p < n) t[p] = 0;
    return n;
  }

  rail_table& rails_;
  std::span<nic_load> loads_;
  Path policy_;
};

}  // namespace tide::rdma::plan
