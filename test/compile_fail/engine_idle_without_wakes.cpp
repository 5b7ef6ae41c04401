// expect: `static constexpr bool wakes_on_completion`
// expect: required from 'class tide::transfer_engine<bad>'
// An idle strategy that does not say whether a completion wakes it.
#include <tide/engine.hpp>
class quiet {
 public:
  static constexpr std::string_view kName = "quiet";
  struct config {};
  static tide::result<quiet> create(const config&) { return quiet{}; }
  tide::status attach(ibv_cq*, ibv_comp_channel*) { return {}; }
  void detach(ibv_cq*) noexcept {}
  void on_work() noexcept {}
  template <class F>
  void on_empty(F&&) noexcept {}
  void wake() noexcept {}
};
struct bad : tide::default_policies {
  using idle = quiet;
};
auto make(const tide::engine_config& cfg) { return tide::transfer_engine<bad>::create(cfg); }
