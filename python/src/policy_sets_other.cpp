// The default set with another eviction or path policy, and Mooncake's
// combination (p2p metadata only, as policy_sets_idle.cpp).
#include "engine_iface.hpp"

namespace tide::py {
namespace {

template <class Eviction>
struct eviction_set : default_policies {
  using eviction = Eviction;
};
template <class Path>
struct path_set : default_policies {
  using path = Path;
};
/// Mooncake's choices: its SIEVE variant, its shard formula, its
/// spin-then-sleep workers, one random preferred NIC per request.
struct mooncake_policies : default_policies {
  using eviction = policy::mooncake_sieve;
  using shard_hash = policy::mooncake_hash;
  using idle = policy::hybrid;
  using path = policy::mooncake_random;
};

}  // namespace

void add_other_sets(std::vector<policy_set>& out) {
  out.push_back(p2p_only<eviction_set<policy::lru>>("lru"));
  out.push_back(p2p_only<path_set<policy::round_robin>>("round_robin"));
  out.push_back(p2p_only<mooncake_policies>("mooncake"));
}

}  // namespace tide::py
