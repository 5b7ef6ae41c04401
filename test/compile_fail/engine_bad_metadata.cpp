// expect: `metadata` must be a metadata backend
// expect: required from 'class tide::transfer_engine<bad>'
#include <tide/engine.hpp>
struct bad : tide::default_policies {
  using metadata = int;
};
auto make(const tide::engine_config& cfg) { return tide::transfer_engine<bad>::create(cfg); }
