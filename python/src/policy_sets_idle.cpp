// The default set with each other idle strategy: the sets a Python
// microbenchmark compares, named as tide-bench's --policy.  p2p metadata
// only: each set is a whole engine, and building every one with three
// backends would dominate the module's build (two files, so the sets build
// in parallel: policy_sets_other.cpp has the rest).
#include "engine_iface.hpp"

#include <tide/policy/sets.hpp>

namespace tide::py {

void add_idle_sets(std::vector<policy_set>& out) {
  out.push_back(p2p_only<policy::with_idle<default_policies, policy::busy_poll>>("busy_poll"));
  out.push_back(p2p_only<policy::with_idle<default_policies, policy::cq_event>>("cq_event"));
  out.push_back(p2p_only<policy::with_idle<default_policies, policy::hybrid>>("hybrid"));
}

}  // namespace tide::py
