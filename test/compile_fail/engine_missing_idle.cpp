// expect: no `idle` member
// expect: required from 'class tide::transfer_engine<bad>'
// A set not derived from the defaults that forgets an axis.
#include <tide/engine.hpp>
struct bad {
  using eviction = tide::policy::sieve;
  using shard_hash = tide::policy::mix_hash;
  using metadata = tide::policy::p2p;
};
auto make(const tide::engine_config& cfg) { return tide::transfer_engine<bad>::create(cfg); }
