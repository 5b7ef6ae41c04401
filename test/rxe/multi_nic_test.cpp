// Two NICs per side (tools/rxe-vm --nics 2): path selection and rail health on
// real Soft-RoCE devices, every byte checked.
//  - rails (NIC i reaches only the peer's NIC i): every request completes with
//    each shipped path policy, both NICs carry bytes, and the rail-matching
//    policies never try a cross rail; a submit over both NICs runs on as
//    many lanes as on one, later submits rotate over them.
//  - mesh, one link taken down mid-run (tide-vm-link): no request fails,
//    traffic continues on the survivor; link up: the rail carries bytes again
//    after its cooldown.
//  - loss on a link (--loss): every byte verified.
//  - rails, one link taken down: the metrics' rail-state gauge leaves
//    healthy, and returns to it after link up.
// Each case checks RXE_VM_NICS / RXE_VM_TOPOLOGY / RXE_VM_LOSSES and skips
// (with a message) in a VM that does not have its network.

#include <doctest/doctest.h>

#include <tide/engine.hpp>

#include "rxe_helpers.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;

struct round_robin_paths : tide::default_policies {
  using path = tide::policy::round_robin;
};
struct classic_paths : tide::default_policies {
  using path = tide::policy::mooncake_random;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The two sides of a --nics 2 VM, or nothing (with the reason printed).
std::optional<std::pair<std::vector<std::string>, std::vector<std::string>>> two_nic_sides(const char* topology) {
  auto a = words(env("RXE_VM_SIDE_A")), b = words(env("RXE_VM_SIDE_B"));
  if (a.size() < 2 || b.size() < 2) {
    MESSAGE("needs tools/rxe-vm --nics 2 (RXE_VM_SIDE_A/B): skipped");
    return std::nullopt;
  }
  if (topology != nullptr && env("RXE_VM_TOPOLOGY") != topology) {
    MESSAGE("needs --topology " << std::string(topology) << " (this VM: " << env("RXE_VM_TOPOLOGY") << "): skipped");
    return std::nullopt;
  }
  a.resize(2);
  b.resize(2);
  return std::make_pair(a, b);
}

// Page-aligned memory.
struct buffer {
  explicit buffer(std::size_t n) : size(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    std::memset(data, 0, n);
  }
  ~buffer() { std::free(data); }
  buffer(const buffer&) = delete;
  std::size_t size;
  unsigned char* data;
};

void fill(unsigned char* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    const std::uint64_t v = g();
    std::memcpy(p + i, &v, 8);
  }
}

template <class P>
struct rig {
  std::unique_ptr<tide::transfer_engine<P>> a, b;
  buffer la, lb;
  tide::segment_id seg = 0;

  rig(const std::vector<std::string>& side_a, const std::vector<std::string>& side_b, std::size_t size,
      std::chrono::milliseconds cooldown = 100ms)
      : la(size), lb(size) {
    a = make(side_a, cooldown);
    b = make(side_b, cooldown);
    REQUIRE(a->register_memory(la.data, la.size, "cpu:0"));
    REQUIRE(b->register_memory(lb.data, lb.size, "cpu:0"));
    seg = a->open_segment(b->segment_name()).value();
  }
  static std::unique_ptr<tide::transfer_engine<P>> make(const std::vector<std::string>& devices,
                                                       std::chrono::milliseconds cooldown) {
    tide::engine_config c;
    c.local_server_name = "127.0.0.1";
    c.devices = devices;
    c.transports = "rdma";  // rail health and path policies, not the failover to TCP
    c.transfer_timeout = 60s;
    c.max_retry = 8;
    c.rail_cooldown = cooldown;
    auto e = tide::transfer_engine<P>::create(c);
    if (!e) FAIL("transfer_engine::create: " << e.error().message());
    return std::move(*e);
  }

  // One batch of `parts` contiguous requests covering [off, off+len) (they
  // coalesce); WRITE checks the peer's bytes, READ ours.  Empty on success.
  std::string round_trip(transfer_op op, std::size_t off, std::size_t len, std::size_t parts, std::uint64_t seed) {
    unsigned char* src = op == transfer_op::write ? la.data : lb.data;
    unsigned char* dst = op == transfer_op::write ? lb.data : la.data;
    fill(src + off, len, seed);
    std::memset(dst + off, 0, len);
    std::vector<transfer_request> reqs;
    const std::size_t step = len / parts;
    for (std::size_t i = 0; i < parts; ++i) {
      const std::size_t o = off + i * step;
      const std::size_t n = i + 1 == parts ? len - i * step : step;
      reqs.push_back(transfer_request::at_address(op, la.data + o, seg, reinterpret_cast<std::uint64_t>(lb.data + o), n));
    }
    auto batch = a->allocate_batch(parts);
    if (!batch) return batch.error().message();
    if (auto s = a->submit(*batch, reqs); !s) {
      (void)a->free_batch(*batch);
      return s.error().message();
    }
    auto w = a->wait(*batch, 60s);
    auto st = a->batch_status(*batch);
    std::string why;
    if (!w) why = "wait: " + w.error().message();
    else if (!st) why = st.error().message();
    else if (st->state != transfer_state::completed)
      why = std::string(tide::to_string(st->state)) + " " + std::string(tide::to_string(st->reason));
    else if (std::memcmp(src + off, dst + off, len) != 0)
      why = "bytes differ";
    if (!why.empty()) {
      (void)a->cancel(*batch);
      (void)a->wait(*batch, 60s);
    }
    while (!a->free_batch(*batch)) std::this_thread::sleep_for(1ms);
    return why;
  }

  std::map<std::string, tide::rdma::plan::nic_stats> nics() const {
    std::map<std::string, tide::rdma::plan::nic_stats> m;
    for (const auto& n : a->stats().nics) m[n.name] = n;
    return m;
  }
  void print_stats(const char* what) const {
    const auto st = a->stats();
    std::ostringstream os;
    os << what << ":";
    for (const auto& n : st.nics) os << " " << n.name << " " << n.bytes / 1000000.0 << " MB (" << n.wrs << " WRs, " << n.errors << " errors)";
    for (const auto& r : st.rails)
      os << "; rail " << r.local << " -> " << r.peer << " " << tide::rdma::plan::to_string(r.state.phase) << " after "
         << r.state.failures << " failure(s)";
    MESSAGE(os.str());
  }
};

template <class P>
void rails_case(const std::vector<std::string>& side_a, const std::vector<std::string>& side_b, bool matched_only) {
  rig<P> r(side_a, side_b, 16u << 20);
  int failed = 0;
  for (int i = 0; i < 24; ++i) {
    const auto op = i % 2 == 0 ? transfer_op::write : transfer_op::read;
    const std::size_t len = i % 3 == 0 ? (4u << 20) : (i % 3 == 1 ? (1u << 20) + 4096 * i : 64u << 10);
    const auto why = r.round_trip(op, (i % 4) * (4u << 20), len, i % 5 == 0 ? 4 : 1, 1000 + i);
    if (!why.empty()) {
      ++failed;
      MESSAGE("request " << i << ": " << why);
    }
  }
  r.print_stats(P::path::kName.data());
  CHECK(failed == 0);
  const auto n = r.nics();
  CHECK(n.at(side_a[0]).bytes > 0);
  CHECK(n.at(side_a[1]).bytes > 0);
  CHECK(n.at(side_a[0]).inflight_bytes == 0);
  CHECK(n.at(side_a[1]).inflight_bytes == 0);
  // load_aware and round_robin keep each NIC on its own rail: no cross-rail attempt at all.
  if (matched_only) CHECK(r.a->stats().rails.empty());
}

}  // namespace

TEST_CASE("rails, 2 NICs per side: every request completes, both NICs carry bytes") {
  const auto sides = two_nic_sides("rails");
  if (!sides) return;
  SUBCASE("load_aware") { rails_case<tide::default_policies>(sides->first, sides->second, true); }
  SUBCASE("round_robin") { rails_case<round_robin_paths>(sides->first, sides->second, true); }
  // Classic's random peer NIC hits the cross rails; rail health pauses them and the slices retry on the matched rail.
  SUBCASE("mooncake_random") { rails_case<classic_paths>(sides->first, sides->second, false); }
}

// A submit spread over both NICs runs on num_qp_per_ep lanes in all, as on
// one NIC (hardening issue item 8: where the CPU is the bottleneck every lane
// more costs), and successive submits to one peer rotate over the lanes, so
// none stays idle.
TEST_CASE("rails, 2 NICs per side: a submit over both NICs uses num_qp_per_ep lanes in all; later submits rotate") {
  const auto sides = two_nic_sides("rails");
  if (!sides) return;
  rig<tide::default_policies> r(sides->first, sides->second, 16u << 20);
  auto& t = r.a->transport();
  REQUIRE(t.context_count() == 2);
  auto posted = [&] {
    std::vector<std::uint64_t> v;
    for (std::size_t c = 0; c < t.context_count(); ++c)
      for (std::size_t l = 0; l < t.context(c).lanes().size(); ++l) v.push_back(t.context(c).lanes().at(l).posted_wrs());
    return v;
  };
  const std::size_t lanes_per_nic = t.context(0).lanes().size();
  REQUIRE(lanes_per_nic == 2);  // engine_config's default num_qp_per_ep
  int over_both = 0;  // submits that load_aware split over both NICs: the ones the width bound is about
  for (int i = 0; i < 8; ++i) {
    const auto before = posted();
    CHECK(r.round_trip(transfer_op::write, 0, 4u << 20, 1, 500 + i) == "");
    const auto after = posted();
    std::size_t lanes_used = 0, nics_used = 0;
    for (std::size_t c = 0; c < 2; ++c) {
      bool nic = false;
      for (std::size_t l = 0; l < lanes_per_nic; ++l)
        if (after[c * lanes_per_nic + l] > before[c * lanes_per_nic + l]) ++lanes_used, nic = true;
      nics_used += nic ? 1 : 0;
    }
    INFO("submit " << i << ": " << lanes_used << " lanes on " << nics_used << " NICs");
    CHECK(lanes_used <= lanes_per_nic);
    over_both += nics_used == 2 ? 1 : 0;
  }
  CHECK(over_both > 0);
  std::ostringstream os;
  for (const auto n : posted()) os << " " << n;
  MESSAGE("WRs posted per lane (NIC 0's, then NIC 1's):" << os.str());
  for (const auto n : posted()) CHECK(n > 0);
}

TEST_CASE("rails, 2 NICs per side: teardown with ~1000 WRs in flight leaves every task final, the engine goes") {
  const auto sides = two_nic_sides("rails");
  if (!sides) return;
  constexpr std::size_t kCount = 2048, kSize = 4096;
  rig<tide::default_policies> r(sides->first, sides->second, 2 * kCount * kSize);
  // Both rails connected first, so teardown meets posted WRs on both NICs.
  REQUIRE(r.round_trip(transfer_op::write, 0, 8u << 20, 1, 77).empty());
  const auto out = tide::test::shutdown_under_traffic(*r.a, r.seg, r.la.data, reinterpret_cast<std::uint64_t>(r.lb.data),
                                                      kCount, kSize);
  MESSAGE("shutdown took " << out.took.count() << " ms; tasks completed " << out.completed << ", failed "
                           << out.failed << ", other " << out.other);
  CHECK(out.all_final);
  CHECK(out.other == 0);
  CHECK(out.freed);
  CHECK(out.took < 20s);
  const auto t0 = std::chrono::steady_clock::now();
  r.a.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("mesh, one link down mid-run: no request fails, the survivor carries on; link up: used again") {
  const auto sides = two_nic_sides("mesh");
  if (!sides) return;
  if (::geteuid() != 0) {
    MESSAGE("needs root for tide-vm-link: skipped");
    return;
  }
  const auto& a = sides->first;
  rig<tide::default_policies> r(a, sides->second, 16u << 20);
  std::atomic<bool> stop{false};
  std::atomic<int> completed{0}, failed{0};
  std::thread load([&] {
    for (int i = 0; !stop.load(); ++i) {
      const auto op = i % 2 == 0 ? transfer_op::write : transfer_op::read;
      const auto why = r.round_trip(op, (i % 4) * (4u << 20), 4u << 20, 1, 5000 + i);
      if (why.empty()) {
        ++completed;
      } else {
        ++failed;
        MESSAGE("request " << i << ": " << why);
      }
    }
  });
  std::this_thread::sleep_for(2s);
  const auto before = r.nics();
  CHECK(before.at(a[0]).bytes > 0);
  CHECK(before.at(a[1]).bytes > 0);
  REQUIRE(std::system("tide-vm-link down 0 >/dev/null") == 0);
  std::this_thread::sleep_for(1s);  // the outage's in-flight WRs fail over
  const auto down_start = r.nics();
  const int done_start = completed.load();
  std::this_thread::sleep_for(3s);
  const auto down_end = r.nics();
  const int done_during = completed.load() - done_start;
  r.print_stats("link 0 down");
  MESSAGE("while down: " << done_during << " requests completed");
  CHECK(done_during > 0);
  CHECK(down_end.at(a[1]).bytes > down_start.at(a[1]).bytes);  // the survivor carries the traffic
  REQUIRE(std::system("tide-vm-link up 0 >/dev/null") == 0);
  // Back after the cooldown (at most rail_max_cooldown, 10 s, plus a probe).
  bool reused = false;
  const auto up = r.nics();
  for (int i = 0; i < 200 && !reused; ++i) {
    std::this_thread::sleep_for(100ms);
    reused = r.nics().at(a[0]).bytes > up.at(a[0]).bytes;
  }
  stop = true;
  load.join();
  r.print_stats("link 0 up again");
  CHECK_MESSAGE(reused, a[0] << " carried nothing within 20 s of link up");
  CHECK(failed.load() == 0);
  CHECK(completed.load() > done_start);
}

TEST_CASE("loss on a link: every byte verified") {
  const auto sides = two_nic_sides(nullptr);
  if (!sides) return;
  bool lossy = false;
  for (const auto& l : words(env("RXE_VM_LOSSES"))) lossy |= l != "-";
  if (!lossy) {
    MESSAGE("needs tools/rxe-vm --loss: skipped");
    return;
  }
  rig<tide::default_policies> r(sides->first, sides->second, 16u << 20);
  int failed = 0;
  for (int i = 0; i < 30; ++i) {
    const auto op = i % 2 == 0 ? transfer_op::write : transfer_op::read;
    const std::size_t len = i % 3 == 0 ? (4u << 20) : (256u << 10) + 4096 * i;
    const auto why = r.round_trip(op, (i % 4) * (4u << 20), len, 1 + i % 3, 9000 + i);
    if (!why.empty()) {
      ++failed;
      MESSAGE("request " << i << ": " << why);
    }
  }
  r.print_stats("with loss");
  CHECK(failed == 0);
}

// The metrics' rail-state gauge (issue 18 part 4): the rail of a link taken
// down leaves "healthy" while it is down and comes back after link up.
TEST_CASE("rails, one link down: the metrics' rail-state gauge shows it, and its recovery") {
  const auto sides = two_nic_sides("rails");
  if (!sides) return;
  for (const auto& l : words(env("RXE_VM_LOSSES")))
    if (l != "-") {
      MESSAGE("a lossy VM: skipped (the rxe-rails stage runs it)");
      return;
    }
  if (::geteuid() != 0) {
    MESSAGE("needs root for tide-vm-link: skipped");
    return;
  }
  const auto& a = sides->first;
  const auto& b = sides->second;
  rig<tide::default_policies> r(a, b, 16u << 20);
  std::atomic<bool> stop{false};
  std::thread load([&] {
    for (int i = 0; !stop.load(); ++i) (void)r.round_trip(transfer_op::write, (i % 4) * (4u << 20), 1u << 20, 1, 7000 + i);
  });
  // The gauge sample of rail a[0] -> b[0] for `state`, or -1 when absent.
  auto gauge = [&](const char* state) {
    const std::string text = r.a->metrics_text();
    const std::string head = "tide_rail_state{local_nic=\"" + a[0] + "\",peer_nic=\"" + r.b->segment_name() + "@" + b[0] +
                             "\",state=\"" + state + "\"} ";
    const auto at = text.find(head);
    return at == std::string::npos ? -1 : std::stoi(text.substr(at + head.size()));
  };
  std::this_thread::sleep_for(500ms);
  CHECK(gauge("healthy") == 1);
  CHECK(gauge("paused") == 0);
  REQUIRE(std::system("tide-vm-link down 0 >/dev/null") == 0);
  bool left_healthy = false;
  for (int i = 0; i < 100 && !left_healthy; ++i) {
    std::this_thread::sleep_for(50ms);
    // Soft-RoCE reports the link as a port error: the NIC's context goes
    // inactive (local_nic_down); a rail that fails on the wire first pauses.
    left_healthy = gauge("healthy") == 0 && gauge("paused") + gauge("probing") + gauge("local_nic_down") == 1;
  }
  r.print_stats("link 0 down");
  CHECK_MESSAGE(left_healthy, "rail " << a[0] << " -> " << b[0] << " still healthy in the gauge 5 s after link down");
  REQUIRE(std::system("tide-vm-link up 0 >/dev/null") == 0);
  bool healthy_again = false;
  for (int i = 0; i < 200 && !healthy_again; ++i) {
    std::this_thread::sleep_for(100ms);
    healthy_again = gauge("healthy") == 1;
  }
  stop = true;
  load.join();
  r.print_stats("link 0 up again");
  CHECK_MESSAGE(healthy_again, "rail " << a[0] << " -> " << b[0] << " not healthy in the gauge 20 s after link up");
}
