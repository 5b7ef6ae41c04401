// The API contract on real (Soft-RoCE) devices (issue 11):
//  - final means final: after wait() returns on a CANCELED or TIMEOUT
//    READ, no byte of the local buffer changes any more.
//
// Two engines in one process: `a` on devices_under_test()[0], `b` on [1].
#include <doctest/doctest.h>

#include <tide/engine.hpp>

#include "devices_under_test.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;
using tide::test::devices_under_test;

tide::engine_config config_for(const std::string& device) {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.devices = {device};
  c.workers_per_context = 1;
  c.transfer_timeout = 60s;
  return c;
}

std::unique_ptr<tide::transfer_engine<>> make_engine(const tide::engine_config& c) {
  auto e = tide::transfer_engine<>::create(c);
  if (!e) FAIL("transfer_engine::create: " << e.error().message());
  return std::move(*e);
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

// Starts a READ of the whole of `remote` (in 4 MiB tasks) into `local`
// and returns its batch once the first bytes have landed (or right away
// when `wait_for_bytes` is false).
tide::batch_id start_read(tide::transfer_engine<>& a, tide::segment_id seg, buffer& local, std::uint64_t remote_addr,
                          bool wait_for_bytes) {
  constexpr std::size_t kTask = 4u << 20;
  std::vector<transfer_request> reqs;
  for (std::size_t off = 0; off < local.size; off += kTask)
    reqs.push_back(transfer_request::at_address(transfer_op::read, local.data + off, seg, remote_addr + off,
                                                std::min(kTask, local.size - off)));
  auto batch = a.allocate_batch(reqs.size()).value();
  REQUIRE(a.submit(batch, reqs));
  for (int i = 0; wait_for_bytes && i < 4000 && a.batch_status(batch).value().transferred_bytes == 0; ++i)
    std::this_thread::sleep_for(1ms);
  return batch;
}

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

TEST_CASE("final means final: a canceled READ writes nothing into the buffer after wait() returns") {
  const auto devs = devices_under_test();
  auto a = make_engine(config_for(devs[0]));
  auto b = make_engine(config_for(devs[1]));
  constexpr std::size_t kSize = 64u << 20;
  buffer local(kSize, kCanary), remote(kSize, kRemote);
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  REQUIRE(b->register_memory(remote.data, kSize, "cpu:0"));
  auto seg = a->open_segment(b->segment_name()).value();
  const auto remote_addr = reinterpret_cast<std::uint64_t>(remote.data);
  auto batch = start_read(*a, seg, local, remote_addr, true);
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

TEST_CASE("final means final: a READ past transfer_timeout ends TIMEOUT and writes nothing after wait()") {
  const auto devs = devices_under_test();
  auto cfg = config_for(devs[0]);
  cfg.transfer_timeout = 150ms;  // far shorter than 64 MiB takes on rxe
  auto a = make_engine(cfg);
  auto b = make_engine(config_for(devs[1]));
  constexpr std::size_t kSize = 64u << 20;
  buffer local(kSize, kCanary), remote(kSize, kRemote);
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  REQUIRE(b->register_memory(remote.data, kSize, "cpu:0"));
  auto seg = a->open_segment(b->segment_name()).value();
  auto batch = start_read(*a, seg, local, reinterpret_cast<std::uint64_t>(remote.data), false);
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

namespace {

// Starts `op` over the whole of `local` (4 MiB tasks) against `remote_addr`
// and waits for its first bytes.
tide::batch_id start(tide::transfer_engine<>& a, transfer_op op, tide::segment_id seg, buffer& local,
                     std::uint64_t remote_addr) {
  constexpr std::size_t kTask = 4u << 20;
  std::vector<transfer_request> reqs;
  for (std::size_t off = 0; off < local.size; off += kTask)
    reqs.push_back(transfer_request::at_address(op, local.data + off, seg, remote_addr + off, std::min(kTask, local.size - off)));
  auto batch = a.allocate_batch(reqs.size()).value();
  REQUIRE(a.submit(batch, reqs));
  for (int i = 0; i < 4000 && a.batch_status(batch).value().transferred_bytes == 0; ++i) std::this_thread::sleep_for(1ms);
  return batch;
}

}  // namespace

TEST_CASE("in flight: unregister_memory and close_segment say busy; drain waits; cancel cancels") {
  const auto devs = devices_under_test();
  auto a = make_engine(config_for(devs[0]));
  auto b = make_engine(config_for(devs[1]));
  constexpr std::size_t kSize = 48u << 20;
  buffer local(kSize, kCanary), remote(kSize, kRemote);
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  REQUIRE(b->register_memory(remote.data, kSize, "cpu:0"));
  auto seg = a->open_segment(b->segment_name()).value();
  const auto remote_addr = reinterpret_cast<std::uint64_t>(remote.data);

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
  auto a = make_engine(cfg);
  auto b = make_engine(config_for(devs[1]));
  constexpr std::size_t kSize = 48u << 20;
  buffer local(kSize, kCanary), remote(kSize, kRemote);
  REQUIRE(a->register_memory(local.data, kSize, "cpu:0"));
  REQUIRE(b->register_memory(remote.data, kSize, "cpu:0"));
  auto seg = a->open_segment(b->segment_name()).value();
  const auto remote_addr = reinterpret_cast<std::uint64_t>(remote.data);
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
