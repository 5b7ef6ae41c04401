// The default set with each other idle strategy and shard hash, and the lean set.
#include "policy_sets.hpp"
#include "runner.hpp"

namespace tide::bench {
namespace {

template <class Idle>
struct idle_set : default_policies {
  using idle = Idle;
};
template <class Hash>
struct hash_set : default_policies {
  using shard_hash = Hash;
};
/// What suits a shared or software-RDMA host: no CPU burnt while idle.
struct event_driven_policies : default_policies {
  using idle = policy::cq_event;
  using shard_hash = policy::peer_path_hash;
};

}  // namespace

void add_idle_and_hash_sets(std::vector<policy_entry>& out) {
  out.push_back({"busy_poll", "sieve / mix_hash / busy_poll", &run<idle_set<policy::busy_poll>>, nullptr, nullptr});
  out.push_back({"cq_event", "sieve / mix_hash / cq_event", &run<idle_set<policy::cq_event>>, nullptr, nullptr});
  out.push_back({"mooncake_hash", "sieve / mooncake_hash / hybrid", &run<hash_set<policy::mooncake_hash>>, nullptr,
                 nullptr});
  out.push_back({"peer_path_hash", "sieve / peer_path_hash / hybrid", &run<hash_set<policy::peer_path_hash>>,
                 nullptr, nullptr});
  out.push_back({"event_driven", "sieve / peer_path_hash / cq_event", &run<event_driven_policies>, nullptr, nullptr});
}

}  // namespace tide::bench
