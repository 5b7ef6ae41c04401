#pragma once
/// tide::policy::mooncake_hash — Mooncake's WorkerPool shard function.

#include <tide/policy/shard_hash.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tide::policy {

/// (target_id * 10007 + device_id) % shard_count, as Mooncake's
/// WorkerPool::submitPostSend computes it (in 64-bit unsigned arithmetic).
/// Any shard count; costs one 64-bit division.  Keys that differ only in a
/// multiple of shard_count collide (e.g. device ids 0 and 8 with 8 shards).
struct mooncake_hash {
  static constexpr std::string_view kName = "mooncake_hash";
  static constexpr bool kNeedsPowerOfTwo = false;

  [[nodiscard]] static constexpr std::size_t shard(const shard_key& k, std::size_t shard_count) noexcept {
    return static_cast<std::size_t>((k.target_id * 10007u + k.device_id) % shard_count);
  }
};

}  // namespace tide::policy
