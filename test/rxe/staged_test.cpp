// The staged RDMA path on Soft-RoCE: memory no NIC registers (GPU memory
// without GPUDirect; host memory with the staging switch, as here) moves
// over RDMA through the lanes' NIC-registered stage chunks, with the host
// copy engine in place of CUDA's.  Small chunks and few of them, so that
// requests span many chunks and wait for chunks to come back.  Cancel and
// timeout with nothing copied after final: api_contract_test.cpp; a peer
// killed mid-pipeline: engine_test.cpp (their staged variants).

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <tide/engine.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

namespace {

using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_telemetry;
using tide::test::run_via;
using namespace std::chrono_literals;

constexpr std::size_t kChunk = 64 << 10;

tide::engine_config staged_config(const std::string& dev) {
  auto c = tide::test::config_for({dev});
  c.stage_host_memory = true;
  c.stage_chunk_size = kChunk;
  c.stage_chunks = 4;
  return c;
}

std::uint64_t staged_bytes(const tide::transfer_engine<>& e) {
  std::uint64_t n = 0;
  for (const auto& nic : e.stats().nics) n += nic.staged_bytes;
  return n;
}

}  // namespace

TEST_CASE("staged RDMA: WRITE and READ move every byte over RDMA, in sizes around the chunk; staged bytes counted") {
  const auto devs = tide::test::devices_under_test();
  auto a = tide::test::make_engine(staged_config(devs[0]));
  auto b = tide::test::make_engine(tide::test::config_for({devs[1]}));
  constexpr std::size_t kSize = (std::size_t{6} << 20) + 8192;
  tide::test::buffer a_buf(kSize), b_buf(kSize);
  REQUIRE(a->register_memory(a_buf.data, kSize));
  REQUIRE(b->register_memory(b_buf.data, kSize));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  std::uint64_t moved = 0;
  std::uint64_t seed = 1;
  for (const std::size_t len : {std::size_t{1}, std::size_t{4095}, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 13,
                                (std::size_t{5} << 20) + 13}) {
    CAPTURE(len);
    const std::size_t at_a = 4093, at_b = 8191;  // neither end aligned
    tide::test::fill(a_buf.data + at_a, len, ++seed);
    CHECK(run_via(*a, transfer_request::in_buffer(transfer_op::write, a_buf.data + at_a, *seg, 0, at_b, len)) ==
          transfer_telemetry::kViaRdma);
    CHECK(std::memcmp(a_buf.data + at_a, b_buf.data + at_b, len) == 0);
    tide::test::fill(b_buf.data + at_b, len, ++seed);
    std::memset(a_buf.data + at_a, 0, len);
    CHECK(run_via(*a, transfer_request::in_buffer(transfer_op::read, a_buf.data + at_a, *seg, 0, at_b, len)) ==
          transfer_telemetry::kViaRdma);
    CHECK(std::memcmp(a_buf.data + at_a, b_buf.data + at_b, len) == 0);
    moved += 2 * len;
  }
  MESSAGE("staged " << staged_bytes(*a) << " bytes for " << moved << " moved");
  CHECK(staged_bytes(*a) == moved);
  CHECK(staged_bytes(*b) == 0);
}

TEST_CASE("staged RDMA: 10 threads WRITE and READ back their own ranges at once") {
  const auto devs = tide::test::devices_under_test();
  auto a = tide::test::make_engine(staged_config(devs[0]));
  auto b = tide::test::make_engine(tide::test::config_for({devs[1]}));
  constexpr int kThreads = 10;
  constexpr std::size_t kEach = (std::size_t{1} << 20) + 4096;
  tide::test::buffer out(kThreads * kEach), back(kThreads * kEach), far(kThreads * kEach);
  REQUIRE(a->register_memory(out.data, out.size));
  REQUIRE(a->register_memory(back.data, back.size));
  REQUIRE(b->register_memory(far.data, far.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  tide::test::fill(out.data, out.size, 77);
  std::vector<std::thread> threads;
  std::vector<int> ok(kThreads, 0);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const std::size_t off = static_cast<std::size_t>(t) * kEach;
      const std::size_t len = kEach - static_cast<std::size_t>(t) * 331;  // sizes not a multiple of the chunk
      const bool w = static_cast<bool>(
          tide::test::run_one(*a, transfer_request::in_buffer(transfer_op::write, out.data + off, *seg, 0, off, len)));
      const bool r = static_cast<bool>(
          tide::test::run_one(*a, transfer_request::in_buffer(transfer_op::read, back.data + off, *seg, 0, off, len)));
      ok[static_cast<std::size_t>(t)] = w && r && std::memcmp(out.data + off, back.data + off, len) == 0;
    });
  for (auto& th : threads) th.join();
  CHECK(std::accumulate(ok.begin(), ok.end(), 0) == kThreads);
}

TEST_CASE("staged RDMA: 256 small requests in one submit share chunk-sized WRs, every byte in place") {
  const auto devs = tide::test::devices_under_test();
  auto a = tide::test::make_engine(staged_config(devs[0]));
  auto b = tide::test::make_engine(tide::test::config_for({devs[1]}));
  constexpr std::size_t kPiece = 4096 + 17, kCount = 256;
  tide::test::buffer a_buf(kPiece * kCount), b_buf(kPiece * kCount);
  REQUIRE(a->register_memory(a_buf.data, a_buf.size));
  REQUIRE(b->register_memory(b_buf.data, b_buf.size));
  auto seg = a->open_segment(b->segment_name());
  REQUIRE(seg);
  tide::test::fill(a_buf.data, a_buf.size, 5);
  std::vector<transfer_request> reqs;
  for (std::size_t i = 0; i < kCount; ++i)
    reqs.push_back(transfer_request::in_buffer(transfer_op::write, a_buf.data + i * kPiece, *seg, 0, i * kPiece, kPiece));
  auto batch = a->allocate_batch(reqs.size());
  REQUIRE(batch);
  REQUIRE(a->submit(*batch, reqs));
  REQUIRE(a->wait(*batch, 60s));
  auto st = a->batch_status(*batch);
  REQUIRE(st);
  CHECK(st->state == tide::transfer_state::completed);
  REQUIRE(a->free_batch(*batch));
  CHECK(std::memcmp(a_buf.data, b_buf.data, a_buf.size) == 0);
  CHECK(staged_bytes(*a) == a_buf.size);
}
