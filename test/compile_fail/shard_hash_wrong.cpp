// expect: `shard_hash` must offer kName, kNeedsPowerOfTwo
#include <tide/policies.hpp>
struct p : tide::default_policies {
  using shard_hash = tide::policy::sieve;
};
static_assert(tide::check_policy_set<p>());
