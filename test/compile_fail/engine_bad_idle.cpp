// expect: `idle` must offer kName, config
// expect: required from 'class tide::transfer_engine<bad>'
#include <tide/engine.hpp>
struct bad : tide::default_policies {
  using idle = int;
};
auto make(const tide::engine_config& cfg) { return tide::transfer_engine<bad>::create(cfg); }
