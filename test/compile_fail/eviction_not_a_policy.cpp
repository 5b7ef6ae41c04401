// expect: `eviction` must name kName, a non-final `hook` class and an `order`
#include <tide/policies.hpp>
struct p : tide::default_policies {
  using eviction = int;
};
static_assert(tide::check_policy_set<p>());
