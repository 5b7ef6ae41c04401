// expect: factory(std::string_view) must return
#include <tide/policy/fifo.hpp>
#include <tide/rdma/endpoint_store.hpp>
#include <memory>
struct ep {
  std::size_t outstanding() const noexcept { return 0; }
  void on_evict() noexcept {}
};
void f(tide::endpoint_store<ep, tide::policy::fifo>& s) {
  (void)s.get_or_insert("a@b", [](std::string_view) { return std::make_unique<ep>(); });
}
