#pragma once
/// tide::policy::mix_hash — (target_id, device_id) through an avalanching
/// 64-bit finalizer, masked to a power-of-two shard count.

#include <tide/policy/detail/mix.hpp>
#include <tide/policy/shard_hash.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tide::policy {

/// fmix64(target_id * phi64 + device_id) & (shard_count - 1).  Spreads
/// sequential segment and device ids evenly and costs a few multiplies, no
/// division.  Requires a power-of-two shard count (kNeedsPowerOfTwo): the
/// worker pool rejects others at setup with errc::invalid_argument
/// (validate_shard_count), or at compile time through static_shard_count.
struct mix_hash {
  static constexpr std::string_view kName = "mix_hash";
  static constexpr bool kNeedsPowerOfTwo = true;

  [[nodiscard]] static constexpr std::size_t shard(const shard_key& k, std::size_t shard_count) noexcept {
    const std::uint64_t x = detail::fmix64(k.target_id * 0x9e3779b97f4a7c15ULL + k.device_id);
    return static_cast<std::size_t>(x) & (shard_count - 1);
  }
};

}  // namespace tide::policy
