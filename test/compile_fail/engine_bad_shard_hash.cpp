// expect: `shard_hash` must offer kName, kNeedsPowerOfTwo
// expect: required from 'class tide::transfer_engine<bad>'
#include <tide/engine.hpp>
struct bad : tide::default_policies {
  using shard_hash = int;
};
auto make(const tide::engine_config& cfg) { return tide::transfer_engine<bad>::create(cfg); }
