// The default set with each other path policy (load_aware is the default's).
#include "policy_sets.hpp"
#include "runner.hpp"

#include <tide/policy/sets.hpp>

namespace tide::bench {

void add_path_sets(std::vector<policy_entry>& out) {
  using round_robin_set = policy::with_path<default_policies, policy::round_robin>;
  using mooncake_random_set = policy::with_path<default_policies, policy::mooncake_random>;
  out.push_back({"round_robin", describe<round_robin_set>(), &run<round_robin_set>, nullptr, nullptr});
  out.push_back({"mooncake_random", describe<mooncake_random_set>(), &run<mooncake_random_set>, nullptr, nullptr});
}

}  // namespace tide::bench
