#pragma once
/// tide::policy::peer_path_hash — the shard is a function of the peer NIC
/// path alone.

#include <tide/policy/detail/mix.hpp>
#include <tide/policy/shard_hash.hpp>

#include <cstddef>
#include <string_view>

namespace tide::policy {

/// fmix64(FNV-1a(peer_nic_path)) reduced onto [0, shard_count) by a
/// multiply-high.  The one shipped hash that sends a peer NIC to the same
/// shard however it is addressed (two segments on one server, a segment
/// re-opened under a new id).  Any shard count.  Costs about one cycle per
/// byte of the path.  Requires a non-empty peer_nic_path (an empty one
/// sends every slice to one shard).
struct peer_path_hash {
  static constexpr std::string_view kName = "peer_path_hash";
  static constexpr bool kNeedsPowerOfTwo = false;

  [[nodiscard]] static constexpr std::size_t shard(const shard_key& k, std::size_t shard_count) noexcept {
    return detail::reduce(detail::fmix64(detail::fnv1a64(k.peer_nic_path)), shard_count);
  }
};

}  // namespace tide::policy
