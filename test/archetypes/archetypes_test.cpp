// The library's templates instantiated against the archetypes, and the
// policy-set check on default_policies, derived sets and broken sets.

#include "archetypes.hpp"

#include <tide/policies.hpp>
#include <tide/rdma/endpoint_store.hpp>

#include <tide/policy/in_process.hpp>

#include <doctest/doctest.h>

#include <memory>
#include <string_view>
#include <tuple>

namespace arch = tide::archetypes;

static_assert(tide::eviction_policy<arch::eviction>);
static_assert(tide::shard_hash_policy<arch::shard_hash>);
static_assert(tide::idle_strategy<arch::idle>);
static_assert(tide::metadata_backend<arch::metadata>);
static_assert(tide::path_policy<arch::path>);
static_assert(tide::store_endpoint<arch::endpoint>);
static_assert(tide::check_policy_set<arch::policies>());
static_assert(tide::policy_set<arch::policies>);

// Every non-template member of the store, compiled against the archetypes.
template class tide::endpoint_store<arch::endpoint, arch::eviction>;
template struct tide::static_shard_count<arch::shard_hash, 3>;

// Policy sets: the defaults, overrides, and sets that must be rejected.
static_assert(tide::policy_set<tide::default_policies>);
struct fifo_events : tide::default_policies {
  using eviction = tide::policy::fifo;
  using idle = tide::policy::cq_event;
};
static_assert(tide::policy_set<fifo_events>);
struct with_metadata : tide::default_policies {
  using metadata = arch::metadata;
};
static_assert(tide::policy_set<with_metadata>);
struct no_eviction {
  using shard_hash = tide::policy::mix_hash;
  using idle = tide::policy::hybrid;
  using path = tide::policy::load_aware;
};
static_assert(!tide::policy_set<no_eviction>);
struct bad_eviction : tide::default_policies {
  using eviction = int;
};
static_assert(!tide::policy_set<bad_eviction>);
struct bad_hash : tide::default_policies {
  using shard_hash = tide::policy::sieve;
};
static_assert(!tide::policy_set<bad_hash>);
struct bad_idle : tide::default_policies {
  using idle = tide::policy::mix_hash;
};
static_assert(!tide::policy_set<bad_idle>);
struct bad_metadata : tide::default_policies {
  using metadata = tide::policy::lru;
};
static_assert(!tide::policy_set<bad_metadata>);
struct bad_path : tide::default_policies {
  using path = tide::policy::mix_hash;
};
static_assert(!tide::policy_set<bad_path>);
struct no_path {
  using eviction = tide::policy::sieve;
  using shard_hash = tide::policy::mix_hash;
  using idle = tide::policy::hybrid;
};
static_assert(!tide::policy_set<no_path>);
struct round_robin_paths : tide::default_policies {
  using path = tide::policy::round_robin;
};
static_assert(tide::policy_set<round_robin_paths>);
struct classic_paths : tide::default_policies {
  using path = tide::policy::mooncake_random;
};
static_assert(tide::policy_set<classic_paths>);

TEST_CASE("endpoint_store over the archetypes") {
  using store = tide::endpoint_store<arch::endpoint, arch::eviction>;
  auto s = store::create(2);
  REQUIRE(s.has_value());
  auto make = [](std::string_view) -> tide::result<std::unique_ptr<arch::endpoint>> {
    return std::make_unique<arch::endpoint>();
  };
  auto a = (*s)->get_or_insert("a@x", make);
  REQUIRE(a.has_value());
  (*a)->outstanding_ = 1;
  arch::endpoint* a_raw = a->get();
  a->reset();
  REQUIRE((*s)->insert("b@x", make).has_value());
  REQUIRE((*s)->insert("c@x", make).has_value());  // evicts a (FIFO archetype)
  CHECK(a_raw->evicted_);
  CHECK((*s)->draining() == 1);
  CHECK((*s)->reclaim() == 0);
  a_raw->outstanding_ = 0;
  CHECK((*s)->reclaim() == 1);
  CHECK((*s)->find("b@x"));
  CHECK((*s)->erase("b@x").has_value());
  CHECK((*s)->size() == 1);
}

TEST_CASE("the idle and metadata archetypes run") {
  auto i = arch::idle::create({});
  REQUIRE(i.has_value());
  i->on_empty([]() noexcept { return false; });
  i->wake();
  arch::metadata m(tide::metadata_config{});
  CHECK(m.put_segment("s", "{}").has_value());
  CHECK(m.get_segment("s").value() == "{}");
  CHECK(m.get_segment("t").error().code == tide::errc::segment_not_found);
}

// Conformance of metadata backends to the documented semantics of
// tide::metadata_backend.  Only backends that need no server belong here;
// the lead adds tide::policy::in_process (and p2p where it runs without a
// peer) to this list when the metadata branch merges.
using metadata_backends_under_test = std::tuple<arch::metadata, tide::policy::in_process>;

TEST_CASE_TEMPLATE_DEFINE("metadata backend conformance", B, metadata_conformance) {
  static_assert(tide::metadata_backend<B>);
  B b(tide::metadata_config{});
  CHECK_FALSE(B::kName.empty());
  auto missing = b.get_segment("conformance-missing");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == tide::errc::segment_not_found);
  REQUIRE(b.put_segment("conformance-a", R"({"name":"conformance-a"})").has_value());
  auto got = b.get_segment("conformance-a");
  REQUIRE(got.has_value());
  CHECK(*got == R"({"name":"conformance-a"})");
  REQUIRE(b.put_segment("conformance-a", R"({"name":"conformance-a","v":2})").has_value());  // overwrite
  CHECK(b.get_segment("conformance-a").value() == R"({"name":"conformance-a","v":2})");
  REQUIRE(b.remove_segment("conformance-a").has_value());
  CHECK(b.get_segment("conformance-a").error().code == tide::errc::segment_not_found);
}
TEST_CASE_TEMPLATE_APPLY(metadata_conformance, metadata_backends_under_test);
