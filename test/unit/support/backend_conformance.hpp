#pragma once
// One conformance check for every metadata backend, run against a real store
// by each backend's test (in_process, p2p, http here; etcd in its own suite).
//
// A fixture provides: `config()` -> metadata_config reaching the store,
// `name(i)` -> a segment name the backend can store (p2p: "127.0.0.1:<port>"
// of a running handshake server), `kSharedStore` (keys shared through a
// cluster id, false for p2p).

#include <tide/metadata/segment_cache.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace tide::test {

inline segment_desc conformance_segment(const std::string& name, std::size_t nbuffers) {
  segment_desc d;
  d.name = name;
  d.devices = {{"rxe0", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01")},
               {"rxe1", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:02")}};
  d.priority = {{"cpu:0", {{"rxe0"}, {"rxe1"}}}};
  for (std::size_t i = 0; i < nbuffers; ++i) {
    d.buffers.push_back({"cpu:0", 0x7f0000000000 + 0x100000 * i, 0x80000,
                         {static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i + 1)},
                         {static_cast<std::uint32_t>(50 + i), static_cast<std::uint32_t>(60 + i)}});
  }
  return d;
}

template <class Backend, class Fixture>
void check_backend_conformance(Fixture& f) {
  Backend b{f.config()};
  const std::string n0 = f.name(0);
  const std::string n1 = f.name(1);

  SUBCASE("absent, put, get exact bytes, overwrite, remove") {
    auto absent = b.get_segment(n0);
    REQUIRE_FALSE(absent.has_value());
    CHECK(absent.error().code == errc::segment_not_found);

    const std::string json = "{\"name\":\"" + n0 + "\",\"note\":\"caf\xc3\xa9 \\u00e9\"}\n";
    REQUIRE(b.put_segment(n0, json).has_value());
    auto got = b.get_segment(n0);
    REQUIRE_MESSAGE(got.has_value(), got.error());
    CHECK(*got == json);
    CHECK(b.get_segment(n1).error().code == errc::segment_not_found);  // names are independent

    REQUIRE(b.put_segment(n0, "{\"v\":2}").has_value());
    CHECK(*b.get_segment(n0) == "{\"v\":2}");

    REQUIRE(b.remove_segment(n0).has_value());
    CHECK(b.get_segment(n0).error().code == errc::segment_not_found);
    CHECK(b.remove_segment(n0).error().code == errc::segment_not_found);
  }

  SUBCASE("a second backend object sees what the first stored") {
    Backend other{f.config()};
    REQUIRE(b.put_segment(n1, "{\"from\":\"b\"}").has_value());
    auto got = other.get_segment(n1);
    REQUIRE(got.has_value());
    CHECK(*got == "{\"from\":\"b\"}");
    REQUIRE(other.remove_segment(n1).has_value());
  }

  if constexpr (Fixture::kSharedStore) {
    SUBCASE("cluster ids separate namespaces; odd characters in names survive") {
      auto ca = f.config();
      ca.cluster_id = "team-a";
      auto cb = f.config();
      cb.cluster_id = "team-b/";
      Backend a{ca};
      Backend bb{cb};
      REQUIRE(a.put_segment(n0, "{\"team\":\"a\"}").has_value());
      CHECK(bb.get_segment(n0).error().code == errc::segment_not_found);
      CHECK(b.get_segment(n0).error().code == errc::segment_not_found);
      CHECK(*a.get_segment(n0) == "{\"team\":\"a\"}");
      REQUIRE(a.remove_segment(n0).has_value());

      const std::string odd = "odd name/with?query&k=v%20+#frag";
      REQUIRE(b.put_segment(odd, "{\"odd\":true}").has_value());
      CHECK(*b.get_segment(odd) == "{\"odd\":true}");
      CHECK(b.get_segment("odd name/with?query&k=v%20 #frag").error().code == errc::segment_not_found);
      REQUIRE(b.remove_segment(odd).has_value());
    }
  }

  SUBCASE("segment_cache end to end: publish, open, find_buffer, refresh after a new registration") {
    segment_cache<Backend> publisher{f.config()};
    segment_cache<Backend> reader{f.config()};
    REQUIRE(publisher.publish(conformance_segment(n1, 1)).has_value());
    auto id = reader.open(n1);
    REQUIRE_MESSAGE(id.has_value(), id.error());
    auto hit = reader.find_buffer(*id, 0x7f0000000000 + 8, 8);
    REQUIRE(hit.has_value());
    CHECK(hit->buffer().rkey == std::vector<std::uint32_t>{50, 60});
    REQUIRE(publisher.publish(conformance_segment(n1, 3)).has_value());
    auto later = reader.find_buffer(*id, 0x7f0000000000 + 0x200000, 0x80000);
    REQUIRE_MESSAGE(later.has_value(), later.error());
    CHECK(later->index == 2);
    CHECK(reader.find_buffer(*id, 0x7f0000000000 + 0x80000, 1).error().code == errc::out_of_bounds);
    REQUIRE(reader.close(*id).has_value());
    REQUIRE(publisher.unpublish(n1).has_value());
  }

  SUBCASE("several threads at once") {
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        Backend mine{f.config()};
        const std::string n = f.name(static_cast<std::size_t>(t % 2));
        for (int i = 0; i < 10; ++i) {
          if (!mine.put_segment(n, "{\"i\":" + std::to_string(i) + "}").has_value()) ++failures;
          auto got = mine.get_segment(n);
          if (!got || got->find("{\"i\":") != 0) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(failures == 0);
    (void)b.remove_segment(n0);
    (void)b.remove_segment(n1);
  }
}

}  // namespace tide::test
