// The default policy set with each metadata backend, and Mooncake's combination.
#include "policy_sets.hpp"
#include "runner.hpp"

#include <tide/policy/etcd.hpp>
#include <tide/policy/http.hpp>
#include <tide/policy/sets.hpp>

namespace tide::bench {

using policy::mooncake_policies;
using policy::with_metadata;

void add_default_sets(std::vector<policy_entry>& out) {
  out.push_back({"default", describe<default_policies>(), &run<default_policies>,
                 &run<with_metadata<default_policies, policy::etcd>>,
                 &run<with_metadata<default_policies, policy::http>>});
  out.push_back({"mooncake", describe<mooncake_policies>(), &run<mooncake_policies>, nullptr, nullptr});
}

std::vector<policy_entry> policy_registry() {
  std::vector<policy_entry> out;
  add_default_sets(out);
  add_eviction_sets(out);
  add_idle_and_hash_sets(out);
  add_path_sets(out);
  return out;
}

}  // namespace tide::bench
