// Memory kinds on Soft-RoCE: rxe has no dma-buf registration, and the
// probe (an invalid fd: EBADF where a provider implements it) says so
// without registering anything; host memory registers as before.  Memory
// no NIC registers (GPU memory without GPUDirect; host memory with the
// staging switch, as here) moves over TCP, staged, both ways, beside RDMA
// for the rest, where rdma_staging is off (on, this engine's own requests
// go over RDMA through stage chunks: staged_test.cpp).  GPU memory itself
// needs a GPU: tools/gpu-check.

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <tide/engine.hpp>

#include <tide/verbs/device.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>

#include <doctest/doctest.h>

#include <cerrno>
#include <vector>

TEST_CASE("the dma-buf probe reports rxe as unsupported (EOPNOTSUPP), and host memory still registers") {
  for (const auto& name : tide::test::devices_under_test()) {
    CAPTURE(name);
    auto ctx = tide::verbs::context::open(name);
    REQUIRE(ctx);
    auto pd = tide::verbs::protection_domain::create(*ctx);
    REQUIRE(pd);
    const auto probe = tide::verbs::probe_dmabuf(*pd);
    CHECK_FALSE(probe.supported);
    CHECK(probe.error == EOPNOTSUPP);
    std::vector<char> buf(1 << 20);
    CHECK(tide::verbs::memory_region::register_memory(*pd, buf.data(), buf.size()));
    // A registration by dma-buf fails with the provider's reason, named.
    auto mr = tide::verbs::memory_region::register_dmabuf(*pd, -1, 0, 4096, 0);
    REQUIRE_FALSE(mr);
    CHECK(mr.error().detail.find("ibv_reg_dmabuf_mr") != std::string::npos);
  }
}

TEST_CASE("memory no NIC registers goes over TCP, staged, both ways; the rest stays on RDMA") {
  using tide::transfer_op;
  using tide::transfer_request;
  using tide::transfer_telemetry;
  using namespace std::chrono_literals;
  const auto devs = tide::test::devices_under_test();
  auto both = [](const std::string& dev, bool staged) {
    auto c = tide::test::config_for({dev});
    c.transports = "rdma,tcp";
    c.stage_host_memory = staged;
    c.rdma_staging = false;
    return c;
  };
  auto a = tide::test::make_engine(both(devs[0], true));   // its buffers: TCP only
  auto b = tide::test::make_engine(both(devs[1], false));  // its buffers: RDMA
  auto c = tide::test::make_engine(both(devs[0], false));
  constexpr std::size_t kSize = (std::size_t{3} << 20) + 333;
  tide::test::buffer a_buf(kSize), b_buf(kSize), c_buf(kSize);
  REQUIRE(a->register_memory(a_buf.data, kSize));
  REQUIRE(b->register_memory(b_buf.data, kSize));
  REQUIRE(c->register_memory(c_buf.data, kSize));

  // a's descriptor: keys 0 and "reach": "tcp".
  auto seg_a = b->open_segment(a->segment_name());
  REQUIRE(seg_a);
  auto desc = b->segment_descriptor(*seg_a);
  REQUIRE(desc);
  REQUIRE((*desc)->buffers.size() == 1);
  CHECK((*desc)->buffers[0].tcp_only);
  CHECK((*desc)->buffers[0].rkey == std::vector<std::uint32_t>((*desc)->devices.size(), 0));

  using tide::test::run_via;
  // From a's buffer (local, no NIC) to b: TCP.
  auto seg_b = a->open_segment(b->segment_name());
  REQUIRE(seg_b);
  tide::test::fill(a_buf.data, kSize, 1);
  CHECK(run_via(*a, transfer_request::in_buffer(transfer_op::write, a_buf.data, *seg_b, 0, 0, kSize)) ==
        transfer_telemetry::kViaTcp);
  CHECK(std::memcmp(a_buf.data, b_buf.data, kSize) == 0);
  // Into and out of a's buffer (remote, no NIC) from b: TCP.
  tide::test::fill(b_buf.data, kSize, 2);
  CHECK(run_via(*b, transfer_request::in_buffer(transfer_op::write, b_buf.data, *seg_a, 0, 0, kSize)) ==
        transfer_telemetry::kViaTcp);
  CHECK(std::memcmp(a_buf.data, b_buf.data, kSize) == 0);
  std::memset(b_buf.data, 0, kSize);
  CHECK(run_via(*b, transfer_request::in_buffer(transfer_op::read, b_buf.data, *seg_a, 0, 0, kSize)) ==
        transfer_telemetry::kViaTcp);
  CHECK(std::memcmp(a_buf.data, b_buf.data, kSize) == 0);
  CHECK(a->tcp_stats().bytes_staged == 3 * kSize);  // a's side of all three
  // Between two registered buffers: RDMA, as before.
  auto seg_b_from_c = c->open_segment(b->segment_name());
  REQUIRE(seg_b_from_c);
  tide::test::fill(c_buf.data, kSize, 3);
  CHECK(run_via(*c, transfer_request::in_buffer(transfer_op::write, c_buf.data, *seg_b_from_c, 0, 0, kSize)) ==
        transfer_telemetry::kViaRdma);
  CHECK(std::memcmp(c_buf.data, b_buf.data, kSize) == 0);
}

TEST_CASE("memory no NIC registers, with TCP off: the submit says it is reachable over TCP only") {
  const auto devs = tide::test::devices_under_test();
  auto staged = tide::test::config_for({devs[0]});
  staged.transports = "rdma,tcp";
  staged.stage_host_memory = true;
  auto a = tide::test::make_engine(staged);
  auto b = tide::test::make_engine(tide::test::config_for({devs[1]}));  // RDMA only
  tide::test::buffer a_buf(65536), b_buf(65536);
  REQUIRE(a->register_memory(a_buf.data, a_buf.size));
  REQUIRE(b->register_memory(b_buf.data, b_buf.size));
  auto seg_a = b->open_segment(a->segment_name());
  REQUIRE(seg_a);
  auto batch = b->allocate_batch(1);
  REQUIRE(batch);
  auto r = tide::transfer_request::in_buffer(tide::transfer_op::write, b_buf.data, *seg_a, 0, 0, 4096);
  auto st = b->submit(*batch, {&r, 1});
  REQUIRE_FALSE(st);
  CHECK(st.error().code == tide::errc::peer_unreachable);
  CHECK(st.error().detail.find("reachable over TCP only") != std::string::npos);
  CHECK(st.error().detail.find("TCP is not installed here") != std::string::npos);
  REQUIRE(b->free_batch(*batch));
}
