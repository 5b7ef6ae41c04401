#pragma once
/// The shard-hash concept: which shard (and so which transfer worker) of a
/// context's worker pool handles a slice.
///
/// The worker pool computes `H::shard(key, shard_count)` once per slice, on
/// the hot path.  Every slice with the same key lands on the same shard,
/// hence the same worker: posts to one peer NIC keep their order and reuse
/// that worker's QPs.  A policy H provides:
///
///   static constexpr std::string_view kName;
///   static constexpr bool kNeedsPowerOfTwo;   // shard() masks instead of dividing
///   static std::size_t shard(const tide::shard_key& k, std::size_t shard_count) noexcept;
///       Requires: check_shard_count<H>(shard_count) == errc::ok (the pool
///       checks once at setup, so shard() does not branch on it).
///       Returns a value in [0, shard_count); a pure function of (k, count):
///       the same in every process, run and build (no std::hash, no seed).
///
/// Chosen over operator(): a static function needs no policy object in the
/// worker pool and reads the same at every call site.

#include <tide/errc.hpp>
#include <tide/result.hpp>

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tide {

/// What a shard hash may look at.  target_id: the segment handle of the
/// transfer's target; device_id: the index of the peer's device (NIC) in
/// the segment's descriptor; peer_nic_path: "server@nic" of that device.
/// For mooncake_hash and mix_hash, "same peer NIC path -> same shard" holds
/// as long as (target_id, device_id) names one peer NIC, which is true when
/// each segment is opened once; peer_path_hash guarantees it by hashing the
/// path itself.
struct shard_key {
  std::uint64_t target_id = 0;
  std::uint32_t device_id = 0;
  std::string_view peer_nic_path;
};

/// A shard-hash policy (see the top of this file).
/// Shipped: policy::mooncake_hash, policy::mix_hash, policy::peer_path_hash.
template <class H>
concept shard_hash_policy = requires(const shard_key& k, std::size_t n) {
  { H::kName } -> std::convertible_to<std::string_view>;
  { H::kNeedsPowerOfTwo } -> std::convertible_to<bool>;
  { H::shard(k, n) } noexcept -> std::same_as<std::size_t>;
};

/// errc::ok when H can spread over `shard_count` shards; errc::invalid_argument
/// when shard_count is 0, or is not a power of two and H::kNeedsPowerOfTwo.
/// Usable in constant expressions.
template <shard_hash_policy H>
[[nodiscard]] constexpr errc check_shard_count(std::size_t shard_count) noexcept {
  if (shard_count == 0) return errc::invalid_argument;
  if (H::kNeedsPowerOfTwo && !std::has_single_bit(shard_count)) return errc::invalid_argument;
  return errc::ok;
}

/// check_shard_count with a detail for the setup path, e.g.
/// "shard count 12 is not a power of two, which mix_hash requires; use 8 or 16".
template <shard_hash_policy H>
[[nodiscard]] status validate_shard_count(std::size_t shard_count) {
  if (shard_count == 0) return fail(errc::invalid_argument, "shard count is 0; use at least 1");
  if (check_shard_count<H>(shard_count) != errc::ok) {
    const std::size_t lo = std::bit_floor(shard_count);
    return fail(errc::invalid_argument, "shard count " + std::to_string(shard_count) +
                                            " is not a power of two, which " + std::string(H::kName) +
                                            " requires; use " + std::to_string(lo) + " or " +
                                            std::to_string(lo * 2) + ", or a shard hash such as mooncake_hash");
  }
  return {};
}

/// A shard count fixed at compile time, rejected at compile time when H
/// cannot use it: `constexpr auto n = tide::static_shard_count<H, 8>::value;`
template <class H, std::size_t N>
struct static_shard_count {
  static_assert(shard_hash_policy<H>, "H is not a shard hash policy (see <tide/policy/shard_hash.hpp>)");
  static_assert(N > 0, "the shard count must be at least 1");
  static_assert(!H::kNeedsPowerOfTwo || std::has_single_bit(N),
                "this shard hash masks its result (kNeedsPowerOfTwo): make the shard count a power "
                "of two, or use tide::policy::mooncake_hash or peer_path_hash");
  static constexpr std::size_t value = N;
};

}  // namespace tide
