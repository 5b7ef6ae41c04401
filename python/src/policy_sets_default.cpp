// The default policy set with each metadata backend (the p2p one is the
// library's own instantiation), and the registry of every set.
#include "engine_iface.hpp"

#include <tide/policy/etcd.hpp>
#include <tide/policy/http.hpp>
#include <tide/policy/sets.hpp>

namespace tide::py {

void add_default_sets(std::vector<policy_set>& out) {
  out.push_back({"default", describe<default_policies>(), &make_engine<default_policies>,
                 &make_engine<policy::with_metadata<default_policies, policy::etcd>>,
                 &make_engine<policy::with_metadata<default_policies, policy::http>>});
}

const std::vector<policy_set>& policy_sets() {
  static const std::vector<policy_set> sets = [] {
    std::vector<policy_set> out;
    add_default_sets(out);
    add_idle_sets(out);
    add_other_sets(out);
    return out;
  }();
  return sets;
}

}  // namespace tide::py
