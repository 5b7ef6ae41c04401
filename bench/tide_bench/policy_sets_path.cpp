// The default set with each other path policy (load_aware is the default's).
#include "policy_sets.hpp"
#include "runner.hpp"

namespace tide::bench {
namespace {

template <class Path>
struct path_set : default_policies {
  using path = Path;
};

}  // namespace

void add_path_sets(std::vector<policy_entry>& out) {
  using round_robin_set = path_set<policy::round_robin>;
  using mooncake_random_set = path_set<policy::mooncake_random>;
  out.push_back({"round_robin", describe<round_robin_set>(), &run<round_robin_set>, nullptr, nullptr});
  out.push_back({"mooncake_random", describe<mooncake_random_set>(), &run<mooncake_random_set>, nullptr, nullptr});
}

}  // namespace tide::bench
