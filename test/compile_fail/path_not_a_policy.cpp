// expect: `path` must name kName
#include <tide/policies.hpp>
struct p : tide::default_policies {
  using path = int;
};
static_assert(tide::check_policy_set<p>());
