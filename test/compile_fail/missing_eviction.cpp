// expect: no `eviction` member
#include <tide/policies.hpp>
struct p {
  using shard_hash = tide::policy::mix_hash;
  using idle = tide::policy::hybrid;
};
static_assert(tide::check_policy_set<p>());
