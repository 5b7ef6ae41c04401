// expect: `eviction` must name kName, a non-final `hook` class and an `order`
// expect: required from 'class tide::transfer_engine<bad>'
// The engine checks its policy set at the door: the message names the member.
#include <tide/engine.hpp>
struct bad : tide::default_policies {
  using eviction = int;
};
auto make(const tide::engine_config& cfg) { return tide::transfer_engine<bad>::create(cfg); }
