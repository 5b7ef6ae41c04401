// expect: Endpoint must provide `std::size_t outstanding() const noexcept`
#include <tide/policy/sieve.hpp>
#include <tide/rdma/endpoint_store.hpp>
struct ep {
  void on_evict() noexcept {}
};
auto s = tide::endpoint_store<ep, tide::policy::sieve>::create(4);
