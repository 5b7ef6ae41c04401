// Shard hashes: Mooncake's formula by hand, stability, range, spread,
// shard-count validation, and a conformance test over every shipped hash.

#include <tide/policy/detail/mix.hpp>
#include <tide/policy/mix_hash.hpp>
#include <tide/policy/mooncake_hash.hpp>
#include <tide/policy/peer_path_hash.hpp>
#include <tide/policy/shard_hash.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using tide::shard_key;
namespace pol = tide::policy;

static_assert(tide::shard_hash_policy<pol::mooncake_hash>);
static_assert(tide::shard_hash_policy<pol::mix_hash>);
static_assert(tide::shard_hash_policy<pol::peer_path_hash>);

namespace {
struct throws_hash {  // shard() is not noexcept: rejected
  static constexpr const char* kName = "x";
  static constexpr bool kNeedsPowerOfTwo = false;
  static std::size_t shard(const shard_key&, std::size_t) { return 0; }
};
struct no_flag_hash {  // no kNeedsPowerOfTwo: rejected
  static constexpr const char* kName = "x";
  static std::size_t shard(const shard_key&, std::size_t) noexcept { return 0; }
};
}  // namespace
static_assert(!tide::shard_hash_policy<throws_hash>);
static_assert(!tide::shard_hash_policy<no_flag_hash>);

// Compile-time shard counts (a bad one is a compile error: see test/compile_fail).
static_assert(tide::static_shard_count<pol::mix_hash, 16>::value == 16);
static_assert(tide::static_shard_count<pol::mooncake_hash, 12>::value == 12);
static_assert(tide::check_shard_count<pol::mix_hash>(12) == tide::errc::invalid_argument);
// The hashes are constexpr: the same value at compile time as at run time.
static_assert(pol::mooncake_hash::shard({3, 2, {}}, 8) == 7);

TEST_CASE("mooncake_hash is (target_id * 10007 + device_id) % shards") {
  // Worked by hand: 3 * 10007 + 2 = 30023 = 8 * 3752 + 7.
  CHECK(pol::mooncake_hash::shard({3, 2, "x@y"}, 8) == 7);
  // 10 * 10007 + 5 = 100075 = 16 * 6254 + 11.
  CHECK(pol::mooncake_hash::shard({10, 5, {}}, 16) == 11);
  // Any count, not only powers of two: 100075 = 12 * 8339 + 7.
  CHECK(pol::mooncake_hash::shard({10, 5, {}}, 12) == 7);
  // Its weakness: device ids 0 and 8 of one segment collide on 8 shards.
  CHECK(pol::mooncake_hash::shard({4, 0, {}}, 8) == pol::mooncake_hash::shard({4, 8, {}}, 8));
}

TEST_CASE("the mixing functions match their published definitions") {
  // FNV-1a 64 test vectors (Fowler/Noll/Vo reference).
  CHECK(pol::detail::fnv1a64("") == 0xcbf29ce484222325ULL);
  CHECK(pol::detail::fnv1a64("a") == 0xaf63dc4c8601ec8cULL);
  CHECK(pol::detail::fnv1a64("foobar") == 0x85944171f73967e8ULL);
  // fmix64 is a bijection fixing 0.
  CHECK(pol::detail::fmix64(0) == 0);
  CHECK(pol::detail::fmix64(1) != pol::detail::fmix64(2));
  // reduce() maps onto [0, n) by the high bits.
  CHECK(pol::detail::reduce(0, 7) == 0);
  CHECK(pol::detail::reduce(~0ULL, 7) == 6);
  CHECK(pol::detail::reduce(1ULL << 63, 10) == 5);
}

TEST_CASE("shard counts: 0 and non-powers of two are rejected where required") {
  CHECK(tide::check_shard_count<pol::mix_hash>(0) == tide::errc::invalid_argument);
  CHECK(tide::check_shard_count<pol::mooncake_hash>(0) == tide::errc::invalid_argument);
  CHECK(tide::check_shard_count<pol::mix_hash>(8) == tide::errc::ok);
  CHECK(tide::check_shard_count<pol::mix_hash>(1) == tide::errc::ok);
  CHECK(tide::check_shard_count<pol::peer_path_hash>(12) == tide::errc::ok);
  auto bad = tide::validate_shard_count<pol::mix_hash>(12);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code == tide::errc::invalid_argument);
  CHECK(bad.error().detail.find("power of two") != std::string::npos);
  CHECK(bad.error().detail.find("8 or 16") != std::string::npos);
  CHECK(tide::validate_shard_count<pol::mooncake_hash>(12).has_value());
  CHECK_FALSE(tide::validate_shard_count<pol::peer_path_hash>(0).has_value());
}

TEST_CASE("peer_path_hash: same path, same shard, whatever the segment id") {
  const std::string path = "prefill-node-3:12345@mlx5_1";
  const std::size_t s0 = pol::peer_path_hash::shard({0, 0, path}, 16);
  for (std::uint64_t target = 0; target < 100; ++target) {
    // A copy of the path in another buffer: only the bytes matter.
    const std::string copy(path.begin(), path.end());
    CHECK(pol::peer_path_hash::shard({target, static_cast<std::uint32_t>(target % 9), copy}, 16) == s0);
  }
}

namespace {
// Realistic keys: segments 0..N-1, each with devices 0..8 ("srv<t>@mlx5_<d>").
template <class H>
std::vector<int> loads(std::size_t segments, std::size_t shards) {
  std::vector<int> load(shards, 0);
  for (std::uint64_t t = 0; t < segments; ++t) {
    for (std::uint32_t d = 0; d < 9; ++d) {
      const std::string path = "node" + std::to_string(t) + ":15000@mlx5_" + std::to_string(d);
      ++load[H::shard({t, d, path}, shards)];
    }
  }
  return load;
}
double max_over_mean(const std::vector<int>& load) {
  double sum = 0;
  for (int l : load) sum += l;
  return *std::max_element(load.begin(), load.end()) / (sum / static_cast<double>(load.size()));
}
}  // namespace

TEST_CASE_TEMPLATE("shard hash conformance", H, pol::mooncake_hash, pol::mix_hash, pol::peer_path_hash) {
  SUBCASE("in range and deterministic for every valid count") {
    for (std::size_t n : {1, 2, 4, 8, 16, 64, 3, 12}) {
      if (tide::check_shard_count<H>(n) != tide::errc::ok) continue;
      for (std::uint64_t t = 0; t < 200; ++t) {
        for (std::uint32_t d = 0; d < 9; ++d) {
          const std::string path = "s" + std::to_string(t) + "@nic" + std::to_string(d);
          const std::size_t a = H::shard({t, d, path}, n);
          REQUIRE(a < n);
          REQUIRE(H::shard({t, d, std::string(path)}, n) == a);
        }
      }
    }
  }
  SUBCASE("one shard: everything on shard 0") {
    CHECK(H::shard({123456789, 7, "a@b"}, 1) == 0);
  }
  SUBCASE("spread over realistic keys: no shard far above a random assignment") {
    // Balls into bins: with mean m keys per shard, a random hash rarely puts
    // more than m + 4 sqrt(m) + 2 on one shard (72 keys on 16 shards: 15).
    for (std::size_t shards : {8, 16}) {
      for (std::size_t segments : {8, 64, 512}) {
        const auto load = loads<H>(segments, shards);
        const double mean = static_cast<double>(segments * 9) / static_cast<double>(shards);
        CAPTURE(shards);
        CAPTURE(segments);
        CHECK(*std::max_element(load.begin(), load.end()) <= mean + 4 * std::sqrt(mean) + 2);
        CHECK(*std::min_element(load.begin(), load.end()) > 0);
      }
    }
  }
}

TEST_CASE("the avalanching hashes spread at least as well as a 1.5x bound on many keys") {
  for (std::size_t shards : {8, 16}) {
    CHECK(max_over_mean(loads<pol::mix_hash>(512, shards)) < 1.5);
    CHECK(max_over_mean(loads<pol::peer_path_hash>(512, shards)) < 1.5);
  }
}
