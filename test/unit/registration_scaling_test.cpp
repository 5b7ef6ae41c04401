// Registration in O(1) per buffer with p2p metadata: a registration changes
// the descriptor a peer will be served, it does not encode it; the first peer
// to ask after a change gets it encoded once, with every buffer.  Counted,
// not timed: encodes per registration are what made N registrations O(N^2).
// Engines on TCP alone over loopback, so no RDMA device is needed.
#include <tide/engine.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

using namespace std::chrono_literals;

namespace {

tide::engine_config tcp_config(const std::string& secret_file = "") {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.bind_host = "127.0.0.1";
  c.transports = "tcp";
  c.auth_secret_file = secret_file;
  return c;
}

std::unique_ptr<tide::transfer_engine<>> make(const tide::engine_config& c) {
  auto e = tide::transfer_engine<>::create(c);
  if (!e) FAIL("create: " << e.error().message());
  return std::move(*e);
}

// The buffers the peer sees in `owner`'s descriptor, read afresh.
std::size_t buffers_seen(tide::transfer_engine<>& peer, tide::transfer_engine<>& owner) {
  auto seg = peer.open_segment(owner.segment_name());
  REQUIRE(seg);
  auto d = peer.segment_descriptor(*seg);
  REQUIRE(d);
  const std::size_t n = (*d)->buffers.size();
  REQUIRE(peer.close_segment(*seg));  // the last close drops it: the next open fetches
  return n;
}

}  // namespace

TEST_CASE("p2p: registrations one by one encode nothing; the next peer request encodes once, with every buffer") {
  const auto secret = std::filesystem::temp_directory_path() / "tide-registration-scaling.secret";
  {
    std::ofstream(secret) << std::string(32, 'k');
    std::filesystem::permissions(secret, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
                                 std::filesystem::perm_options::replace);
  }
  for (const bool sealed : {false, true}) {
    CAPTURE(sealed);
    const auto cfg = tcp_config(sealed ? secret.string() : "");
    auto owner = make(cfg);
    auto peer = make(cfg);
    constexpr std::size_t kBuffers = 500, kEach = 4096;
    std::vector<unsigned char> memory(kBuffers * kEach);
    const std::uint64_t before = owner->descriptor_encodes();
    for (std::size_t i = 0; i < kBuffers; ++i) REQUIRE(owner->register_memory(memory.data() + i * kEach, kEach));
    CHECK(owner->descriptor_encodes() == before);  // one encode each here was the O(N^2)
    CHECK(buffers_seen(*peer, *owner) == kBuffers);
    CHECK(owner->descriptor_encodes() == before + 1);
    // Nothing changed: the next request is answered from the same encode.
    CHECK(buffers_seen(*peer, *owner) == kBuffers);
    CHECK(owner->descriptor_encodes() == before + 1);
    // An unregister and a batch are changes like any other.
    REQUIRE(owner->unregister_memory(memory.data()));
    void* const back[] = {memory.data() + kEach};
    REQUIRE(owner->unregister_memory_batch(back));
    CHECK(owner->descriptor_encodes() == before + 1);
    CHECK(buffers_seen(*peer, *owner) == kBuffers - 2);
    const tide::buffer_entry again[] = {{memory.data(), kEach}, {memory.data() + kEach, kEach}};
    REQUIRE(owner->register_memory_batch(again, "cpu:0"));
    CHECK(buffers_seen(*peer, *owner) == kBuffers);
    CHECK(owner->descriptor_encodes() == before + 3);
    // And what the peer was served works: a WRITE into the last buffer.
    auto seg = peer->open_segment(owner->segment_name());
    REQUIRE(seg);
    std::vector<unsigned char> src(kEach, 0x5a);
    REQUIRE(peer->register_memory(src.data(), src.size()));
    auto batch = peer->allocate_batch(1);
    REQUIRE(batch);
    const auto last = owner->buffer_id(memory.data() + (kBuffers - 1) * kEach);
    REQUIRE(last);
    auto w = tide::transfer_request::in_buffer(tide::transfer_op::write, src.data(), *seg, *last, 0, kEach);
    REQUIRE(peer->submit(*batch, {&w, 1}));
    REQUIRE(peer->wait(*batch, 30s));
    CHECK(peer->status_of(*batch, 0).value().state == tide::transfer_state::completed);
    CHECK(memory[(kBuffers - 1) * kEach + kEach - 1] == 0x5a);
    REQUIRE(peer->free_batch(*batch));
  }
  std::filesystem::remove(secret);
}
