#pragma once
/// The path concept (the fifth policy axis): which (local NIC, peer NIC)
/// rail carries each work request of a request.
///
/// The transport plans a request (or a run of coalesced requests) into WRs,
/// then asks the path policy once for all of them.  What the policy sees is
/// already filtered by rail health: `nics` lists only local NICs that have
/// a healthy rail to the target, each with the peer NIC its rail matches
/// (same subnet, then same index, then any), its load and its bandwidth.
/// A policy P provides:
///
///   static constexpr std::string_view kName;
///   P() (default constructible; one object per transport);
///   void assign(const tide::path_query& q, std::span<const std::uint32_t> wr_bytes,
///               std::span<tide::path_choice> out) noexcept;
///       Requires: q.nics non-empty, out.size() == wr_bytes.size().
///       Effects: out[i] names the rail of WR i: `nic` an index into q.nics,
///       `peer` a peer device (q.nics[nic].peer, or one of q.peers).  A
///       choice whose rail is not healthy, or out of range, is replaced by
///       the transport with q.nics[nic].peer (or nic 0).
///       Thread safety: called by any number of submitting threads at once.
///       Cost: on the hot path, once per request; no allocation, no lock.
///
/// Shipped: policy::load_aware (default), policy::round_robin,
/// policy::mooncake_random.  Rail health and the retry of failed slices on
/// the next healthy rail sit under every path policy (the transport's job).

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

namespace tide {

/// A local NIC a request may use, with the healthy rail it would take.
struct path_nic {
  std::uint16_t device = 0;         ///< local device id
  std::uint16_t peer = 0;           ///< peer device (descriptor index) on this NIC's rail
  std::uint8_t tier = 0;            ///< 0: preferred for the buffer's location (same NUMA node), 1: available
  std::uint64_t inflight_bytes = 0; ///< bytes dispatched to this NIC and not yet completed
  double bandwidth = 0;             ///< bytes/s: measured (EWMA), the port's rate before any sample
};

/// A peer NIC the target buffer may be reached through.
struct path_peer {
  std::uint16_t device = 0;  ///< peer device (descriptor index)
  std::uint8_t tier = 0;     ///< 0: preferred for the peer buffer's location, 1: available
};

struct path_query {
  std::span<const path_nic> nics;    ///< non-empty, tier 0 first
  std::span<const path_peer> peers;  ///< may be empty (then only nics[].peer)
  std::uint64_t bytes = 0;           ///< the request's bytes (sum of wr_bytes)
  std::uint32_t random = 0;          ///< a fresh random number per request
};

struct path_choice {
  std::uint16_t nic = 0;   ///< index into path_query::nics
  std::uint16_t peer = 0;  ///< peer device
};

/// The checks check_policy_set runs, split so its message can name what is wrong.
template <class T>
concept path_policy_shape = requires {
  { T::kName } -> std::convertible_to<std::string_view>;
};

/// A path policy (see the top of this file).
template <class T>
concept path_policy = path_policy_shape<T> && std::default_initializable<T> &&
                      requires(T& p, const path_query& q, std::span<const std::uint32_t> b, std::span<path_choice> o) {
                        { p.assign(q, b, o) } noexcept -> std::same_as<void>;
                      };

}  // namespace tide
