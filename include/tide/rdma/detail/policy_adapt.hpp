#pragma once
/// How the data path uses a policy set P (tide::default_policies or a
/// struct derived from it).  Not API.

#include <tide/policies.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tide::rdma::detail {

/// The shard of (target segment, peer device, peer NIC path): P::shard_hash.
template <class P>
[[nodiscard]] inline std::size_t shard_index(std::uint64_t target, std::uint32_t peer_device,
                                             std::string_view peer_path, std::size_t shards) noexcept {
  return P::shard_hash::shard(shard_key{target, peer_device, peer_path}, shards);
}

/// True when P's idle strategy wakes on a completion, so a worker with
/// completions outstanding may hand its wait to it; the others would sleep
/// past a completion, so such a worker keeps polling (as Mooncake's: idle
/// only when every submitted slice is processed).
template <class P>
inline constexpr bool kIdleWaitsOnCq = P::idle::wakes_on_completion;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace tide::rdma::detail
