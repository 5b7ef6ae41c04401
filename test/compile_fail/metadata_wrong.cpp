// expect: `metadata` must be a metadata backend
#include <tide/policies.hpp>
struct p : tide::default_policies {
  using metadata = tide::policy::fifo;
};
static_assert(tide::check_policy_set<p>());
