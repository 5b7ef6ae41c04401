#pragma once
/// tide::policy::peer_path_hash — the shard is a function of the peer NIC
/// path alone.

#include <tide/detail/string_hash.hpp>
#include <tide/policy/detail/mix.hpp>
#include <tide/policy/shard_hash.hpp>

#include <cstddef>
#include <string_view>

namespace tide::policy {

/// The endpoint store's string hash of peer_nic_path (8 bytes at a time,
/// then MurmurHash3's finalizer), reduced onto [0, shard_count) by a
/// multiply-high.  The one shipped hash that sends a peer NIC to the same
/// shard however it is addressed (two segments on one server, a segment
/// re-opened under a new id).  Any shard count.  A few ns for a 20-byte
/// path.  Requires a non-empty peer_nic_path (an empty one sends every
/// slice to one shard).
struct peer_path_hash {
  static constexpr std::string_view kName = "peer_path_hash";
  static constexpr bool kNeedsPowerOfTwo = false;

  [[nodiscard]] static std::size_t shard(const shard_key& k, std::size_t shard_count) noexcept {
    return detail::reduce(tide::detail::hash_string(k.peer_nic_path), shard_count);
  }
};

}  // namespace tide::policy
