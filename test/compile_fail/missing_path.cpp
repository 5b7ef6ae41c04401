// expect: no `path` member
#include <tide/policies.hpp>
struct p {
  using eviction = tide::policy::sieve;
  using shard_hash = tide::policy::mooncake_hash;
  using idle = tide::policy::hybrid;
};
static_assert(tide::check_policy_set<p>());
