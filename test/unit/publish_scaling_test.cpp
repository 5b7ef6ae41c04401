// Publishing after every registration (review turn 3, finding 20): a publish
// encodes and seals only the buffers that are new or changed, and what it
// stores is byte for byte what an encode from scratch writes.  Counted, not
// timed: the encodes and seals per publish are what grew with N.

#include <tide/metadata/segment_cache.hpp>
#include <tide/policy/in_process.hpp>
#include <tide/wire/auth.hpp>
#include <tide/wire/seal.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

using namespace tide;

namespace {

std::shared_ptr<const wire::cluster_secret> secret_of(char fill) {
  return wire::cluster_secret::from_bytes(std::string(32, fill)).value();
}

metadata_config config(const char* cluster, std::shared_ptr<const wire::cluster_secret> s) {
  metadata_config c;
  c.cluster_id = cluster;
  c.secret = std::move(s);
  return c;
}

segment_desc header() {
  segment_desc d;
  d.name = "10.47.0.1:15123";
  d.devices = {{"rxe0", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01")},
               {"rxe2", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:01:01")}};
  d.priority = {{"cpu:0", {{"rxe0"}, {"rxe2"}}}};
  return d;
}

buffer_desc buffer_at(std::uint32_t id, std::uint64_t slot, buffer_access access) {
  buffer_desc b;
  b.name = "cpu:0";
  b.addr = 0x7f0000000000 + slot * 0x10000;
  b.length = 0x10000 - 64 * (id % 3);
  b.lkey = {1000 + id, 2000 + id};
  b.rkey = {3000 + id, 4000 + id};
  b.access = access;
  b.id = id;
  return b;
}

// The sealed blobs and the "buffers" MAC (which covers the blobs) come out
// different from every seal (random nonces); the rest of the text must not.
std::string without_blobs(const std::string& json) {
  static const std::regex blob(R"re("sealed":"[0-9a-f]+")re");
  static const std::regex buffers_mac(R"re("buffers":"[0-9a-f]{64}")re");
  return std::regex_replace(std::regex_replace(json, blob, "\"sealed\":\"\""), buffers_mac, "\"buffers\":\"\"");
}

}  // namespace

TEST_CASE("publishing after each of 300 registrations encodes and seals one buffer per publish") {
  for (const bool sealed : {false, true}) {
    CAPTURE(sealed);
    auto key = sealed ? secret_of('s') : nullptr;
    segment_cache<policy::in_process> cache{config(sealed ? "scale-s" : "scale", key)};
    segment_desc d = header();
    const std::uint64_t seals_before = wire::seals_done();
    for (std::uint32_t k = 0; k < 300; ++k) {
      d.buffers.push_back(buffer_at(k, k, buffer_access::remote_read_write));
      REQUIRE(cache.publish_json(d).has_value());
      // The k-th registration's publish encodes the k-th buffer and no other.
      REQUIRE(cache.encoded_buffers() == k + 1);
      REQUIRE(wire::seals_done() - seals_before == (sealed ? k + 1 : 0));
    }
    // Unregistering encodes nothing; the survivors keep their entries.
    for (int i = 0; i < 100; ++i) {
      d.buffers.erase(d.buffers.begin() + static_cast<std::ptrdiff_t>(d.buffers.size() / 2));
      REQUIRE(cache.publish_json(d).has_value());
    }
    CHECK(cache.encoded_buffers() == 300);
    CHECK(wire::seals_done() - seals_before == (sealed ? 300u : 0u));
    // The same buffers again (a publish that changed nothing but the time): nothing encoded.
    REQUIRE(cache.publish_json(d).has_value());
    CHECK(cache.encoded_buffers() == 300);
  }
}

TEST_CASE("after random register/unregister/local_only publishes, the stored descriptor is a from-scratch encode") {
  for (const bool sealed : {false, true}) {
    CAPTURE(sealed);
    auto key = sealed ? secret_of('r') : nullptr;
    segment_cache<policy::in_process> writer{config(sealed ? "random-s" : "random", key)};
    policy::in_process store{config(sealed ? "random-s" : "random", key)};
    std::mt19937 g(20);
    constexpr std::uint64_t kSlots = 96;
    std::vector<std::uint64_t> free_slots(kSlots);
    for (std::uint64_t i = 0; i < kSlots; ++i) free_slots[i] = i;
    std::shuffle(free_slots.begin(), free_slots.end(), g);  // addresses out of id order too
    segment_desc model = header();  // buffers in id order, as the transport lists them
    std::uint32_t next_id = 0;
    std::uint64_t expected_encodes = 0;
    for (int step = 0; step < 400; ++step) {
      CAPTURE(step);
      const unsigned op = g() % 8;
      if ((op < 4 || model.buffers.empty()) && !free_slots.empty()) {
        const std::uint64_t slot = free_slots.back();
        free_slots.pop_back();
        const auto access = static_cast<buffer_access>(1 + g() % 3);
        model.buffers.push_back(buffer_at(next_id++, slot, access));
        ++expected_encodes;
      } else if (op == 4) {
        ++next_id;  // a local_only registration: an id used, nothing published
      } else if (!model.buffers.empty()) {
        const std::size_t at = g() % model.buffers.size();
        free_slots.insert(free_slots.begin() + static_cast<std::ptrdiff_t>(g() % (free_slots.size() + 1)),
                          (model.buffers[at].addr - 0x7f0000000000) / 0x10000);
        model.buffers.erase(model.buffers.begin() + static_cast<std::ptrdiff_t>(at));
      }
      auto published = writer.publish_json(model);
      REQUIRE_MESSAGE(published.has_value(), published.error());
      REQUIRE(writer.encoded_buffers() == expected_encodes);
      // What a reader of the store gets is what was published.
      auto stored = store.get_segment(model.name);
      REQUIRE(stored.has_value());
      REQUIRE(*stored == *published);
      // A from-scratch encode of the same buffers, with the publish's
      // timestamp and marks (the writer's incarnation; with a secret its stamp).
      auto opened = decode_segment(*stored, key.get());
      REQUIRE_MESSAGE(opened.has_value(), opened.error());
      CHECK(opened->incarnation == writer.incarnation());
      CHECK(opened->stamp.has_value() == sealed);
      segment_desc scratch = model;
      scratch.timestamp = opened->timestamp;
      scratch.incarnation = opened->incarnation;
      scratch.stamp = opened->stamp;
      CHECK(*opened == scratch);
      const std::string fresh = encode_segment(scratch, key.get()).value();
      if (sealed)
        CHECK(without_blobs(*stored) == without_blobs(fresh));
      else
        CHECK(*stored == fresh);
    }
  }
}

TEST_CASE("a seal cache starts over under another secret or segment name") {
  auto a = secret_of('a'), b = secret_of('b');
  wire::seal_cache cache;
  segment_desc d = header();
  d.buffers = {buffer_at(0, 0, buffer_access::remote_read_write), buffer_at(1, 1, buffer_access::remote_read)};
  REQUIRE(encode_segment(d, a.get(), &cache).has_value());
  CHECK(cache.misses() == 2);
  // Blobs sealed under a would not open under b, nor under another name.
  auto other_key = encode_segment(d, b.get(), &cache);
  REQUIRE(other_key.has_value());
  CHECK(cache.misses() == 4);
  CHECK(decode_segment(*other_key, b.get()).has_value());
  d.name = "10.47.0.1:15124";
  auto other_name = encode_segment(d, b.get(), &cache);
  REQUIRE(other_name.has_value());
  CHECK(cache.misses() == 6);
  CHECK(decode_segment(*other_name, b.get()).has_value());
  // Unsealed entries are not reused for a sealed encode either.
  auto plain = encode_segment(d, nullptr, &cache);
  REQUIRE(plain.has_value());
  CHECK(cache.misses() == 8);
  CHECK(*plain == encode_segment(d));
}
