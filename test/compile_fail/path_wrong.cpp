// expect: `path` must be default constructible and offer `void assign(
#include <tide/policies.hpp>
struct p : tide::default_policies {
  using path = tide::policy::mix_hash;
};
static_assert(tide::check_policy_set<p>());
