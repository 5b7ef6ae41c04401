#pragma once
/// Integer mixing shared by the shard hashes.  Not API.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tide::policy::detail {

/// MurmurHash3's 64-bit finalizer: a bijection in which every input bit
/// flips each output bit with probability close to 1/2.
[[nodiscard]] constexpr std::uint64_t fmix64(std::uint64_t x) noexcept {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/// FNV-1a, 64-bit: stable across runs, builds and platforms (std::hash is
/// not promised to be).
[[nodiscard]] constexpr std::uint64_t fnv1a64(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

__extension__ using uint128 = unsigned __int128;

/// Maps a well-mixed 64-bit h onto [0, n) without a division (Lemire's
/// multiply-high); any n >= 1.
[[nodiscard]] constexpr std::size_t reduce(std::uint64_t h, std::size_t n) noexcept {
  return static_cast<std::size_t>((static_cast<uint128>(h) * n) >> 64);
}

}  // namespace tide::policy::detail
