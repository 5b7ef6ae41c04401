// expect: `idle` must offer kName, config
#include <tide/policies.hpp>
struct p : tide::default_policies {
  using idle = int;
};
static_assert(tide::check_policy_set<p>());
