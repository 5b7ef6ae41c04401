// The slice planner (include/tide/rdma/plan/slice_planner.hpp): slice counts
// and boundaries, the WR bound, the device's max_msg_sz, the tail rule,
// coalescing, inline marks, and property loops over random requests.

#include <tide/rdma/plan/slice_planner.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

using namespace tide::rdma::plan;
using tide::transfer_op;

namespace {

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;

request_extent req(std::uint64_t local, std::uint64_t remote, std::uint64_t len, transfer_op op = transfer_op::write,
                   std::uint64_t target = 1, std::uint32_t lb = 0, std::uint32_t pb = 0) {
  return {local, remote, len, op, target, lb, pb};
}

slice_plan plan_ok(const planner_config& cfg, const std::vector<request_extent>& reqs) {
  slice_plan p;
  auto r = plan(cfg, reqs, p);
  REQUIRE(r.has_value());
  return p;
}

transfer_op head_op(const std::vector<request_extent>& reqs, const slice_plan& p, const planned_wr& wr) {
  return reqs[p.pieces[wr.first_piece].request].op;
}

// Every byte of every request in exactly one piece, pieces and WRs agree,
// WR lengths within max_msg, each request's pieces contiguous and in order,
// and a WR's bytes contiguous at both ends.
void check_invariants(const planner_config& cfg, const std::vector<request_extent>& reqs, const slice_plan& p) {
  REQUIRE(p.requests.size() == reqs.size());
  std::uint64_t wr_bytes = 0;
  for (std::size_t w = 0; w < p.wrs.size(); ++w) {
    const auto& wr = p.wrs[w];
    REQUIRE(wr.length > 0);
    REQUIRE(wr.length <= cfg.max_msg_size);
    REQUIRE(wr.piece_count >= 1);
    std::uint64_t sum = 0;
    for (std::uint32_t k = 0; k < wr.piece_count; ++k) {
      const auto& pc = p.pieces[wr.first_piece + k];
      REQUIRE(pc.wr == w);
      const auto& rq = reqs[pc.request];
      // The piece's bytes sit at the WR's addresses plus what came before it.
      REQUIRE(rq.local_addr + pc.offset == wr.local_addr + sum);
      REQUIRE(rq.remote_addr + pc.offset == wr.remote_addr + sum);
      // Same buffers and op for every piece of a WR: no WR crosses a buffer boundary.
      const auto& head = reqs[p.pieces[wr.first_piece].request];
      REQUIRE(rq.local_buffer == head.local_buffer);
      REQUIRE(rq.peer_buffer == head.peer_buffer);
      REQUIRE(rq.target == head.target);
      REQUIRE(rq.op == head.op);
      sum += pc.length;
    }
    REQUIRE(sum == wr.length);
    CHECK(wr.inline_data == (head_op(reqs, p, wr) == transfer_op::write && wr.length <= cfg.inline_limit));
    wr_bytes += wr.length;
  }
  std::uint64_t req_bytes = 0;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const auto& pr = p.requests[i];
    REQUIRE(pr.piece_count >= 1);
    std::uint64_t next = 0;
    for (std::uint32_t k = 0; k < pr.piece_count; ++k) {
      const auto& pc = p.pieces[pr.first_piece + k];
      REQUIRE(pc.request == i);
      REQUIRE(pc.offset == next);  // in order, no gap, no overlap
      next += pc.length;
    }
    REQUIRE(next == reqs[i].length);
    req_bytes += reqs[i].length;
  }
  REQUIRE(wr_bytes == req_bytes);
  REQUIRE(p.pieces.size() >= p.wrs.size());
  // Groups partition the requests and the WRs, each within its op's bound
  // unless max_msg forced more.
  std::uint32_t next_req = 0, next_wr = 0;
  for (const auto& g : p.groups) {
    REQUIRE(g.first_request == next_req);
    REQUIRE(g.first_wr == next_wr);
    next_req += g.request_count;
    next_wr += g.wr_count;
    const auto op = reqs[g.first_request].op;
    const std::uint64_t bound = op == transfer_op::read ? cfg.max_wrs_read : cfg.max_wrs_write;
    // max_msg wins: slices are then the largest multiple of the granularity within it.
    const std::uint64_t widest = cfg.max_msg_size / cfg.slice_size * cfg.slice_size;
    const std::uint64_t forced = (g.bytes + widest - 1) / widest;
    REQUIRE(g.wr_count <= std::max(bound, forced + 1));
  }
  REQUIRE(next_req == reqs.size());
  REQUIRE(next_wr == p.wrs.size());
}

}  // namespace

TEST_CASE("planner_config validation names the field") {
  planner_config c;
  CHECK(c.validate().has_value());
  c.slice_size = 0;
  CHECK(c.validate().error().detail.find("slice_size") != std::string::npos);
  c = {};
  c.max_msg_size = 32 * KiB;  // below slice_size
  CHECK(c.validate().error().code == tide::errc::config_invalid);
  CHECK(c.validate().error().detail.find("max_msg_sz") != std::string::npos);
  c = {};
  c.max_msg_size = 4ull << 30;
  CHECK(c.validate().error().detail.find("max_msg_size") != std::string::npos);
  c = {};
  c.fragment_limit = c.slice_size + 1;
  CHECK(c.validate().error().detail.find("fragment_limit") != std::string::npos);
  c = {};
  c.max_wrs_write = 0;
  CHECK(c.validate().error().detail.find("max_wrs_write") != std::string::npos);
  c = {};
  c.max_wrs_read = 0;
  CHECK(c.validate().error().detail.find("max_wrs_read") != std::string::npos);
}

TEST_CASE("slice counts and boundaries for sizes around the granularity") {
  planner_config c;  // 64 KiB, tail <= 16 KiB folds
  struct expect {
    std::uint64_t len;
    std::vector<std::uint32_t> wrs;
  };
  const std::vector<expect> cases = {
      {1, {1}},
      {4 * KiB, {4 * KiB}},
      {64 * KiB - 1, {64 * KiB - 1}},
      {64 * KiB, {64 * KiB}},
      {64 * KiB + 1, {64 * KiB + 1}},                       // tail of 1 B folds
      {80 * KiB, {80 * KiB}},                               // tail of 16 KiB folds
      {80 * KiB + 1, {64 * KiB, 16 * KiB + 1}},             // 16 KiB + 1 does not
      {128 * KiB, {64 * KiB, 64 * KiB}},
      {200 * KiB, {64 * KiB, 64 * KiB, 72 * KiB}},          // 8 KiB tail joins the third
      {1 * MiB, std::vector<std::uint32_t>(16, 64 * KiB)},
  };
  for (const auto& e : cases) {
    CAPTURE(e.len);
    auto p = plan_ok(c, {req(0x1000, 0x9000, e.len)});
    std::vector<std::uint32_t> got;
    for (const auto& w : p.wrs) got.push_back(w.length);
    CHECK(got == e.wrs);
    CHECK(wr_count_for(c, e.len, transfer_op::write) == e.wrs.size());
    // Boundaries: WR k starts at k * 64 KiB.
    for (std::size_t k = 0; k < p.wrs.size(); ++k) {
      CHECK(p.wrs[k].local_addr == 0x1000 + k * 64 * KiB);
      CHECK(p.wrs[k].remote_addr == 0x9000 + k * 64 * KiB);
    }
  }
}

TEST_CASE("the WR bound: large requests grow their slices in multiples of the granularity") {
  planner_config c;
  // 64 MiB: WRITE 32 x 2 MiB, READ 64 x 1 MiB (TENT's figures).
  auto w = plan_ok(c, {req(0, 0, 64 * MiB, transfer_op::write)});
  CHECK(w.wrs.size() == 32);
  for (const auto& x : w.wrs) CHECK(x.length == 2 * MiB);
  auto r = plan_ok(c, {req(0, 0, 64 * MiB, transfer_op::read)});
  CHECK(r.wrs.size() == 64);
  for (const auto& x : r.wrs) CHECK(x.length == 1 * MiB);
  // The bound is configurable, and the slice stays a multiple of 64 KiB.
  c.max_wrs_write = 64;
  c.max_wrs_read = 64;
  for (auto op : {transfer_op::write, transfer_op::read}) {
    for (std::uint64_t len : {64 * MiB, 64 * MiB + 1, 64 * MiB - 1, 63 * MiB + 17, 100 * MiB + 4095}) {
      CAPTURE(len);
      auto p = plan_ok(c, {req(0, 0, len, op)});
      CHECK(p.wrs.size() <= 64);
      CHECK(slice_length_for(c, len, op) % c.slice_size == 0);
      check_invariants(c, {req(0, 0, len, op)}, p);
    }
  }
  // 4 MiB: exactly at the bound of 64 x 64 KiB, no growth.
  CHECK(slice_length_for(c, 4 * MiB, transfer_op::write) == 64 * KiB);
  CHECK(slice_length_for(c, 4 * MiB + 64 * KiB, transfer_op::write) == 128 * KiB);
}

TEST_CASE("no slice exceeds the device's max_msg_sz, which wins over the WR bound") {
  planner_config c;
  c.max_msg_size = 1 * MiB;
  auto p = plan_ok(c, {req(0, 0, 64 * MiB, transfer_op::write)});
  CHECK(p.wrs.size() == 64);  // 32 would need 2 MiB WRs
  for (const auto& w : p.wrs) CHECK(w.length <= 1 * MiB);
  // A max_msg that is not a multiple of the granularity: slices stay below it.
  c.max_msg_size = 1 * MiB + 100;
  c.fragment_limit = 16 * KiB;
  auto q = plan_ok(c, {req(0, 0, 64 * MiB + 200, transfer_op::write)});
  for (const auto& w : q.wrs) CHECK(w.length <= c.max_msg_size);
  check_invariants(c, {req(0, 0, 64 * MiB + 200, transfer_op::write)}, q);
  // The tail does not fold when the sum would pass max_msg.
  c = {};
  c.slice_size = 64 * KiB;
  c.max_msg_size = 64 * KiB;
  auto t = plan_ok(c, {req(0, 0, 64 * KiB + 10)});
  REQUIRE(t.wrs.size() == 2);
  CHECK(t.wrs[1].length == 10);
}

TEST_CASE("contiguous requests coalesce into shared WRs; others do not") {
  planner_config c;
  // 16 x 4 KiB contiguous at both ends: one 64 KiB WR with 16 pieces.
  std::vector<request_extent> reqs;
  for (std::uint64_t i = 0; i < 16; ++i) reqs.push_back(req(0x10000 + i * 4 * KiB, 0x80000 + i * 4 * KiB, 4 * KiB));
  auto p = plan_ok(c, reqs);
  CHECK(p.groups.size() == 1);
  REQUIRE(p.wrs.size() == 1);
  CHECK(p.wrs[0].length == 64 * KiB);
  CHECK(p.wrs[0].piece_count == 16);
  check_invariants(c, reqs, p);

  // A request that straddles a WR boundary is split into two pieces.
  reqs = {req(0, 0, 40 * KiB), req(40 * KiB, 40 * KiB, 60 * KiB)};
  p = plan_ok(c, reqs);
  REQUIRE(p.wrs.size() == 2);  // 100 KiB: 64 + 36 (the tail of 36 KiB does not fold)
  CHECK(p.requests[1].piece_count == 2);
  check_invariants(c, reqs, p);

  // Breaks: remote gap, local gap, other op, other target, other buffer.
  auto breaks = [&](request_extent second) {
    std::vector<request_extent> v{req(0, 0, 4 * KiB), second};
    auto q = plan_ok(c, v);
    check_invariants(c, v, q);
    return q.groups.size() == 2;
  };
  CHECK(breaks(req(4 * KiB, 8 * KiB, 4 * KiB)));
  CHECK(breaks(req(8 * KiB, 4 * KiB, 4 * KiB)));
  CHECK(breaks(req(4 * KiB, 4 * KiB, 4 * KiB, transfer_op::read)));
  CHECK(breaks(req(4 * KiB, 4 * KiB, 4 * KiB, transfer_op::write, 2)));
  CHECK(breaks(req(4 * KiB, 4 * KiB, 4 * KiB, transfer_op::write, 1, 1, 0)));
  CHECK(breaks(req(4 * KiB, 4 * KiB, 4 * KiB, transfer_op::write, 1, 0, 1)));
  CHECK_FALSE(breaks(req(4 * KiB, 4 * KiB, 4 * KiB)));

  // coalesce = false keeps one group per request.
  c.coalesce = false;
  reqs.clear();
  for (std::uint64_t i = 0; i < 8; ++i) reqs.push_back(req(i * 4 * KiB, i * 4 * KiB, 4 * KiB));
  p = plan_ok(c, reqs);
  CHECK(p.groups.size() == 8);
  CHECK(p.wrs.size() == 8);
  check_invariants(c, reqs, p);
}

TEST_CASE("a coalesced extent obeys the WR bound as one request would") {
  planner_config c;
  std::vector<request_extent> reqs;
  for (std::uint64_t i = 0; i < 64; ++i) reqs.push_back(req(i * MiB, i * MiB, MiB));  // 64 MiB in 1 MiB requests
  auto p = plan_ok(c, reqs);
  CHECK(p.groups.size() == 1);
  CHECK(p.wrs.size() == 32);
  check_invariants(c, reqs, p);
}

TEST_CASE("inline marks: WRITE WRs up to the limit, never READ") {
  planner_config c;
  c.inline_limit = 64;
  auto p = plan_ok(c, {req(0, 0, 64), req(1000, 5000, 65), req(9000, 9000, 8, transfer_op::read)});
  REQUIRE(p.wrs.size() == 3);
  CHECK(p.wrs[0].inline_data);
  CHECK_FALSE(p.wrs[1].inline_data);
  CHECK_FALSE(p.wrs[2].inline_data);
  // Two 32-byte requests coalesce into one 64-byte WR: still inline.
  auto q = plan_ok(c, {req(0, 0, 32), req(32, 32, 32)});
  REQUIRE(q.wrs.size() == 1);
  CHECK(q.wrs[0].inline_data);
}

TEST_CASE("a zero-length request is refused") {
  slice_plan p;
  std::vector<request_extent> reqs{req(0, 0, 4096), req(4096, 4096, 0)};
  auto r = plan(planner_config{}, reqs, p);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == tide::errc::invalid_argument);
  CHECK(r.error().detail.find("request 1") != std::string::npos);
}

TEST_CASE("property: random batches over random configs keep every invariant") {
  std::mt19937_64 rng(20261130);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng); };
  slice_plan p;
  for (int round = 0; round < 400; ++round) {
    planner_config c;
    c.slice_size = std::uint64_t{1} << pick(9, 20);              // 512 B .. 1 MiB
    c.max_msg_size = std::max<std::uint64_t>(c.slice_size, pick(c.slice_size, 32 * MiB));
    c.fragment_limit = pick(0, c.slice_size);
    c.max_wrs_write = static_cast<std::uint32_t>(pick(1, 128));
    c.max_wrs_read = static_cast<std::uint32_t>(pick(1, 128));
    c.inline_limit = static_cast<std::uint32_t>(pick(0, 256));
    c.coalesce = pick(0, 3) != 0;
    REQUIRE(c.validate().has_value());
    // Requests in a few buffers, often contiguous, sometimes not.
    std::vector<request_extent> reqs;
    const auto n = pick(1, 40);
    std::uint64_t local = 0, remote = 1ull << 40;
    for (std::uint64_t i = 0; i < n; ++i) {
      const std::uint64_t len = pick(0, 3) == 0 ? pick(1, 64 * MiB) : pick(1, 256 * KiB);
      const auto op = pick(0, 4) == 0 ? transfer_op::read : transfer_op::write;
      const auto buffer = static_cast<std::uint32_t>(pick(0, 5) == 0 ? 1 : 0);
      if (pick(0, 3) == 0) local += pick(1, 4096);
      if (pick(0, 3) == 0) remote += pick(1, 4096);
      reqs.push_back(req(local, remote, len, op, pick(0, 8) == 0 ? 2 : 1, buffer, buffer));
      local += len;
      remote += len;
    }
    CAPTURE(round);
    REQUIRE(plan(c, reqs, p).has_value());
    check_invariants(c, reqs, p);
    // Every WR but the last of a group is the group's slice length.
    for (const auto& g : p.groups) {
      const auto s = slice_length_for(c, g.bytes, reqs[g.first_request].op);
      CHECK(s <= c.max_msg_size);
      for (std::uint32_t k = 0; k + 1 < g.wr_count; ++k) CHECK(p.wrs[g.first_wr + k].length == s);
      CHECK(g.wr_count == wr_count_for(c, g.bytes, reqs[g.first_request].op));
    }
  }
}
