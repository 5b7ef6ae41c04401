// The default set with each other eviction policy (mooncake_sieve is in the "mooncake" set).
#include "policy_sets.hpp"
#include "runner.hpp"

#include <tide/policy/sets.hpp>

namespace tide::bench {

void add_eviction_sets(std::vector<policy_entry>& out) {
  using fifo_set = policy::with_eviction<default_policies, policy::fifo>;
  using lru_set = policy::with_eviction<default_policies, policy::lru>;
  out.push_back({"fifo", describe<fifo_set>(), &run<fifo_set>, nullptr, nullptr});
  out.push_back({"lru", describe<lru_set>(), &run<lru_set>, nullptr, nullptr});
}

}  // namespace tide::bench
