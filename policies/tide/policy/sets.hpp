#pragma once
/// Policy sets with one axis of another set replaced, and Mooncake's own
/// combination: the sets tide-bench and the Python module build by name.
///
///   using lean = tide::policy::with_idle<tide::default_policies, tide::policy::cq_event>;

#include <tide/policies.hpp>

namespace tide::policy {

template <class P, class Eviction>
struct with_eviction : P {
  using eviction = Eviction;
};
template <class P, class ShardHash>
struct with_shard_hash : P {
  using shard_hash = ShardHash;
};
template <class P, class Idle>
struct with_idle : P {
  using idle = Idle;
};
template <class P, class Path>
struct with_path : P {
  using path = Path;
};
template <class P, class Metadata>
struct with_metadata : P {
  using metadata = Metadata;
};

/// Mooncake's choices: its SIEVE variant, its shard formula, its
/// spin-then-sleep workers, one random preferred NIC per request.
struct mooncake_policies : default_policies {
  using eviction = mooncake_sieve;
  using shard_hash = mooncake_hash;
  using idle = hybrid;
  using path = mooncake_random;
};

}  // namespace tide::policy
