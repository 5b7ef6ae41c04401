// expect: Eviction is not an eviction policy
#include <tide/rdma/endpoint_store.hpp>
struct ep {
  std::size_t outstanding() const noexcept { return 0; }
  void on_evict() noexcept {}
};
auto s = tide::endpoint_store<ep, int>::create(4);
