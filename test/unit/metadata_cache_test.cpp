// segment_cache over the in-process backend, with a counting wrapper so that
// the forced refresh is observed rather than assumed.

#include <tide/metadata/segment_cache.hpp>
#include <tide/policy/in_process.hpp>
#include <tide/rdma/segment.hpp>
#include <tide/wire/auth.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

using namespace tide;

namespace {

// A model of the backend concept that counts round trips to the store.
class counting_backend {
 public:
  static constexpr std::string_view kName = "counting";
  explicit counting_backend(const metadata_config& c) : inner_(c) {}
  result<std::string> get_segment(std::string_view name) {
    ++gets;
    return inner_.get_segment(name);
  }
  status put_segment(std::string_view name, std::string_view json) { return inner_.put_segment(name, json); }
  status remove_segment(std::string_view name) { return inner_.remove_segment(name); }
  std::atomic<int> gets{0};

 private:
  policy::in_process inner_;
};
static_assert(metadata_backend<counting_backend>);

metadata_config cluster(const char* id) {
  metadata_config c;
  c.cluster_id = id;
  return c;
}

segment_desc segment(const std::string& name, std::size_t nbuffers) {
  segment_desc d;
  d.name = name;
  d.devices = {{"rxe0", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01")}};
  d.priority = {{"cpu:0", {{"rxe0"}, {}}}};
  for (std::size_t i = 0; i < nbuffers; ++i) {
    d.buffers.push_back({"cpu:0", 0x100000 * (i + 1), 0x10000, {static_cast<std::uint32_t>(i)},
                         {static_cast<std::uint32_t>(100 + i)}});
  }
  return d;
}

}  // namespace

TEST_CASE("open gives small stable ids, caches, counts opens, and reuses an id after close") {
  segment_cache<counting_backend> writer{cluster("ids")};
  REQUIRE(writer.publish(segment("a", 1)).has_value());
  REQUIRE(writer.publish(segment("b", 1)).has_value());

  segment_cache<counting_backend> cache{cluster("ids")};
  auto missing = cache.open("nobody");
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == errc::segment_not_found);
  CHECK(cache.open("").error().code == errc::invalid_argument);

  auto a = cache.open("a");
  REQUIRE_MESSAGE(a.has_value(), a.error());
  CHECK(*a == 1);  // the failed open consumed no id, and 0 stays the local segment's
  CHECK(*cache.open("b") == 2);
  const int gets = cache.backend().gets;
  CHECK(*cache.open("a") == 1);
  CHECK(cache.backend().gets == gets);  // served from the cache
  CHECK(cache.open_count() == 2);
  CHECK(*cache.name_of(1) == "a");

  REQUIRE(cache.close(1).has_value());
  CHECK(cache.get(1).has_value());  // still opened once
  REQUIRE(cache.close(1).has_value());
  CHECK(cache.get(1).error().code == errc::unknown_segment);
  CHECK(cache.close(1).error().code == errc::unknown_segment);
  CHECK(cache.get(kLocalSegmentId).error().code == errc::unknown_segment);
  CHECK(*cache.open("a") == 1);  // same name, same id
  CHECK(cache.backend().gets == gets + 1);
}

TEST_CASE("a stored descriptor that does not validate is reported with the segment named") {
  segment_cache<counting_backend> cache{cluster("bad")};
  REQUIRE(cache.backend().put_segment("broken", R"({"name":"broken","protocol":"rdma"})").has_value());
  auto r = cache.open("broken");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_malformed);
  CHECK(r.error().detail.find("segment broken: devices: missing") != std::string::npos);
}

TEST_CASE("publish validates, stamps the time and stores nothing on failure") {
  segment_cache<counting_backend> cache{cluster("publish")};
  segment_desc bad = segment("p", 2);
  bad.buffers[1].rkey.clear();
  auto r = cache.publish(bad);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_malformed);
  CHECK(r.error().detail.find("buffers[1].rkey") != std::string::npos);
  CHECK(cache.backend().get_segment("p").error().code == errc::segment_not_found);

  REQUIRE(cache.publish(segment("p", 2)).has_value());
  auto id = cache.open("p");
  REQUIRE(id.has_value());
  auto d = *cache.get(*id);
  CHECK(d->timestamp.size() == 26);
  CHECK(d->buffers == segment("p", 2).buffers);
  REQUIRE(cache.unpublish("p").has_value());
  CHECK(cache.unpublish("p").error().code == errc::segment_not_found);
}

TEST_CASE("find_buffer: a hit costs nothing, a miss forces exactly one refresh") {
  segment_cache<counting_backend> owner{cluster("find")};
  REQUIRE(owner.publish(segment("peer", 1)).has_value());
  segment_cache<counting_backend> cache{cluster("find")};
  const segment_id id = *cache.open("peer");
  const int base = cache.backend().gets;

  auto hit = cache.find_buffer(id, 0x100000 + 10, 100);
  REQUIRE(hit.has_value());
  CHECK(hit->index == 0);
  CHECK(hit->buffer().rkey[0] == 100);
  CHECK(cache.backend().gets == base);

  // The peer registers a second buffer after we cached its descriptor.
  const auto before = *cache.get(id);
  const segment_desc before_copy = *before;
  REQUIRE(owner.publish(segment("peer", 2)).has_value());
  auto fresh = cache.find_buffer(id, 0x200000, 0x10000);
  REQUIRE_MESSAGE(fresh.has_value(), fresh.error());
  CHECK(fresh->index == 1);
  CHECK(fresh->buffer().rkey[0] == 101);
  CHECK(cache.backend().gets == base + 1);
  CHECK(*before == before_copy);  // a reader's old descriptor never changes
  CHECK(before->buffers.size() == 1);
  CHECK((*cache.get(id))->buffers.size() == 2);

  auto outside = cache.find_buffer(id, 0x900000, 1);
  REQUIRE_FALSE(outside.has_value());
  CHECK(outside.error().code == errc::out_of_bounds);
  CHECK(outside.error().detail.find("peer") != std::string::npos);
  CHECK(cache.backend().gets == base + 2);

  CHECK(cache.find_buffer(id, 0x100000, 0).error().code == errc::zero_length);
  CHECK(cache.find_buffer(99, 0x100000, 1).error().code == errc::unknown_segment);
  CHECK(cache.backend().gets == base + 2);

  // A refresh that fails keeps the cached descriptor.
  REQUIRE(owner.unpublish("peer").has_value());
  auto gone = cache.refresh(id);
  REQUIRE_FALSE(gone.has_value());
  CHECK(gone.error().code == errc::segment_not_found);
  CHECK((*cache.get(id))->buffers.size() == 2);
}

TEST_CASE("the cache is safe under concurrent open, find_buffer, refresh, close and republish") {
  segment_cache<counting_backend> owner{cluster("threads")};
  const std::vector<std::string> names{"s0", "s1", "s2", "s3"};
  for (const auto& n : names) REQUIRE(owner.publish(segment(n, 2)).has_value());
  segment_cache<counting_backend> cache{cluster("threads")};

  std::atomic<int> failures{0};
  std::atomic<bool> stop{false};
  std::thread republisher([&] {
    std::size_t k = 2;
    while (!stop) {
      for (const auto& n : names) {
        if (!owner.publish(segment(n, k)).has_value()) ++failures;
      }
      k = k == 2 ? 3 : 2;
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      for (int i = 0; i < 300; ++i) {
        const std::string& n = names[rng() % names.size()];
        auto id = cache.open(n);
        if (!id) {
          ++failures;
          continue;
        }
        auto hit = cache.find_buffer(*id, 0x100000 + rng() % 0x10000, 1);
        if (!hit || hit->segment->name != n) ++failures;
        if (rng() % 4 == 0 && !cache.refresh(*id)) ++failures;
        if (!cache.close(*id)) ++failures;
      }
    });
  }
  for (auto& w : workers) w.join();
  stop = true;
  republisher.join();
  CHECK(failures == 0);
  CHECK(cache.open_count() == 0);
  // Ids stayed bound to their names throughout.
  for (std::size_t i = 0; i < names.size(); ++i) {
    auto id = cache.open(names[i]);
    REQUIRE(id.has_value());
    CHECK(*cache.name_of(*id) == names[i]);
    CHECK(*id >= 1);
    CHECK(*id <= names.size());
  }
}

namespace {

std::shared_ptr<const wire::cluster_secret> shared_secret() {
  return wire::cluster_secret::from_bytes(std::string(32, 's')).value();
}

}  // namespace

// Review 1ab3d99 #9: every MAC of an earlier publish still verifies, and no
// reader compared timestamps, so a store writer could put a whole earlier
// descriptor back: buffers registered since became out_of_bounds and
// unregistered ones came back.
TEST_CASE("review 1ab3d99 #9: with a secret a replayed earlier descriptor is refused, and stays refused after a reopen") {
  metadata_config c = cluster("replay");
  c.secret = shared_secret();
  segment_cache<policy::in_process> publisher{c}, reader{c};
  const std::string first = publisher.publish_json(segment("p", 1)).value();
  const std::string second = publisher.publish_json(segment("p", 2)).value();
  CHECK(decode_segment(second, c.secret.get())->stamp > decode_segment(first, c.secret.get())->stamp);
  auto id = reader.open("p");
  REQUIRE(id);
  CHECK(reader.get(*id).value()->buffers.size() == 2);
  // The store writer puts the first publish back: every MAC verifies.
  REQUIRE(publisher.backend().put_segment("p", first));
  REQUIRE(decode_segment(first, c.secret.get()).has_value());
  auto r = reader.refresh(*id);
  REQUIRE_FALSE(r);
  CHECK(r.error().code == errc::metadata_malformed);
  CHECK(r.error().detail.find("segment p: tide_stamp: ") == 0);
  CHECK(r.error().detail.find("a replay of an earlier publish") != std::string::npos);
  CHECK(reader.get(*id).value()->buffers.size() == 2);  // the newer view stays
  REQUIRE(reader.close(*id));
  auto reopened = reader.open("p");
  REQUIRE_FALSE(reopened);
  CHECK(reopened.error().detail.find("tide_stamp") != std::string::npos);
  // The publisher's next publish is newer than both: read again.
  REQUIRE(publisher.publish(segment("p", 3)));
  auto again = reader.open("p");
  REQUIRE(again);
  CHECK(reader.get(*again).value()->buffers.size() == 3);
  // A descriptor without a stamp after one with (a downgrade) is a replay too.
  auto stripped = decode_segment(second, c.secret.get()).value();
  stripped.stamp.reset();
  REQUIRE(publisher.backend().put_segment("p", encode_segment(stripped, c.secret.get()).value()));
  auto down = reader.refresh(*again);
  REQUIRE_FALSE(down);
  CHECK(down.error().detail.find("tide_stamp: missing") != std::string::npos);
  // Stamps are strictly increasing even within one clock tick.
  std::uint64_t last = 0;
  for (int i = 0; i < 50; ++i) {
    const auto s = decode_segment(publisher.publish_json(segment("q", 1)).value(), c.secret.get())->stamp.value();
    CHECK(s > last);
    last = s;
  }
}

// Review 1ab3d99 #10: buffer ids start at 0 in every process, and a restart
// keeps the segment name: the descriptor says which incarnation its ids
// belong to, and the segment view carries it (the transport fails requests
// by id once a refresh brings another one).
TEST_CASE("review 1ab3d99 #10: each engine's publishes carry its own incarnation; the segment view keeps it") {
  segment_cache<policy::in_process> before{cluster("incarnation")}, reader{cluster("incarnation")};
  REQUIRE(before.publish(segment("r", 1)));
  auto id = reader.open("r");
  REQUIRE(id);
  const auto d1 = reader.get(*id).value();
  REQUIRE(d1->incarnation.has_value());
  CHECK(*d1->incarnation == before.incarnation());
  // The same engine publishes again: same incarnation.
  REQUIRE(before.publish(segment("r", 2)));
  CHECK(reader.refresh(*id).value()->incarnation == before.incarnation());
  // "Restarted": another engine publishes under the same name.
  segment_cache<policy::in_process> after{cluster("incarnation")};
  CHECK(after.incarnation() != before.incarnation());
  REQUIRE(after.publish(segment("r", 1)));
  const auto d2 = reader.refresh(*id).value();
  CHECK(d2->incarnation == after.incarnation());
  // The views the transport builds keep it; one of them differs from the
  // incarnation the segment was opened with.
  auto v1 = rdma::remote_segment::resolve(*d1).value();
  auto v2 = rdma::remote_segment::resolve(*d2).value();
  CHECK(v1->incarnation == before.incarnation());
  CHECK(v2->incarnation == after.incarnation());
  CHECK(v1->find_id(0) == v2->find_id(0));  // why the id alone cannot tell
  // Written as 16 hex digits; Mooncake's descriptors have none (ids are then
  // indices, as before, and nothing is compared).
  const std::string text = encode_segment(*d2);
  CHECK(text.find("\"tide_incarnation\":\"") != std::string::npos);
  CHECK(decode_segment(text).value().incarnation == d2->incarnation);
  auto mooncake = *d2;
  mooncake.incarnation.reset();
  CHECK(encode_segment(mooncake).find("tide_incarnation") == std::string::npos);
  CHECK_FALSE(rdma::remote_segment::resolve(mooncake).value()->incarnation.has_value());
  auto bad = decode_segment(R"({"name":"x","protocol":"tcp","buffers":[],"tide_incarnation":"12"})");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().detail == "tide_incarnation: expected 16 hex digits");
}
