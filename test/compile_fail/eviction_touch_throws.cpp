// expect: `eviction::order` must offer insert(hook&)
#include <tide/policies.hpp>
struct my_eviction {
  static constexpr const char* kName = "mine";
  struct hook {};
  struct order {
    void insert(hook&) noexcept {}
    void erase(hook&) noexcept {}
    void touch(hook&) {}  // must be noexcept
    hook* evict() noexcept { return nullptr; }
    std::size_t size() const noexcept { return 0; }
  };
};
struct p : tide::default_policies {
  using eviction = my_eviction;
};
static_assert(tide::check_policy_set<p>());
