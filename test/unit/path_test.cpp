// Path selection (policies/tide/policy/{path,load_aware,round_robin,mooncake_random}.hpp,
// include/tide/rdma/plan/path_selector.hpp) on synthetic rails: no device.

#include <tide/policies.hpp>
#include <tide/rdma/detail/retire_wr.hpp>
#include <tide/rdma/plan/path_selector.hpp>
#include <tide/rdma/plan/slice_planner.hpp>

#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

using namespace tide::rdma::plan;

namespace {

constexpr std::int64_t ms = 1000;

gid_raw ipv4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  gid_raw g{};
  g[10] = g[11] = 0xff;
  g[12] = a;
  g[13] = b;
  g[14] = c;
  g[15] = d;
  return g;
}

// A host with `n` local NICs talking to a peer with `n` NICs; rails by subnet
// 10.47.<i>.0/24 (NIC i reaches peer NIC i), or all in one subnet (mesh).
template <class Path>
struct rig {
  rail_table table{rail_health_config{std::chrono::microseconds(100 * ms), std::chrono::microseconds(10'000 * ms)}};
  std::unique_ptr<nic_load[]> loads;
  path_selector<Path> sel;
  rail_map map;
  std::vector<std::uint16_t> all;

  explicit rig(std::size_t n, bool rails = true, std::vector<double> bw = {})
      : loads(make_loads(n, bw)), sel(table, std::span<nic_load>(loads.get(), n)) {
    std::vector<gid_raw> local, peer;
    std::vector<std::string> paths;
    for (std::size_t i = 0; i < n; ++i) {
      const auto sub = static_cast<std::uint8_t>(rails ? i : 0);
      local.push_back(ipv4(10, 47, sub, static_cast<std::uint8_t>(2 + 2 * i)));
      peer.push_back(ipv4(10, 47, sub, static_cast<std::uint8_t>(1 + 2 * i)));
      paths.push_back("peer@rxe" + std::to_string(2 * i));
      all.push_back(static_cast<std::uint16_t>(i));
    }
    map = rail_map::build(table, local, paths, peer);
  }
  static std::unique_ptr<nic_load[]> make_loads(std::size_t n, const std::vector<double>& bw) {
    std::unique_ptr<nic_load[]> v(new nic_load[n]);
    for (std::size_t i = 0; i < n; ++i) v[i].set_prior(i < bw.size() ? bw[i] : 12.5e9);
    return v;
  }
  candidates every() const { return {all, {}, all, {}}; }

  // Rails of the WRs of one request of `bytes`, planned with the default planner.
  std::vector<rail> choose(std::uint64_t bytes, std::uint32_t random = 7, std::int64_t now = 0,
                           tide::transfer_op op = tide::transfer_op::write, candidates c = {}) {
    if (c.local_preferred.empty() && c.local_available.empty()) c = every();
    slice_plan p;
    request_extent r{0, 0, bytes, op, 1, 0, 0};
    REQUIRE(plan(planner_config{}, std::span<const request_extent>(&r, 1), p).has_value());
    std::vector<std::uint32_t> lens;
    for (const auto& w : p.wrs) lens.push_back(w.length);
    std::vector<rail> out(lens.size());
    REQUIRE(sel.choose(c, map, 0xffffu, lens, bytes, random, now, out));
    return out;
  }
  std::map<std::uint16_t, std::uint64_t> bytes_per_nic(const std::vector<rail>& rails, std::uint64_t bytes) {
    slice_plan p;
    request_extent r{0, 0, bytes, tide::transfer_op::write, 1, 0, 0};
    REQUIRE(plan(planner_config{}, std::span<const request_extent>(&r, 1), p).has_value());
    std::map<std::uint16_t, std::uint64_t> m;
    for (std::size_t i = 0; i < rails.size(); ++i) m[rails[i].local] += p.wrs[i].length;
    return m;
  }
};

}  // namespace

TEST_CASE("same_subnet: IPv4-mapped /24, global /64, never link-local or zero") {
  CHECK(same_subnet(ipv4(10, 47, 0, 1), ipv4(10, 47, 0, 2)));
  CHECK_FALSE(same_subnet(ipv4(10, 47, 0, 1), ipv4(10, 47, 1, 1)));
  gid_raw ll{0xfe, 0x80};
  ll[15] = 1;
  gid_raw ll2 = ll;
  ll2[15] = 2;
  CHECK_FALSE(same_subnet(ll, ll2));
  gid_raw g1{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 1};
  gid_raw g2 = g1;
  g2[15] = 9;
  CHECK(same_subnet(g1, g2));
  CHECK_FALSE(same_subnet(gid_raw{}, gid_raw{}));
}

TEST_CASE("rail matching: same subnet first, then same index, then nearest") {
  rail_table t;
  // Local NIC 0 in subnet 1, NIC 1 in subnet 0 (crossed), peer NICs 0 and 1 in subnets 0 and 1.
  std::vector<gid_raw> local{ipv4(10, 47, 1, 2), ipv4(10, 47, 0, 2)};
  std::vector<gid_raw> peer{ipv4(10, 47, 0, 1), ipv4(10, 47, 1, 1)};
  std::vector<std::string> paths{"p@a", "p@b"};
  auto m = rail_map::build(t, local, paths, peer);
  CHECK(m.ranked[0] == std::vector<std::uint16_t>{1, 0});
  CHECK(m.ranked[1] == std::vector<std::uint16_t>{0, 1});
  // No GIDs known: same index, then by distance.
  std::vector<gid_raw> zeros(3);
  std::vector<std::string> p3{"q@0", "q@1", "q@2"};
  auto n = rail_map::build(t, zeros, p3, zeros);
  CHECK(n.ranked[0] == std::vector<std::uint16_t>{0, 1, 2});
  CHECK(n.ranked[1] == std::vector<std::uint16_t>{1, 0, 2});
  CHECK(n.ranked[2] == std::vector<std::uint16_t>{2, 1, 0});
  CHECK(n.peer_ids.size() == 3);
}

TEST_CASE("load_aware: a 200:50 pair of NICs gets about 4:1 of a large request") {
  rig<tide::policy::load_aware> r(2, false, {200e6 / 8, 50e6 / 8});
  const std::uint64_t bytes = 64ull << 20;
  auto rails = r.choose(bytes);
  auto per = r.bytes_per_nic(rails, bytes);
  const double ratio = static_cast<double>(per[0]) / static_cast<double>(per[1]);
  CAPTURE(per[0]);
  CAPTURE(per[1]);
  CHECK(ratio > 3.3);
  CHECK(ratio < 4.8);
  // Mesh: each local NIC on its same-index peer.
  for (const auto& x : rails) CHECK(x.peer == x.local);
}

TEST_CASE("load_aware: bytes in flight shift the split, small requests go whole to the best NIC") {
  rig<tide::policy::load_aware> r(2, true, {100e6, 100e6});
  // NIC 0 has 32 MiB queued: a 32 MiB request goes (almost) all to NIC 1.
  r.loads[0].dispatched(32ull << 20, 0);
  auto per = r.bytes_per_nic(r.choose(32ull << 20), 32ull << 20);
  CHECK(per[1] >= (30ull << 20));
  // A 64 KiB request: one WR, the idle NIC.
  auto small = r.choose(64 << 10);
  REQUIRE(small.size() == 1);
  CHECK(small[0].local == 1);
  CHECK(small[0].peer == 1);  // rails: NIC 1 reaches peer NIC 1 only
  // Equal NICs and nothing in flight: an even split of a large request.
  r.loads[0].released(32ull << 20, false);
  per = r.bytes_per_nic(r.choose(64ull << 20), 64ull << 20);
  CHECK(per[0] == per[1]);
}

TEST_CASE("a paused rail gets nothing; after the cooldown exactly one probe WR; success restores it") {
  rig<tide::policy::load_aware> r(2, true);
  // Both rails of local NIC 1 fail (its own and the cross one it would fall back to).
  CHECK(r.table.fail(1, r.map.peer_ids[1], 0));
  CHECK(r.table.fail(1, r.map.peer_ids[0], 0));
  for (std::uint64_t bytes : {4096ull, 1ull << 20, 64ull << 20}) {
    for (const auto& x : r.choose(bytes, 3, 50 * ms)) {
      CHECK(x.local == 0);
      CHECK(x.peer == 0);
      CHECK_FALSE(x.probe);
    }
  }
  // The cooldown has passed: the next request sends one probe on NIC 1's best rail, the rest on rail 0.
  auto on_nic1 = [](const std::vector<rail>& rails) {
    std::size_t n = 0;
    for (const auto& x : rails) n += x.local == 1;
    return n;
  };
  auto rails = r.choose(8ull << 20, 3, 100 * ms);
  CHECK(on_nic1(rails) == 1);
  CHECK(rails[0].probe);
  CHECK(rails[0].local == 1);
  CHECK(rails[0].peer == 1);
  // The other paused rail of NIC 1 gets its own single probe; then nothing while both are out.
  rails = r.choose(8ull << 20, 3, 150 * ms);
  CHECK(on_nic1(rails) == 1);
  CHECK(rails[0].peer == 0);
  CHECK(on_nic1(r.choose(8ull << 20, 3, 160 * ms)) == 0);
  // The first probe succeeds: the rail carries traffic again.
  CHECK(r.table.succeed(1, r.map.peer_ids[1]));
  auto per = r.bytes_per_nic(r.choose(64ull << 20, 3, 170 * ms), 64ull << 20);
  CHECK(per[1] > 0);
}

TEST_CASE("next_rail: never the rail that failed, the next healthy one, nothing when none is left") {
  rig<tide::policy::load_aware> r(2, true);
  const rail failed{0, 0, false};
  r.table.fail(0, r.map.peer_ids[0], 0);
  rail next{};
  REQUIRE(r.sel.next_rail(r.every(), r.map, 0xffffu, failed, 1, next));
  CHECK(next.local == 1);
  CHECK(next.peer == 1);
  // Even when the failed rail is not (yet) paused, it is not chosen again.
  rig<tide::policy::load_aware> s(2, true);
  REQUIRE(s.sel.next_rail(s.every(), s.map, 0xffffu, failed, 1, next));
  CHECK_FALSE(next == failed);
  // Every rail paused: nothing until a cooldown passes, then a probe.
  for (std::uint16_t l = 0; l < 2; ++l)
    for (std::uint16_t p = 0; p < 2; ++p) s.table.fail(l, s.map.peer_ids[p], 0);
  CHECK_FALSE(s.sel.next_rail(s.every(), s.map, 0xffffu, failed, 10 * ms, next));
  REQUIRE(s.sel.next_rail(s.every(), s.map, 0xffffu, failed, 100 * ms, next));
  CHECK(next.probe);
  CHECK_FALSE(next == failed);
  // An inactive local NIC is never chosen.
  rig<tide::policy::load_aware> u(2, false);
  REQUIRE(u.sel.next_rail(u.every(), u.map, 0x1u, rail{0, 1, false}, 0, next));
  CHECK(next.local == 0);
  CHECK(next.peer == 0);
}

TEST_CASE("round_robin cycles over the preferred NICs") {
  rig<tide::policy::round_robin> r(3, true);
  std::vector<std::uint16_t> seen;
  for (int i = 0; i < 6; ++i) {
    auto x = r.choose(4096);
    REQUIRE(x.size() == 1);
    CHECK(x[0].peer == x[0].local);
    seen.push_back(x[0].local);
  }
  CHECK(seen == std::vector<std::uint16_t>{0, 1, 2, 0, 1, 2});
  // Within one request, WRs take turns as well.
  auto per = r.bytes_per_nic(r.choose(3ull << 20), 3ull << 20);
  CHECK(per[0] == per[1]);
  CHECK(per[1] == per[2]);
  // Only tier 0 when there is one.
  std::vector<std::uint16_t> pref{2}, avail{0, 1};
  for (int i = 0; i < 4; ++i) CHECK(r.choose(4096, 0, 0, tide::transfer_op::write, {pref, avail, {}, {}})[0].local == 2);
}

TEST_CASE("mooncake_random: one random preferred NIC per request") {
  rig<tide::policy::mooncake_random> r(4, false);
  std::vector<std::uint16_t> pref{1, 3}, avail{0, 2};
  std::set<std::uint16_t> used;
  for (std::uint32_t rnd = 0; rnd < 200; ++rnd) {
    auto rails = r.choose(8ull << 20, rnd * 2654435761u, 0, tide::transfer_op::write, {pref, avail, {}, {}});
    for (const auto& x : rails) {
      CHECK((x.local == 1 || x.local == 3));
      CHECK(x.local == rails[0].local);  // the whole request on one NIC
      CHECK(x.peer == rails[0].peer);
    }
    used.insert(rails[0].local);
  }
  CHECK(used == std::set<std::uint16_t>{1, 3});
}

TEST_CASE("rails topology: every policy keeps each WR on its NIC's own rail") {
  auto check = [](auto&& r) {
    for (std::uint32_t rnd = 0; rnd < 50; ++rnd)
      for (const auto& x : r.choose(4ull << 20, rnd)) CHECK(x.peer == x.local);
  };
  check(rig<tide::policy::load_aware>(2, true));
  check(rig<tide::policy::round_robin>(2, true));
  // mooncake_random picks a random peer NIC as classic does: cross-rail picks
  // happen until rail health pauses them; then the matched rail is used.
  rig<tide::policy::mooncake_random> m(2, true);
  m.table.fail(0, m.map.peer_ids[1], 0);
  m.table.fail(1, m.map.peer_ids[0], 0);
  check(m);
}

TEST_CASE("nic_load: in-flight bytes, counters, and a bandwidth estimate that follows completions") {
  nic_load n(1e9);
  CHECK(n.bandwidth() == doctest::Approx(1e9));
  n.dispatched(1000, 0);
  n.dispatched(1000, 0);
  CHECK(n.inflight_bytes() == 2000);
  CHECK(n.wrs() == 2);
  n.released(1000, true);
  CHECK(n.errors() == 1);
  CHECK(n.inflight_bytes() == 1000);
  n.released(1000, false);
  // A queue draining at 100 MB/s: completions 10 us apart for 1000 bytes.
  // The first 1 ms window replaces the 1 GB/s prior.
  std::int64_t t = 1'000'000'000;
  for (int i = 0; i < 200; ++i) n.dispatched(1000, t);
  for (int i = 0; i < 200; ++i) {
    t += 10'000;
    n.completed(1000, t);
  }
  CHECK(n.bandwidth() == doctest::Approx(100e6).epsilon(0.05));
  CHECK(n.bytes() == 200'000);
  CHECK(n.inflight_bytes() == 0);
}

TEST_CASE("nic_load: completions polled in a burst are not a bandwidth; an idle gap is not a slow NIC") {
  // A 50 Mbit/s rail (6.25 MB/s): 512 KiB WRs finish 84 ms apart, but each
  // signaled completion retires 16 of them within microseconds.  Estimated
  // per completion, that read as tens of GB/s and hit the clamp.
  nic_load n(1.25e9);
  std::int64_t t = 0;
  const std::uint64_t wr = 512 * 1024;
  for (int burst = 0; burst < 4; ++burst) {
    for (int i = 0; i < 16; ++i) n.dispatched(wr, t);
    t += 16 * 83'886'080;  // 16 WRs' wire time at 6.25 MB/s
    for (int i = 0; i < 16; ++i) n.completed(wr, t + i * 2'000);  // polled 2 us apart
  }
  CHECK(n.bandwidth() == doctest::Approx(6.25e6).epsilon(0.05));
  // Idle for a second, then one WR that takes 84 ms: still 6.25 MB/s.
  t += 1'000'000'000;
  n.dispatched(wr, t);
  n.completed(wr, t + 83'886'080);
  CHECK(n.bandwidth() == doctest::Approx(6.25e6).epsilon(0.05));
  CHECK(rate_text_to_bps("100 Gb/sec (4X EDR)") == doctest::Approx(12.5e9));
  CHECK(rate_text_to_bps("2.5 Gb/sec (1X SDR)") == doctest::Approx(2.5e9 / 8));
  CHECK(rate_text_to_bps("") == 0);
  CHECK(rate_text_to_bps("fast") == 0);
}

TEST_CASE("nic_load: a WR dispatched late into a busy NIC does not shorten the window") {
  // Two lanes on one 6.25 MB/s NIC that never runs dry.  Each burst retires
  // 16 WRs; the first one retired was dispatched (by the other lane) 40 ms
  // before it, long after the previous burst, while the rest waited in the
  // link's queue.  Timing the window from that dispatch read 16 WRs in
  // 40 ms: 8x the link (the bimodal 200 / 50 Mbit/s mesh runs).
  nic_load n(1.25e9);
  const std::uint64_t wr = 128 * 1024;
  const std::int64_t wire = 20'971'520;  // one WR at 6.25 MB/s
  std::int64_t t = 0;
  for (int i = 0; i < 32; ++i) n.dispatched(wr, t);  // a queue that never drains below 16
  for (int burst = 0; burst < 12; ++burst) {
    t += 16 * wire;
    n.dispatched(wr, t - 40'000'000);  // the late one, on the other lane
    n.completed(wr, t);
    for (int i = 1; i < 16; ++i) n.completed(wr, t + i * 2'000);
    for (int i = 1; i < 16; ++i) n.dispatched(wr, t + 20'000);  // refill
  }
  CHECK(n.bandwidth() == doctest::Approx(6.25e6).epsilon(0.1));
  CHECK(n.inflight_bytes() > 0);  // busy throughout
}

TEST_CASE("nic_load: a busy period that ends dry is one exact sample, whatever its bursts") {
  // Seen on a 50 Mbit/s rail with two lanes and sparse signaling: 16 x 512 KiB
  // in flight, retired as 512 KiB after 1.447 s, 3 MiB 5 ms later and the
  // last 4.5 MiB 1 ms after that.  Windows between those bursts read 0.4,
  // 621 and 3952 MB/s; the period as a whole moved 8 MiB in 1.453 s.
  nic_load n(1.25e9);
  const std::uint64_t wr = 512 * 1024;
  for (int i = 0; i < 16; ++i) n.dispatched(wr, 0);
  n.completed(wr, 1'447'000'000);
  for (int i = 0; i < 6; ++i) n.completed(wr, 1'452'000'000 + i * 1'000);
  for (int i = 0; i < 9; ++i) n.completed(wr, 1'453'000'000 + i * 1'000);
  CHECK(n.inflight_bytes() == 0);
  CHECK(n.bandwidth() == doctest::Approx(16.0 * wr * 1e9 / 1'453'008'000).epsilon(0.01));
}

// Conformance over every shipped path policy: indices in range, peers valid.
using path_policies = std::tuple<tide::policy::load_aware, tide::policy::round_robin, tide::policy::mooncake_random>;
TEST_CASE_TEMPLATE_DEFINE("path policy conformance", P, path_conformance) {
  static_assert(tide::path_policy<P>);
  CHECK_FALSE(P::kName.empty());
  P p;
  std::vector<tide::path_nic> nics{{0, 0, 0, 0, 1e9}, {1, 1, 0, 1 << 20, 2e9}, {2, 2, 1, 0, 1e9}};
  std::vector<tide::path_peer> peers{{0, 0}, {1, 0}, {2, 1}};
  for (std::uint32_t rnd = 0; rnd < 100; ++rnd) {
    for (std::size_t n : {1u, 3u, 17u, 64u}) {
      std::vector<std::uint32_t> lens(n, 65536);
      std::vector<tide::path_choice> out(n, tide::path_choice{999, 999});
      p.assign(tide::path_query{nics, peers, n * 65536, rnd * 7919u}, lens, out);
      for (const auto& c : out) {
        CHECK(c.nic < nics.size());
        CHECK(c.peer < 3);
      }
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(path_conformance, path_policies);

TEST_CASE("retire_wr: a coalesced WR retires its riders, gives the head its own share, releases the NIC and heals the rail") {
  using namespace tide::rdma::detail;
  batch_state b(3);
  for (int t = 0; t < 3; ++t) {
    b.tasks[t].slices_left = 1;
    b.tasks[t].state = tide::transfer_state::pending;
    b.tasks[t].slices.resize(1);
  }
  b.unfinished = 3;
  b.inflight = 3;
  // One 12 KiB WR over three 4 KiB requests: head = task 0's piece, riders = tasks 1 and 2.
  slice& head = b.tasks[0].slices[0];
  slice& r1 = b.tasks[1].slices[0];
  slice& r2 = b.tasks[2].slices[0];
  head.task = &b.tasks[0];
  r1.task = &b.tasks[1];
  r2.task = &b.tasks[2];
  head.length = 12288;
  head.share = 4096;
  r1.length = r2.length = 4096;
  head.rider = &r1;
  r1.rider = &r2;
  nic_load nic(1e9);
  rail_state rail;
  rail_health_config cfg;
  rail.fail(0, cfg);
  nic.dispatched(head.length, 0);
  head.charged = &nic;
  head.rail = &rail;
  retire_wr(head, tide::errc::ok);
  for (int t = 0; t < 3; ++t) {
    CHECK(b.tasks[t].state == tide::transfer_state::completed);
    CHECK(b.tasks[t].bytes == 4096);
  }
  CHECK(b.inflight == 0);
  CHECK(b.unfinished == 0);
  CHECK(nic.inflight_bytes() == 0);
  CHECK(nic.bytes() == 12288);
  CHECK(rail.healthy());
  CHECK(head.charged == nullptr);

  // A failure: every task of the WR fails with the cause, the NIC counts an error.
  batch_state c(2);
  for (int t = 0; t < 2; ++t) {
    c.tasks[t].slices_left = 1;
    c.tasks[t].state = tide::transfer_state::pending;
    c.tasks[t].slices.resize(1);
    c.tasks[t].slices[0].task = &c.tasks[t];
    c.tasks[t].slices[0].length = 100;
  }
  c.unfinished = 2;
  c.inflight = 2;
  slice& h = c.tasks[0].slices[0];
  h.rider = &c.tasks[1].slices[0];
  h.share = 100;
  h.length = 200;
  nic.dispatched(200, 0);
  h.charged = &nic;
  retire_wr(h, tide::errc::transport_retry_exceeded);
  CHECK(c.tasks[0].state == tide::transfer_state::failed);
  CHECK(c.tasks[1].state == tide::transfer_state::failed);
  CHECK(c.tasks[1].reason == tide::errc::transport_retry_exceeded);
  CHECK(nic.errors() == 1);
  CHECK(nic.inflight_bytes() == 0);
}
