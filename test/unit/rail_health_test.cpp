// Rail health (include/tide/rdma/plan/rail_health.hpp) on a fake clock:
// pause, doubling cooldown up to the bound, one probe per window, restore on
// success, one outage counted once, and the table shared by threads.

#include <tide/rdma/plan/path_selector.hpp>
#include <tide/rdma/plan/rail_health.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace tide::rdma::plan;
using std::chrono::microseconds;

namespace {
constexpr std::int64_t ms = 1000;
rail_health_config cfg100() { return {microseconds(100 * ms), microseconds(10'000 * ms)}; }
}  // namespace

TEST_CASE("a failing rail pauses, probes after the cooldown and doubles it up to the bound") {
  const auto cfg = cfg100();
  rail_state r;
  std::int64_t now = 1'000'000;
  CHECK(r.healthy());
  CHECK(r.fail(now, cfg));  // healthy -> paused 100 ms
  CHECK_FALSE(r.healthy());
  CHECK(r.snapshot().phase == rail_phase::paused);
  CHECK(r.snapshot().until_us == now + 100 * ms);
  // Failures of WRs already on the wire in the same outage do not extend it.
  CHECK_FALSE(r.fail(now + 10 * ms, cfg));
  CHECK(r.snapshot().until_us == now + 100 * ms);
  CHECK(r.snapshot().failures == 2);
  CHECK(r.snapshot().pauses == 1);
  // No probe before the cooldown.
  CHECK_FALSE(r.probe_due(now + 99 * ms));
  CHECK_FALSE(r.claim_probe(now + 99 * ms, cfg));
  // Exactly one probe after it.
  now += 100 * ms;
  CHECK(r.probe_due(now));
  CHECK(r.claim_probe(now, cfg));
  CHECK_FALSE(r.claim_probe(now, cfg));
  CHECK_FALSE(r.claim_probe(now + 50 * ms, cfg));
  CHECK(r.snapshot().phase == rail_phase::probing);
  // The probe fails: paused twice as long.
  std::int64_t expect = 200 * ms;
  CHECK(r.fail(now, cfg));
  CHECK(r.snapshot().until_us == now + expect);
  // And again: 400, 800, ... capped at 10 s.
  for (int i = 0; i < 10; ++i) {
    now = r.snapshot().until_us;
    REQUIRE(r.claim_probe(now, cfg));
    CHECK(r.fail(now, cfg));
    expect = std::min<std::int64_t>(expect * 2, 10'000 * ms);
    CHECK(r.snapshot().until_us - now == expect);
  }
  CHECK(expect == 10'000 * ms);
  // A probe that succeeds restores the rail and resets the cooldown.
  now = r.snapshot().until_us;
  REQUIRE(r.claim_probe(now, cfg));
  CHECK(r.succeed());
  CHECK(r.healthy());
  CHECK_FALSE(r.succeed());  // already healthy: nothing to restore
  CHECK(r.fail(now, cfg));
  CHECK(r.snapshot().until_us == now + 100 * ms);
}

TEST_CASE("a success restores a paused rail at once; a lost probe is replaced after its window") {
  const auto cfg = cfg100();
  rail_state r;
  CHECK(r.fail(0, cfg));
  CHECK(r.succeed());
  CHECK(r.healthy());
  CHECK(r.fail(0, cfg));
  REQUIRE(r.claim_probe(100 * ms, cfg));  // probe window: 100 ms
  // The probe never reports (canceled before posting): another may go after the window.
  CHECK_FALSE(r.claim_probe(150 * ms, cfg));
  CHECK(r.claim_probe(200 * ms, cfg));
}

TEST_CASE("cooldown_us and config validation") {
  const auto cfg = cfg100();
  CHECK(rail_state::cooldown_us(cfg, 1) == 100 * ms);
  CHECK(rail_state::cooldown_us(cfg, 2) == 200 * ms);
  CHECK(rail_state::cooldown_us(cfg, 8) == 10'000 * ms);
  CHECK(rail_state::cooldown_us(cfg, 63) == 10'000 * ms);
  CHECK(cfg.validate().has_value());
  rail_health_config bad{microseconds(0), microseconds(1)};
  CHECK(bad.validate().error().detail.find("rail_initial_cooldown") != std::string::npos);
  bad = {microseconds(10), microseconds(5)};
  CHECK(bad.validate().error().detail.find("rail_max_cooldown") != std::string::npos);
}

TEST_CASE("which failures pause a rail, and which a fresh endpoint may cure") {
  using tide::errc;
  // A peer that turned the connect down for a race in its endpoint store
  // (busy) or a failed QP setup (qp_state_error) is tried again; one that
  // rejected it for good (handshake_rejected) or is gone is not.
  CHECK(fresh_endpoint_may_help(errc::busy));
  CHECK(fresh_endpoint_may_help(errc::qp_state_error));
  CHECK(fresh_endpoint_may_help(errc::transport_retry_exceeded));
  CHECK_FALSE(fresh_endpoint_may_help(errc::handshake_rejected));
  CHECK_FALSE(fresh_endpoint_may_help(errc::peer_unreachable));
  CHECK_FALSE(fresh_endpoint_may_help(errc::remote_access_error));
  // busy is the peer's store, not the rail: the rail stays healthy.
  CHECK_FALSE(counts_against_rail(errc::busy));
  CHECK(counts_against_rail(errc::qp_state_error));
  CHECK(counts_against_rail(errc::handshake_rejected));
}

TEST_CASE("rail_table: peer ids by name, rails independent, shared by threads") {
  rail_table t(cfg100());
  const auto a = t.peer_id("srv@rxe0");
  const auto b = t.peer_id("srv@rxe2");
  CHECK(a != b);
  CHECK(t.peer_id("srv@rxe0") == a);
  CHECK(t.peer_names() == std::vector<std::string>{"srv@rxe0", "srv@rxe2"});
  CHECK(t.fail(1, a, 0));
  CHECK_FALSE(t.healthy(1, a));
  CHECK(t.healthy(0, a));
  CHECK(t.healthy(1, b));
  CHECK(t.healthy(1, rail_table::kNoPeer));  // unknown peers are never paused
  // Many lanes fail the same rail at once: it pauses once, exactly one of them wins the probe.
  rail_table u(cfg100());
  const auto p = u.peer_id("srv@rxe1");
  std::atomic<int> paused{0}, probes{0};
  std::vector<std::thread> lanes;
  for (int i = 0; i < 8; ++i)
    lanes.emplace_back([&] {
      for (int k = 0; k < 1000; ++k)
        if (u.fail(0, p, 5)) paused.fetch_add(1);
    });
  for (auto& th : lanes) th.join();
  lanes.clear();
  for (int i = 0; i < 8; ++i)
    lanes.emplace_back([&] {
      if (u.claim_probe(0, p, 5 + 100 * ms)) probes.fetch_add(1);
    });
  for (auto& th : lanes) th.join();
  CHECK(paused.load() == 1);
  CHECK(probes.load() == 1);
  CHECK(u.at(0, p).snapshot().failures == 8000);
  // Registering many peers grows the table in chunks; earlier references stay valid.
  rail_state& first = u.at(3, p);
  for (int i = 0; i < 500; ++i) (void)u.peer_id("peer@" + std::to_string(i));
  CHECK(&first == &u.at(3, p));
}

// Review 1ab3d99 #11: the rail table never shrank and returned kNoPeer past
// 16384 peer NICs, so a long-lived node whose peers restart on new ports
// lost rail health for every new peer, silently.
TEST_CASE("review 1ab3d99 #11: a full rail table recycles the peer NIC nobody has held for longest") {
  rail_table t(cfg100(), 4);
  CHECK(t.capacity() == 4);
  std::vector<std::uint32_t> id;
  for (int i = 0; i < 4; ++i) id.push_back(t.peer_id("p" + std::to_string(i)));
  CHECK(t.fail(0, id[0], 0));
  CHECK(t.fail(0, id[3], 0));
  // Every id held (open segments use them): no room, and said so once.
  CHECK(t.peer_id("p4") == rail_table::kNoPeer);
  CHECK(t.peer_id("p5") == rail_table::kNoPeer);
  // p1 let go first, then p0: p1's id goes first, then p0's, each reset.
  t.release(id[1]);
  t.release(id[0]);
  const auto p4 = t.peer_id("p4");
  REQUIRE(p4 == id[1]);
  const auto p5 = t.peer_id("p5");
  REQUIRE(p5 == id[0]);
  CHECK(t.at(0, p5).snapshot().failures == 0);
  CHECK(t.healthy(0, p5));
  CHECK(t.recycled_peers() == 2);
  CHECK(t.peer_names() == std::vector<std::string>{"p5", "p4", "p2", "p3"});
  CHECK(t.peer_id("p0") == rail_table::kNoPeer);  // its id is p5's now; every id held again
  // An idle id taken back by its own NIC keeps its rails (nothing recycled).
  t.release(id[3]);
  CHECK(t.peer_id("p3") == id[3]);
  CHECK(t.at(0, id[3]).snapshot().failures == 1);
  CHECK(t.held_peers() == 4);

  // Through rail maps: a map holds its peer NICs while it lives.
  rail_table u(cfg100(), 2);
  const std::vector<gid_raw> one_local(1), two_peers(2);
  const std::vector<std::string> first{"a@rxe0", "a@rxe1"}, second{"b@rxe0", "b@rxe1"};
  std::optional<rail_map> m = rail_map::build(u, one_local, first, two_peers);
  CHECK(u.held_peers() == 2);
  {
    const rail_map full = rail_map::build(u, one_local, second, two_peers);
    CHECK(full.peer_ids == std::vector<std::uint32_t>{rail_table::kNoPeer, rail_table::kNoPeer});
  }
  m.reset();  // the segment closed, its tasks freed: the map goes
  CHECK(u.held_peers() == 0);
  const rail_map next = rail_map::build(u, one_local, second, two_peers);
  CHECK(next.peer_ids == std::vector<std::uint32_t>{0, 1});
  CHECK(u.peer_names() == std::vector<std::string>{"b@rxe0", "b@rxe1"});
}

// The recycling under threads (run under TSan by tools/sanitize): maps made
// and dropped on several threads over a table far smaller than the peer NICs
// they name.  While a map lives, each id it holds keeps the name it asked
// for: an id is recycled only once nobody holds it.
TEST_CASE("review 1ab3d99 #11: rail maps made and dropped on several threads never see their ids recycled") {
  rail_table t(cfg100(), 16);
  std::atomic<int> wrong{0}, without{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      const std::vector<gid_raw> one_local(1), two_peers(2);
      for (int i = 0; i < 300; ++i) {
        const std::vector<std::string> paths{"s" + std::to_string((w * 7 + i) % 40) + "@rxe0",
                                             "s" + std::to_string((w * 7 + i) % 40) + "@rxe1"};
        const rail_map m = rail_map::build(t, one_local, paths, two_peers);
        for (std::size_t k = 0; k < paths.size(); ++k) {
          if (m.peer_ids[k] == rail_table::kNoPeer) {
            ++without;
            continue;
          }
          (void)t.fail(0, m.peer_ids[k], i);
          (void)t.succeed(0, m.peer_ids[k]);
          if (t.peer_names().at(m.peer_ids[k]) != paths[k]) ++wrong;
        }
      }
    });
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
  CHECK(t.held_peers() == 0);
  CHECK(t.recycled_peers() > 0);
  MESSAGE(t.recycled_peers() << " ids recycled, " << without.load() << " peer NICs went without rail health");
}
