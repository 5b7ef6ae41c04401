// RDMA and TCP in one engine (engine_config::transports "rdma,tcp"): the only
// rail to a peer taken down while traffic runs costs no request, the rest is
// carried over TCP (the telemetry says so), and traffic is back on RDMA once
// the rail returns.  Devices: the VM's rxe0 (veth0) and rxe1 (veth1); TCP
// between the engines runs on loopback, which the link does not touch.
#include <tide/engine.hpp>

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <thread>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;
using tide::transfer_telemetry;
using tide::test::buffer;

tide::engine_config both_on(const std::string& device) {
  auto c = tide::test::config_for({device});
  c.transports = "rdma,tcp";
  c.transfer_timeout = 30s;
  // A paused rail is probed again soon: the return to RDMA is quick to see.
  c.rail_cooldown = 100ms;
  c.rail_max_cooldown = 400ms;
  return c;
}

}  // namespace

TEST_CASE("failover: the only rail goes down under traffic: no request fails, TCP carries it, RDMA takes it back") {
  const auto devs = tide::test::devices_under_test();
  if (std::getenv("RXE_VM") == nullptr || devs[0] == devs[1] || ::geteuid() != 0) {
    MESSAGE("needs the rxe VM (two devices on veth0/veth1, root): skipped");
    return;
  }
  auto a = tide::test::make_engine(both_on(devs[0]));
  auto b = tide::test::make_engine(both_on(devs[1]));
  constexpr std::size_t kSize = 256u << 10;
  buffer src(kSize), dst(kSize);
  REQUIRE(a->register_memory(src.data, kSize));
  REQUIRE(b->register_memory(dst.data, kSize));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  tide::test::fill(src.data, kSize, 21);

  // One transfer at a time; what carried each, and every failure.
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, failed{0}, rdma_only{0}, via_tcp{0};
  std::atomic<int> phase{0};  // 0 before the link goes down, 1 down, 2 up again
  std::atomic<int> rdma_after_up{0};
  std::thread load([&] {
    while (!stop.load()) {
      auto batch = a->allocate_batch(1);
      REQUIRE(batch);
      auto r = transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, kSize);
      if (!a->submit(*batch, {&r, 1})) {
        ++failed;
        (void)a->free_batch(*batch);
        continue;
      }
      REQUIRE(a->wait(*batch, 60s));
      auto st = a->status_of(*batch, 0);
      auto tel = a->task_telemetry(*batch, 0);
      REQUIRE(st);
      REQUIRE(tel);
      if (st->state == transfer_state::completed) ++completed;
      else ++failed;
      if (tel->transports & transfer_telemetry::kViaTcp) ++via_tcp;
      if (tel->transports == transfer_telemetry::kViaRdma) {
        ++rdma_only;
        if (phase.load() == 2) ++rdma_after_up;
      }
      REQUIRE(a->free_batch(*batch));
    }
  });
  // Traffic on RDMA first.
  for (int i = 0; i < 600 && rdma_only.load() < 5; ++i) std::this_thread::sleep_for(50ms);
  REQUIRE(rdma_only.load() >= 5);
  CHECK(via_tcp.load() == 0);

  REQUIRE(std::system("tide-vm-link down 0 > /dev/null") == 0);
  phase = 1;
  // Until TCP has carried a good share of the traffic.
  const int tcp_before = via_tcp.load();
  for (int i = 0; i < 600 && via_tcp.load() < tcp_before + 20; ++i) std::this_thread::sleep_for(50ms);
  CHECK(via_tcp.load() >= tcp_before + 20);

  REQUIRE(std::system("tide-vm-link up 0 > /dev/null") == 0);
  phase = 2;
  for (int i = 0; i < 1200 && rdma_after_up.load() < 5; ++i) std::this_thread::sleep_for(50ms);
  stop = true;
  load.join();
  MESSAGE(completed.load() << " completed, " << failed.load() << " failed; " << via_tcp.load()
                           << " carried (partly) over TCP; " << rdma_after_up.load() << " on RDMA alone after link up");
  CHECK(failed.load() == 0);
  CHECK(rdma_after_up.load() >= 5);
  CHECK(std::memcmp(src.data, dst.data, kSize) == 0);
  CHECK(a->tcp_stats().ops_ok > 0);
}
