// The default set with another eviction or path policy, and Mooncake's
// combination (p2p metadata only, as policy_sets_idle.cpp).
#include "engine_iface.hpp"

#include <tide/policy/sets.hpp>

namespace tide::py {

void add_other_sets(std::vector<policy_set>& out) {
  out.push_back(p2p_only<policy::with_eviction<default_policies, policy::lru>>("lru"));
  out.push_back(p2p_only<policy::with_path<default_policies, policy::round_robin>>("round_robin"));
  out.push_back(p2p_only<policy::mooncake_policies>("mooncake"));
}

}  // namespace tide::py
