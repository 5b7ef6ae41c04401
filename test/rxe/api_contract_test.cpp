// The API contract on real (Soft-RoCE) devices (issue 11):
//  - final means final: after wait() returns on a CANCELED or TIMEOUT
//    READ, no byte of the local buffer changes any more;
//  - in flight: unregister_memory / close_segment say busy, drain, cancel;
//    a peer's buffer that disappears fails cleanly;
//  - stable buffer ids across register/unregister on the peer;
//  - the handshake address comes from rpc_meta (http mode), not the
//    segment name's port;
//  - after random register/unregister/local_only calls, the descriptor the
//    handshake port serves is a from-scratch encode of what is registered,
//    with and without the secret (publishes update their buffer list by the
//    change, review turn 3 finding 20).
//
// Two engines in one process: `a` on devices_under_test()[0], `b` on [1].
#include <doctest/doctest.h>

#include <tide/engine.hpp>
#include <tide/metadata/http_metadata_server.hpp>
#include <tide/net/handshake_client.hpp>
#include <tide/policy/http.hpp>
#include <tide/wire/auth.hpp>

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;
using tide::test::devices_under_test;
using tide::test::make_engine;

tide::engine_config config_for(const std::string& device) {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.devices = {device};
  c.transports = "rdma";
  c.workers_per_context = 1;
  c.num_qp_per_ep = 1;  // a lane owns one QP of every endpoint
  c.transfer_timeout = 60s;
  return c;
}

// Page-aligned memory filled with one byte value.
struct buffer {
  buffer(std::size_t n, unsigned char value)
      : size(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    std::memset(data, value, n);
  }
  ~buffer() { std::free(data); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  std::size_t size;
  unsigned char* data;
};

constexpr unsigned char kCanary = 0xab;
constexpr unsigned char kRemote = 0x5a;

// Starts `op` over the whole of `local` (in 4 MiB tasks) against
// `remote_addr` and returns its batch once the first bytes have moved (or
// right away when `wait_for_bytes` is false).
tide::batch_id start(tide::transfer_engine<>& a, transfer_op op, tide::segment_id seg, buffer& local,
                     std::uint64_t remote_addr, bool wait_for_bytes = true) {
  constexpr std::size_t kTask = 4u << 20;
  std::vector<transfer_request> reqs;
  for (std::size_t off = 0; off < local.size; off += kTask)
    reqs.push_back(transfer_request::at_address(op, local.data + off, seg, remote_addr + off,
                                                std::min(kTask, local.size - off)));
  auto batch = a.allocate_batch(reqs.size()).value();
  REQUIRE(a.submit(batch, reqs));
  for (int i = 0; wait_for_bytes && i < 4000 && a.batch_status(batch).value().transferred_bytes == 0; ++i)
    std::this_thread::sleep_for(1ms);
  return batch;
}

// Engine `a` (config `cfg_a`) with a canary-filled buffer, engine `b` with a
// buffer of kRemote bytes, both registered; `seg` is b's segment opened by a.
struct engine_pair {
  engine_pair(const tide::engine_config& cfg_a, const std::string& device_b, std::size_t size)
      : a(make_engine(cfg_a)), b(make_engine(config_for(device_b))), local(size, kCanary), remote(size, kRemote) {
    REQUIRE(a->register_memory(local.data, size, "cpu:0"));
    REQUIRE(b->register_memory(remote.data, size, "cpu:0"));
    seg = a->open_segment(b->segment_name()).value();
    remote_addr = reinterpret_cast<std::uint64_t>(remote.data);
  }
  std::unique_ptr<tide::transfer_engine<>> a, b;
  buffer local, remote;
  tide::segment_id seg{};
  std::uint64_t remote_addr = 0;
};

// After wait() returned: the buffer must not change any more.
void check_quiet_after_final(const buffer& local) {
  std::vector<unsigned char> snapshot(local.data, local.data + local.size);
  std::size_t canary_left = 0;
  for (unsigned char c : snapshot) canary_left += c == kCanary;
  std::this_thread::sleep_for(1500ms);
  std::size_t changed = 0;
  for (std::size_t i = 0; i < local.size; ++i) changed += local.data[i] != snapshot[i];
  MESSAGE(canary_left << " of " << local.size << " canary bytes untouched at wait(); " << changed
                      << " byte(s) changed after it");
  CHECK(changed == 0);
}

}  // namespace

// The final-means-final cases run twice: on registered memory, and staged
// (the staging switch: a READ's bytes are copied out of stage chunks as its
// WRs complete, which must also stop before the task is final).
tide::engine_config staged_or_not(tide::engine_config c, bool staged) {
  c.stage_host_memory = staged;
  c.stage_chunk_size = 64 << 10;
  c.stage_chunks = 8;
  return c;
}

TEST_CASE("final means final: a canceled READ writes nothing into the buffer after wait() returns") {
  const auto devs = devices_under_test();
  for (const bool staged : {false, true}) {
    CAPTURE(staged);
    engine_pair p(staged_or_not(config_for(devs[0]), staged), devs[1], 64u << 20);
    auto& [a, b, local, remote, seg, remote_addr] = p;
    auto batch = start(*a, transfer_op::read, seg, local, remote_addr);
    REQUIRE(a->cancel(batch));
    REQUIRE(a->wait(batch, 60s));
    auto st = a->batch_status(batch).value();
    MESSAGE("canceled batch: " << tide::to_string(st.state) << " (" << tide::to_string(st.reason) << "), "
                               << st.transferred_bytes << " bytes moved");
    CHECK(st.state == transfer_state::canceled);
    CHECK(st.reason == tide::errc::canceled);
    check_quiet_after_final(local);
    REQUIRE(a->free_batch(batch));
    // The engine still works afterwards.
    buffer again(1u << 20, kCanary);
    REQUIRE(a->register_memory(again.data, again.size, "cpu:0"));
    auto r = transfer_request::at_address(transfer_op::read, again.data, seg, remote_addr, again.size);
    auto ok = a->allocate_batch(1).value();
    REQUIRE(a->submit(ok, {&r, 1}));
    REQUIRE(a->wait(ok, 60s));
    CHECK(a->status_of(ok, 0).value().state == transfer_state::completed);
    CHECK(again.data[again.size - 1] == kRemote);
    REQUIRE(a->free_batch(ok));
  }
}

TEST_CASE("final means final: a READ past transfer_timeout ends TIMEOUT and writes nothing after wait()") {
  const auto devs = devices_under_test();
  for (const bool staged : {false, true}) {
    CAPTURE(staged);
    auto cfg = staged_or_not(config_for(devs[0]), staged);
    cfg.transfer_timeout = 150ms;  // far shorter than 64 MiB takes on rxe
    // 64 KiB WRs, at most 8 on the wire: most of the READ is still unposted at
    // the deadline (with 64 WRs of 1 MiB all of it was posted at once).
    cfg.max_wrs_read = 1024;
    cfg.max_wr = 8;
    constexpr std::size_t kSize = 64u << 20;
    engine_pair p(cfg, devs[1], kSize);
    auto& [a, b, local, remote, seg, remote_addr] = p;
    auto batch = start(*a, transfer_op::read, seg, local, remote_addr, false);
    REQUIRE(a->wait(batch, 60s));
    auto st = a->batch_status(batch).value();
    MESSAGE("timed-out batch: " << tide::to_string(st.state) << " (" << tide::to_string(st.reason) << "), "
                                << st.transferred_bytes << " bytes moved");
    CHECK(st.state == transfer_state::timeout);
    CHECK(st.reason == tide::errc::timed_out);
    CHECK(st.transferred_bytes < kSize);
    check_quiet_after_final(local);
    REQUIRE(a->free_batch(batch));
  }
}

TEST_CASE("in flight: unregister_memory and close_segment say busy; drain waits; cancel cancels") {
  const auto devs = devices_under_test();
  constexpr std::size_t kSize = 48u << 20;
  engine_pair p(config_for(devs[0]), devs[1], kSize);
  auto& [a, b, local, remote, seg, remote_addr] = p;

  auto batch = start(*a, transfer_op::write, seg, local, remote_addr);
  auto u = a->unregister_memory(local.data);
  REQUIRE_FALSE(u);
  CHECK(u.error().code == tide::errc::busy);
  CHECK(u.error().detail.find("slice(s) of submitted transfers still use") != std::string::npos);
  MESSAGE(u.error().message());
  auto c = a->close_segment(seg);
  REQUIRE_FALSE(c);
  CHECK(c.error().code == tide::errc::busy);
  MESSAGE(c.error().message());
  // Drain: returns once every slice is back; the transfer itself completes.
  REQUIRE(a->unregister_memory(local.data, tide::in_flight::drain));
  auto st = a->batch_status(batch).value();
  CHECK(st.state == transfer_state::completed);
  CHECK(std::memcmp(remote.data, local.data, kSize) == 0);
  REQUIRE(a->free_batch(batch));
  auto r = transfer_request::at_address(transfer_op::write, local.data, seg, remote_addr, 4096);
  auto again = a->allocate_batch(1).value();
  auto s = a->submit(again, {&r, 1});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::unregistered_source);

  // close_segment with cancel: the READ in flight ends CANCELED, then the segment is gone.
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  std::memset(local.data, kCanary, kSize);
  std::memset(remote.data, kRemote, kSize);  // the WRITE above left canaries there: a late READ must show
  batch = start(*a, transfer_op::read, seg, local, remote_addr);
  REQUIRE(a->close_segment(seg, tide::in_flight::cancel));
  st = a->batch_status(batch).value();
  MESSAGE("after close_segment(cancel): " << tide::to_string(st.state) << ", " << st.transferred_bytes << " bytes");
  CHECK(tide::is_final(st.state));
  CHECK(st.state == transfer_state::canceled);
  check_quiet_after_final(local);
  REQUIRE(a->free_batch(batch));
  s = a->submit(again, {&r, 1});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::unknown_segment);
  REQUIRE(a->free_batch(again));
}

TEST_CASE("in flight: a peer's buffer that disappears fails in flight (remote_access_error), then out_of_bounds") {
  const auto devs = devices_under_test();
  auto cfg = config_for(devs[0]);
  cfg.max_retry = 1;
  engine_pair p(cfg, devs[1], 48u << 20);
  auto& [a, b, local, remote, seg, remote_addr] = p;
  auto batch = start(*a, transfer_op::write, seg, local, remote_addr);
  REQUIRE(b->unregister_memory(remote.data));  // b submitted nothing from it: not busy
  REQUIRE(a->wait(batch, 120s));
  auto st = a->batch_status(batch).value();
  MESSAGE("after the peer unregistered: " << tide::to_string(st.state) << " (" << tide::to_string(st.reason)
                                          << ") on " << st.failed_peer_path << ", " << st.transferred_bytes << " bytes");
  CHECK(st.state == transfer_state::failed);
  CHECK(st.reason == tide::errc::remote_access_error);
  CHECK(st.failed_peer_path.find("@" + devs[1]) != std::string_view::npos);
  REQUIRE(a->free_batch(batch));
  // A new request for it: one forced refresh, then out_of_bounds.
  auto r = transfer_request::at_address(transfer_op::write, local.data, seg, remote_addr, 4096);
  auto again = a->allocate_batch(1).value();
  auto s = a->submit(again, {&r, 1});
  REQUIRE_FALSE(s);
  CHECK(s.error().code == tide::errc::out_of_bounds);
  REQUIRE(a->free_batch(again));
}

TEST_CASE("stable buffer ids: A, B, C addressed by id across register/unregister of others on the peer") {
  const auto devs = devices_under_test();
  auto a = make_engine(config_for(devs[0]));
  auto b = make_engine(config_for(devs[1]));
  // One region on the peer; A lies highest, C lowest, so address order is C, B, A.
  constexpr std::size_t kRegion = 16u << 20;
  constexpr std::size_t kLenA = (1u << 20) + 13, kLenB = 4u << 20, kLenC = (3u << 20) - 7;
  constexpr std::size_t kOffC = 0, kOffB = 4u << 20, kOffA = 9u << 20;
  buffer region(kRegion, 0x11), extra(1u << 20, 0x22);
  std::vector<unsigned char> shadow(region.data, region.data + kRegion);
  REQUIRE(b->register_memory(region.data + kOffA, kLenA, "cpu:0"));
  REQUIRE(b->register_memory(region.data + kOffB, kLenB, "cpu:0"));
  REQUIRE(b->register_memory(region.data + kOffC, kLenC, "cpu:0"));
  const std::uint32_t id_a = b->buffer_id(region.data + kOffA).value();
  const std::uint32_t id_b = b->buffer_id(region.data + kOffB).value();
  const std::uint32_t id_c = b->buffer_id(region.data + kOffC).value();
  CHECK(id_a == 0);  // registration order
  CHECK(id_b == 1);
  CHECK(id_c == 2);
  auto published = b->transport().local_segment();
  REQUIRE(published.buffers.size() == 3);
  CHECK(published.buffers[0].id == id_a);

  constexpr std::size_t kSrc = 4u << 20;
  buffer src(kSrc, 0);
  for (std::size_t i = 0; i < kSrc; ++i) src.data[i] = static_cast<unsigned char>(i * 131 + 7);
  REQUIRE(a->register_memory(src.data, kSrc, "cpu:0"));
  auto seg = a->open_segment(b->segment_name()).value();

  auto write = [&](std::uint32_t id, std::uint64_t offset, std::size_t len) {
    auto r = transfer_request::in_buffer(transfer_op::write, src.data, seg, id, offset, len);
    auto batch = a->allocate_batch(1).value();
    auto s = a->submit(batch, {&r, 1});
    if (s) {
      REQUIRE(a->wait(batch, 60s));
      auto st = a->status_of(batch, 0).value();
      CHECK(st.state == transfer_state::completed);
    }
    REQUIRE(a->free_batch(batch));
    return s;
  };
  // Every byte of the region equals the shadow: nothing outside the addressed ranges moved.
  auto check_region = [&] {
    std::size_t diff = 0;
    for (std::size_t i = 0; i < kRegion; ++i) diff += region.data[i] != shadow[i];
    CHECK(diff == 0);
  };
  auto expect = [&](std::size_t at, std::size_t len) { std::memcpy(shadow.data() + at, src.data, len); };

  REQUIRE(write(id_a, kLenA - 1000, 1000));
  expect(kOffA + kLenA - 1000, 1000);
  REQUIRE(write(id_c, 5, kLenC - 5));
  expect(kOffC + 5, kLenC - 5);
  REQUIRE(write(id_b, 0, 4096));
  expect(kOffB, 4096);
  check_region();
  auto past = write(id_a, kLenA - 1000, 1001);
  REQUIRE_FALSE(past);
  CHECK(past.error().code == tide::errc::out_of_bounds);

  // The peer registers D (id 3) and unregisters B; A and C keep their ids.
  REQUIRE(b->register_memory(extra.data, extra.size, "cpu:0"));
  const std::uint32_t id_d = b->buffer_id(extra.data).value();
  CHECK(id_d == 3);
  REQUIRE(b->unregister_memory(region.data + kOffB));
  CHECK(b->buffer_id(region.data + kOffB).error().code == tide::errc::not_registered);
  REQUIRE(write(id_d, 17, 1000));  // not in a's view yet: one forced refresh finds it
  CHECK(std::memcmp(extra.data + 17, src.data, 1000) == 0);
  CHECK(extra.data[16] == 0x22);
  CHECK(extra.data[1017] == 0x22);
  REQUIRE(write(id_a, 0, kLenA));
  expect(kOffA, kLenA);
  REQUIRE(write(id_c, 0, 64));
  expect(kOffC, 64);
  check_region();
  // B's id is gone for good: out_of_bounds, and nothing moved.
  auto gone = write(id_b, 0, 4096);
  REQUIRE_FALSE(gone);
  CHECK(gone.error().code == tide::errc::out_of_bounds);
  MESSAGE(gone.error().message());
  check_region();
  // A new registration never takes an old id back.
  REQUIRE(b->register_memory(region.data + kOffB, kLenB, "cpu:0"));
  CHECK(b->buffer_id(region.data + kOffB).value() == 4);
}

TEST_CASE("rpc_meta: a target whose segment name's port is not its handshake port is reached through rpc_meta") {
  struct http_policies : tide::default_policies {
    using metadata = tide::policy::http;
  };
  auto server = tide::http_metadata_server::start({.host = "127.0.0.1", .port = 0});
  REQUIRE_MESSAGE(server.has_value(), server.error());
  const auto devs = devices_under_test();
  auto make = [&](const std::string& name, const std::string& device) {
    tide::engine_config c = config_for(device);
    c.local_server_name = name;
    c.metadata = "http://127.0.0.1:" + std::to_string(server->port()) + "/metadata";
    auto e = tide::transfer_engine<http_policies>::create(c);
    REQUIRE_MESSAGE(e.has_value(), e.error());
    return std::move(*e);
  };
  // Port 9 (discard) is nobody's handshake port: only rpc_meta says where b listens.
  auto b = make("127.0.0.1:9", devs[1]);
  CHECK(b->segment_name() == "127.0.0.1:9");
  CHECK(b->handshake_port() != 9);
  auto a = make("127.0.0.1", devs[0]);
  constexpr std::size_t kSize = 1u << 20;
  buffer local(kSize, kCanary), remote(kSize, kRemote);
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  REQUIRE(b->register_memory(remote.data, kSize, "cpu:0"));
  auto seg = a->open_segment("127.0.0.1:9");
  REQUIRE_MESSAGE(seg, (seg ? "" : seg.error().message()));
  auto r = transfer_request::in_buffer(transfer_op::write, local.data, *seg, b->buffer_id(remote.data).value(), 0, kSize);
  auto batch = a->allocate_batch(1).value();
  REQUIRE(a->submit(batch, {&r, 1}));
  REQUIRE(a->wait(batch, 60s));
  auto st = a->status_of(batch, 0).value();
  MESSAGE("WRITE to 127.0.0.1:9 (handshake port " << b->handshake_port() << "): " << tide::to_string(st.state) << " ("
                                                   << tide::to_string(st.reason) << ")");
  CHECK(st.state == transfer_state::completed);
  CHECK(std::memcmp(remote.data, local.data, kSize) == 0);
  REQUIRE(a->free_batch(batch));
}

// Review 1ab3d99 #9: with a secret the handshake address still came from
// rpc_meta, which anyone who can write the store can change.  Here a store
// writer points b's rpc_meta at a closed port after b published it: with
// the secret a reads b's address from b's MACed descriptor and is not moved.
TEST_CASE("review 1ab3d99 #9: with a secret, an rpc_meta rewritten by a store writer does not move a's handshakes") {
  struct http_policies : tide::default_policies {
    using metadata = tide::policy::http;
  };
  auto server = tide::http_metadata_server::start({.host = "127.0.0.1", .port = 0});
  REQUIRE_MESSAGE(server.has_value(), server.error());
  const std::string url = "http://127.0.0.1:" + std::to_string(server->port()) + "/metadata";
  char path[] = "/tmp/tide-rpc-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::string bytes(32, '\0');
  std::mt19937 g(9);
  for (auto& c : bytes) c = static_cast<char>(g());
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == 32);
  ::close(fd);
  const auto devs = devices_under_test();
  auto make = [&](const std::string& name, const std::string& device) {
    tide::engine_config c = config_for(device);
    c.local_server_name = name;
    c.metadata = url;
    c.auth_secret_file = path;
    auto e = tide::transfer_engine<http_policies>::create(c);
    REQUIRE_MESSAGE(e.has_value(), e.error());
    return std::move(*e);
  };
  auto b = make("127.0.0.1:9", devs[1]);
  auto a = make("127.0.0.1", devs[0]);
  tide::metadata_config mc;
  mc.connection = url;
  tide::policy::http store{mc};
  REQUIRE(store.put_key(tide::rpc_meta_key("", "127.0.0.1:9"), tide::encode_rpc_meta("127.0.0.1", 1)));
  constexpr std::size_t kSize = 1u << 20;
  buffer local(kSize, kCanary), remote(kSize, kRemote);
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  REQUIRE(b->register_memory(remote.data, kSize, "cpu:0"));
  auto seg = a->open_segment("127.0.0.1:9");
  REQUIRE_MESSAGE(seg, (seg ? "" : seg.error().message()));
  auto r = transfer_request::in_buffer(transfer_op::write, local.data, *seg, b->buffer_id(remote.data).value(), 0, kSize);
  auto batch = a->allocate_batch(1).value();
  REQUIRE(a->submit(batch, {&r, 1}));
  REQUIRE(a->wait(batch, 60s));
  auto st = a->status_of(batch, 0).value();
  MESSAGE("WRITE with rpc_meta pointing at port 1: " << tide::to_string(st.state) << " (" << tide::to_string(st.reason)
                                                    << ")");
  CHECK(st.state == transfer_state::completed);
  CHECK(std::memcmp(remote.data, local.data, kSize) == 0);
  REQUIRE(a->free_batch(batch));
  CHECK(a->probe("127.0.0.1:9", 10s));  // the probe goes where the descriptor says too
  ::unlink(path);
}

TEST_CASE("after random register/unregister/local_only calls the served descriptor is a from-scratch encode") {
  const auto devs = devices_under_test();
  for (const bool sealed : {false, true}) {
    CAPTURE(sealed);
    std::string key_path;
    std::shared_ptr<const tide::wire::cluster_secret> key;
    if (sealed) {
      char path[] = "/tmp/tide-reg-XXXXXX";
      const int fd = ::mkstemp(path);
      REQUIRE(fd >= 0);
      std::string bytes(32, '\0');
      std::mt19937 g(5);
      for (auto& c : bytes) c = static_cast<char>(g());
      REQUIRE(::write(fd, bytes.data(), bytes.size()) == 32);
      ::close(fd);
      key_path = path;
      key = tide::wire::cluster_secret::load(key_path).value();
    }
    auto cfg = config_for(devs[0]);
    cfg.auth_secret_file = key_path;
    auto e = make_engine(cfg);
    constexpr std::size_t kSlots = 48;
    buffer pool(kSlots * 4096, 0);
    std::vector<bool> used(kSlots, false);
    std::mt19937 g(17);
    tide::net::request_options opts;
    opts.secret = key;
    opts.identity = "127.0.0.1:16999";
    for (int step = 0; step < 120; ++step) {
      CAPTURE(step);
      const std::size_t slot = g() % kSlots;
      unsigned char* p = pool.data + slot * 4096;
      if (used[slot]) {
        REQUIRE(e->unregister_memory(p));
      } else {
        const auto access = static_cast<tide::buffer_access>(g() % 4);  // local_only included
        REQUIRE(e->register_memory(p, 4096 - 512 * (g() % 2), "cpu:0", access));
      }
      used[slot] = !used[slot];
      if (step % 8 != 7) continue;
      auto served = tide::net::fetch_metadata("127.0.0.1", e->handshake_port(), opts);
      REQUIRE_MESSAGE(served.has_value(), served.error());
      auto opened = tide::decode_segment(*served, key.get());
      REQUIRE_MESSAGE(opened.has_value(), opened.error());
      // local_segment() builds the descriptor anew from the registered
      // buffers; the publish added its timestamp and marks (the engine's
      // incarnation, and with a secret its stamp).
      CHECK(opened->incarnation.has_value());
      CHECK(opened->stamp.has_value() == sealed);
      tide::segment_desc scratch = e->transport().local_segment();
      scratch.timestamp = opened->timestamp;
      scratch.incarnation = opened->incarnation;
      scratch.stamp = opened->stamp;
      CHECK(*opened == scratch);
      const std::string fresh = tide::encode_segment(scratch, key.get()).value();
      if (!sealed) {
        CHECK(*served == fresh);
        continue;
      }
      // Random nonces: the blobs and the MAC over them differ, nothing else.
      static const std::regex blob(R"re("sealed":"[0-9a-f]+")re");
      static const std::regex buffers_mac(R"re("buffers":"[0-9a-f]{64}")re");
      auto strip = [](const std::string& j) {
        return std::regex_replace(std::regex_replace(j, blob, "\"sealed\":\"\""), buffers_mac, "\"buffers\":\"\"");
      };
      CHECK(strip(*served) == strip(fresh));
    }
    e.reset();
    if (sealed) ::unlink(key_path.c_str());
  }
}
