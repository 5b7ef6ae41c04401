// The default set with each other idle strategy and shard hash, and the lean set.
#include "policy_sets.hpp"
#include "runner.hpp"

#include <tide/policy/sets.hpp>

namespace tide::bench {
namespace {

template <class Idle>
using idle_set = policy::with_idle<default_policies, Idle>;
template <class Hash>
using hash_set = policy::with_shard_hash<default_policies, Hash>;
/// What suits a shared or software-RDMA host: no CPU burnt while idle.
struct event_driven_policies : default_policies {
  using idle = policy::cq_event;
  using shard_hash = policy::peer_path_hash;
};

}  // namespace

void add_idle_and_hash_sets(std::vector<policy_entry>& out) {
  using busy_poll_set = idle_set<policy::busy_poll>;
  using cq_event_set = idle_set<policy::cq_event>;
  using hybrid_set = idle_set<policy::hybrid>;
  using mix_hash_set = hash_set<policy::mix_hash>;
  using peer_path_hash_set = hash_set<policy::peer_path_hash>;
  out.push_back({"busy_poll", describe<busy_poll_set>(), &run<busy_poll_set>, nullptr, nullptr});
  out.push_back({"cq_event", describe<cq_event_set>(), &run<cq_event_set>, nullptr, nullptr});
  out.push_back({"hybrid", describe<hybrid_set>(), &run<hybrid_set>, nullptr, nullptr});
  out.push_back({"mix_hash", describe<mix_hash_set>(), &run<mix_hash_set>, nullptr, nullptr});
  out.push_back({"peer_path_hash", describe<peer_path_hash_set>(), &run<peer_path_hash_set>, nullptr, nullptr});
  out.push_back({"event_driven", describe<event_driven_policies>(), &run<event_driven_policies>, nullptr, nullptr});
}

}  // namespace tide::bench
