// The default set with each other eviction policy.
#include "policy_sets.hpp"
#include "runner.hpp"

namespace tide::bench {
namespace {

template <class Eviction>
struct eviction_set : default_policies {
  using eviction = Eviction;
};

}  // namespace

void add_eviction_sets(std::vector<policy_entry>& out) {
  out.push_back({"fifo", "fifo / mix_hash / hybrid", &run<eviction_set<policy::fifo>>, nullptr, nullptr});
  out.push_back({"lru", "lru / mix_hash / hybrid", &run<eviction_set<policy::lru>>, nullptr, nullptr});
  out.push_back({"mooncake_sieve", "mooncake_sieve / mix_hash / hybrid",
                 &run<eviction_set<policy::mooncake_sieve>>, nullptr, nullptr});
}

}  // namespace tide::bench
