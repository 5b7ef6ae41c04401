// The verbs layer against real (Soft-RoCE) devices: two devices, two RC QPs
// connected across them, WRITE and READ checked byte by byte, a remote access
// error that must complete (not hang), and a teardown that leaves nothing.
#include <tide/verbs/cq.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/error.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/mr.hpp>
#include <tide/verbs/pd.hpp>
#include <tide/verbs/qp.hpp>

#include "devices_under_test.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <poll.h>
#include <unistd.h>

namespace v = tide::verbs;
using tide::errc;

namespace {

constexpr std::size_t kRegion = 64u << 20;
constexpr std::uint8_t kPort = 1;

// The two devices under test (the same one twice when there is one: loopback).
std::array<std::string, 2> two_devices() {
  const auto names = tide::test::devices_under_test();
  REQUIRE(names.size() >= 2);
  return {names[0], names[1]};
}

struct free_deleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};

// One end: declared in construction order, so members die in the order verbs needs
// (qp, mr, cq, pd, context, then the memory).
struct side {
  std::string name;
  std::unique_ptr<std::byte, free_deleter> mem;
  v::context ctx;
  ibv_port_attr port;
  int gid_index;
  v::gid gid;
  v::protection_domain pd;
  v::completion_queue cq;
  v::memory_region mr;
  v::queue_pair qp;

  [[nodiscard]] std::byte* base() const noexcept { return mem.get(); }
  [[nodiscard]] std::uint64_t remote_base() const noexcept { return reinterpret_cast<std::uintptr_t>(mr.addr()); }
};

template <class T>
T take(tide::result<T> r, const char* what) {
  INFO(what);
  REQUIRE_MESSAGE(r.has_value(), (r ? std::string() : r.error().message()));
  return std::move(*r);
}

std::unique_ptr<side> open_side(const std::string& name) {
  std::unique_ptr<std::byte, free_deleter> mem(static_cast<std::byte*>(std::aligned_alloc(4096, kRegion)));
  REQUIRE(mem != nullptr);
  std::memset(mem.get(), 0, kRegion);
  auto ctx = take(v::context::open(name), "open");
  const auto port = take(ctx.query_port(kPort), "query_port");
  const int gid_index = take(v::select_gid_index(name, kPort), "select_gid_index");
  const auto gid = take(ctx.query_gid(kPort, gid_index), "query_gid");
  auto pd = take(v::protection_domain::create(ctx), "pd");
  auto cq = take(v::completion_queue::create(ctx, 256), "cq");
  auto mr = take(v::memory_region::register_memory(pd, mem.get(), kRegion), "register 64 MiB");
  auto qp = take(v::queue_pair::create(pd, cq, cq), "qp");
  return std::unique_ptr<side>(new side{name, std::move(mem), std::move(ctx), port, gid_index, gid, std::move(pd),
                                        std::move(cq), std::move(mr), std::move(qp)});
}

// The out-of-band exchange a real engine does over TCP, done in memory here.
void connect(side& a, side& b) {
  const ibv_mtu mtu = v::path_mtu(a.port.active_mtu, b.port.active_mtu);
  auto addr_for = [mtu](const side& local, const side& peer) {
    v::remote_qp r;
    r.qp_num = peer.qp.qp_num();
    r.dgid = peer.gid;
    r.lid = peer.port.lid;
    r.path_mtu = mtu;
    r.sgid_index = local.gid_index;
    return r;
  };
  for (side* s : {&a, &b}) REQUIRE_MESSAGE(s->qp.to_init(kPort), s->name);
  const auto ra = addr_for(a, b);
  const auto rb = addr_for(b, a);
  auto r = a.qp.to_rtr(ra);
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  r = b.qp.to_rtr(rb);
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  r = a.qp.to_rts();
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  r = b.qp.to_rts();
  REQUIRE_MESSAGE(r, (r ? "" : r.error().message()));
  CHECK(take(a.qp.state(), "state") == IBV_QPS_RTS);
  CHECK(take(b.qp.state(), "state") == IBV_QPS_RTS);
}

// Posts one signaled WR and waits for its completion; errc::timed_out when
// nothing completes within `limit`.
errc run_one(side& s, ibv_wr_opcode op, std::byte* local, std::uint64_t remote, std::uint32_t rkey, std::size_t len,
             std::chrono::milliseconds limit, ibv_wc& wc) {
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(local), static_cast<std::uint32_t>(len), s.mr.lkey()};
  ibv_send_wr wr{};
  wr.wr_id = len;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  if (const errc e = s.qp.post_send(&wr); e != errc::ok) return e;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    const int n = s.cq.poll({&wc, 1});
    if (n < 0) return errc::verbs_failed;
    if (n == 1) return v::errc_from_wc_status(wc.status);
  }
  return errc::timed_out;
}

std::uint8_t pattern(std::uint64_t i, std::uint64_t seed) noexcept {
  return static_cast<std::uint8_t>(((i + seed) * 0x9E3779B97F4A7C15ull) >> 56);
}

// Counts of the kernel's RDMA resources per device (`rdma -j resource show`),
// or nothing where the rdma tool is missing.
using resource_counts = std::map<std::string, std::map<std::string, long>>;
std::optional<resource_counts> rdma_resources() {
  FILE* p = ::popen("rdma -j resource show 2>/dev/null", "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (::pclose(p) != 0 || out.empty()) return std::nullopt;
  resource_counts counts;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_array()) return std::nullopt;
  for (const auto& dev : j) {
    if (!dev.contains("ifname")) continue;
    auto& c = counts[dev["ifname"].get<std::string>()];
    for (const char* k : {"pd", "cq", "qp", "mr", "ctx"})
      if (dev.contains(k) && dev[k].is_number()) c[k] = dev[k].get<long>();
  }
  return counts;
}

}  // namespace

TEST_CASE("devices, ports and GIDs") {
  const auto names = two_devices();
  for (const auto& name : names) {
    auto ctx = take(v::context::open(name), "open");
    const auto dev = take(ctx.query_device(), "query_device");
    CHECK(dev.phys_port_cnt >= 1);
    const auto port = take(ctx.query_port(kPort), "query_port");
    CHECK(port.state == IBV_PORT_ACTIVE);
    CHECK(v::mtu_bytes(port.active_mtu) >= 256);
    const auto table = take(v::read_gid_table(name, kPort), "read_gid_table");
    CHECK_FALSE(table.empty());
    const int idx = take(v::select_gid_index(name, kPort), "select_gid_index");
    const auto g = take(ctx.query_gid(kPort, idx), "query_gid");
    // The sysfs table and the verbs query must agree on the chosen entry.
    bool found = false;
    for (const auto& e : table)
      if (e.index == idx) {
        found = true;
        CHECK(e.value == g);
      }
    CHECK(found);
    CHECK(take(v::parse_gid(g.to_string()), "parse_gid") == g);
    std::printf("%s: port %u ACTIVE, active_mtu %d, max_qp %d, max_mr_size %llu, GID[%d] %s (%zu GIDs)\n",
                name.c_str(), kPort, v::mtu_bytes(port.active_mtu), dev.max_qp,
                static_cast<unsigned long long>(dev.max_mr_size), idx, g.to_string().c_str(), table.size());
    // A port that does not exist is an error, not a crash.
    CHECK_FALSE(ctx.query_port(static_cast<std::uint8_t>(dev.phys_port_cnt + 1)));
    CHECK(ctx.query_port(0).error().code == errc::invalid_argument);
    CHECK_FALSE(ctx.next_async_event().has_value());
  }
  CHECK(v::context::open("tide-no-such-device").error().code == errc::device_not_found);
}

TEST_CASE("RDMA WRITE and READ across two devices, every byte checked") {
  const auto names = two_devices();
  auto a = open_side(names[0]);  // target of WRITEs, initiator of READs
  auto b = open_side(names[1]);
  connect(*a, *b);
  std::printf("connected %s qp %u <-> %s qp %u (path mtu %d, GID index %d/%d)\n", a->name.c_str(), a->qp.qp_num(),
              b->name.c_str(), b->qp.qp_num(), v::mtu_bytes(v::path_mtu(a->port.active_mtu, b->port.active_mtu)),
              a->gid_index, b->gid_index);

  constexpr std::array<std::size_t, 4> kSizes{1, 4096, 1u << 20, 16u << 20};
  constexpr std::size_t kGuard = 64;
  std::uint64_t checked = 0;
  std::uint64_t seed = 1;
  for (const auto op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
    const bool write = op == IBV_WR_RDMA_WRITE;
    side& init = write ? *b : *a;
    side& target = write ? *a : *b;
    for (std::size_t k = 0; k < kSizes.size(); ++k) {
      const std::size_t len = kSizes[k];
      // Offsets that are not multiples of 8, different on both ends.
      const std::size_t src_off = 4096 * (k + 1) + 3 + 2 * k;
      const std::size_t dst_off = 8192 * (k + 1) + 13 + 2 * k;
      side& src_side = write ? init : target;
      side& dst_side = write ? target : init;
      std::byte* src = src_side.base() + src_off;
      std::byte* dst = dst_side.base() + dst_off;
      for (std::size_t i = 0; i < len; ++i) src[i] = std::byte{pattern(i, seed)};
      std::memset(dst - kGuard, 0xA5, len + 2 * kGuard);

      ibv_wc wc{};
      const auto t0 = std::chrono::steady_clock::now();
      const errc e = write ? run_one(init, op, src, target.remote_base() + dst_off, target.mr.rkey(), len,
                                     std::chrono::seconds(120), wc)
                           : run_one(init, op, dst, target.remote_base() + src_off, target.mr.rkey(), len,
                                     std::chrono::seconds(120), wc);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      INFO((write ? "WRITE " : "READ ") << len << " bytes");
      REQUIRE_MESSAGE(e == errc::ok, (e == errc::timed_out ? std::string("timed out")
                                                            : v::wc_error(wc, init.name).message()));
      CHECK(wc.opcode == (write ? IBV_WC_RDMA_WRITE : IBV_WC_RDMA_READ));

      std::size_t bad = 0, first_bad = len;
      for (std::size_t i = 0; i < len; ++i)
        if (dst[i] != std::byte{pattern(i, seed)}) {
          if (bad++ == 0) first_bad = i;
        }
      std::size_t guard_bad = 0;
      for (std::size_t i = 1; i <= kGuard; ++i) {
        guard_bad += *(dst - i) != std::byte{0xA5};
        guard_bad += *(dst + len - 1 + i) != std::byte{0xA5};
      }
      CHECK_MESSAGE(bad == 0, bad << " wrong bytes, the first at " << first_bad);
      CHECK_MESSAGE(guard_bad == 0, guard_bad << " bytes written outside the target range");
      checked += len;
      std::printf("RDMA %s by %s: %s -> %s %9zu B (src +%zu, dst +%zu): %zu bytes checked, %zu wrong, %.3f s\n",
                  write ? "WRITE" : "READ ", init.name.c_str(), src_side.name.c_str(), dst_side.name.c_str(), len,
                  src_off, dst_off, len, bad, secs);
      ++seed;
    }
  }
  std::printf("checked %llu bytes in all between %s and %s\n", static_cast<unsigned long long>(checked),
              a->name.c_str(), b->name.c_str());
  CHECK(checked == 2 * (1 + 4096 + (1u << 20) + (16u << 20)));
}

TEST_CASE("a READ outside the peer's region completes with remote_access_error") {
  const auto names = two_devices();
  auto a = open_side(names[0]);
  auto b = open_side(names[1]);
  connect(*a, *b);
  // Crosses the end of b's region by 4000 bytes.
  const std::uint64_t remote = b->remote_base() + kRegion - 96;
  ibv_wc wc{};
  const auto t0 = std::chrono::steady_clock::now();
  const errc e = run_one(*a, IBV_WR_RDMA_READ, a->base(), remote, b->mr.rkey(), 4096, std::chrono::seconds(60), wc);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_MESSAGE(e != errc::timed_out, "no completion within 60 s");
  CHECK(e == errc::remote_access_error);
  CHECK(tide::group_of(e) == tide::errc_group::endpoint);
  const auto err = v::wc_error(wc, a->name);
  CHECK(err.code == e);
  std::printf("READ of %s [end-96, end+4000) from %s: %s after %.3f s\n", b->name.c_str(), a->name.c_str(),
              err.message().c_str(), secs);
  // The responder's QP fails too (rxe reports it with no async event).
  CHECK(take(b->qp.state(), "state") == IBV_QPS_ERR);
  // The failed QP is in ERR; new WRs complete flushed, immediately.
  CHECK(take(a->qp.state(), "state") == IBV_QPS_ERR);
  const errc again = run_one(*a, IBV_WR_RDMA_READ, a->base(), b->remote_base(), b->mr.rkey(), 64,
                             std::chrono::seconds(10), wc);
  CHECK((again == errc::work_request_flushed || again == errc::invalid_argument));
  // And the QP can be reset and walked up again (what an endpoint reconnect does).
  REQUIRE(a->qp.to_reset());
  CHECK(take(a->qp.state(), "state") == IBV_QPS_RESET);
  CHECK(a->qp.to_init(kPort));
}

TEST_CASE("completion channel: an armed CQ raises one event for a completion") {
  const auto names = two_devices();
  auto a = open_side(names[0]);
  auto b = open_side(names[1]);
  connect(*a, *b);
  // A second CQ on b, bound to a channel, behind a second QP pair.
  auto ch = take(v::completion_channel::create(b->ctx), "channel");
  auto cq = take(v::completion_queue::create(b->ctx, 16, &ch), "cq with channel");
  CHECK(cq.capacity() >= 16);
  auto qb = take(v::queue_pair::create(b->pd, cq, cq), "qp");
  auto qa = take(v::queue_pair::create(a->pd, a->cq, a->cq), "qp");
  const ibv_mtu mtu = v::path_mtu(a->port.active_mtu, b->port.active_mtu);
  REQUIRE(qa.to_init(kPort));
  REQUIRE(qb.to_init(kPort));
  REQUIRE(qa.to_rtr({qb.qp_num(), b->gid, b->port.lid, mtu, a->gid_index}));
  REQUIRE(qb.to_rtr({qa.qp_num(), a->gid, a->port.lid, mtu, b->gid_index}));
  REQUIRE(qb.to_rts());

  CHECK_FALSE(ch.try_get_event().has_value());  // nothing armed, nothing pending
  REQUIRE(cq.req_notify() == errc::ok);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(b->base()), 64, b->mr.lkey()};
  ibv_send_wr wr{};
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = a->remote_base();
  wr.wr.rdma.rkey = a->mr.rkey();
  REQUIRE(qb.post_send(&wr) == errc::ok);
  pollfd pfd{ch.fd(), POLLIN, 0};
  REQUIRE_MESSAGE(::poll(&pfd, 1, 30000) == 1, "no completion event within 30 s");
  const auto ev = ch.try_get_event();
  REQUIRE(ev.has_value());
  CHECK(*ev == cq.native_handle());
  cq.ack_events(1);
  std::array<ibv_wc, 4> wcs{};
  REQUIRE(cq.poll(wcs) == 1);
  CHECK(wcs[0].wr_id == 7);
  CHECK(wcs[0].status == IBV_WC_SUCCESS);
  // Not re-armed: a second completion raises no event.
  REQUIRE(qb.post_send(&wr) == errc::ok);
  int n = 0;
  for (int i = 0; i < 3000 && n == 0; ++i) n = cq.poll(wcs);
  CHECK(n == 1);
  CHECK_FALSE(ch.try_get_event().has_value());
  std::printf("%s: completion channel fd %d woke on an armed CQ, one event for two completions\n", b->name.c_str(),
              ch.fd());
  // qp before cq before channel: declaration order does it.
}

TEST_CASE("async events: a port going down and up again is reported") {
  // Taking a link down disturbs everything on it: only inside tide's own VM.
  if (std::getenv("RXE_VM") == nullptr) {
    std::printf("not in tools/rxe-vm: port events not provoked\n");
    return;
  }
  const auto name = two_devices()[1];
  auto ctx = take(v::context::open(name), "open");
  const auto table = take(v::read_gid_table(name, kPort), "read_gid_table");
  const int idx = take(v::select_gid_index(table, name, kPort), "select_gid_index");
  std::string netdev;
  for (const auto& e : table)
    if (e.index == idx) netdev = e.netdev;
  REQUIRE_FALSE(netdev.empty());
  // Waits up to 10 s for an event of `type`; the others seen are listed.
  auto wait_for = [&](ibv_event_type type) {
    std::string seen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (const auto ev = ctx.next_async_event()) {
        seen.append(ev->name()).append(" ");
        if (ev->type == type) return std::optional<v::async_event>(ev);
      } else {
        ::usleep(5000);
      }
    }
    INFO("events seen: " << seen);
    return std::optional<v::async_event>();
  };
  // Link down flushes the IPv4 routes on the netdev, among them the VM's policy
  // routes that keep rxe0 <-> rxe1 traffic on the veth pair: save and restore them.
  const std::string routes = "/tmp/tide-routes-" + netdev;
  const std::string down = "ip -o -4 route show table all dev " + netdev + " > " + routes + " && ip link set " +
                           netdev + " down";
  // Routes the kernel adds back by itself fail to replace: ignored.
  const std::string up = "ip link set " + netdev + " up && { while read -r r; do ip route replace $r dev " + netdev +
                         " 2>/dev/null; done < " + routes + "; true; }";
  REQUIRE(std::system(down.c_str()) == 0);
  const auto err = wait_for(IBV_EVENT_PORT_ERR);
  REQUIRE(std::system(up.c_str()) == 0);
  const auto active = wait_for(IBV_EVENT_PORT_ACTIVE);
  REQUIRE(err.has_value());
  CHECK(err->port_num == kPort);
  CHECK(err->severity() == errc::port_down);
  REQUIRE(active.has_value());
  CHECK(active->severity() == errc::ok);
  // The port is usable again before the next test case.
  for (int i = 0; i < 100 && take(ctx.query_port(kPort), "query_port").state != IBV_PORT_ACTIVE; ++i) ::usleep(50000);
  CHECK(take(ctx.query_port(kPort), "query_port").state == IBV_PORT_ACTIVE);
  // Traffic across the pair works again (later suites in this VM depend on it).
  {
    const auto names = two_devices();
    auto a = open_side(names[0]);
    auto b = open_side(names[1]);
    connect(*a, *b);
    for (std::size_t i = 0; i < 4096; ++i) b->base()[i] = std::byte{pattern(i, 7)};
    ibv_wc wc{};
    REQUIRE(run_one(*b, IBV_WR_RDMA_WRITE, b->base(), a->remote_base(), a->mr.rkey(), 4096, std::chrono::seconds(30),
                    wc) == errc::ok);
    CHECK(std::memcmp(a->base(), b->base(), 4096) == 0);
  }
  // Address changes that follow a link coming up show up as more events; drain them.
  std::string more;
  while (const auto ev = ctx.next_async_event()) more.append(" ").append(ev->name());
  std::printf("%s (%s) down/up: async events %s then %s on port %d; then:%s\n", name.c_str(), netdev.c_str(),
              std::string(err->name()).c_str(), std::string(active->name()).c_str(), err->port_num,
              more.empty() ? " none" : more.c_str());
}

TEST_CASE("destroying everything leaves no QP or MR behind") {
  const auto names = two_devices();
  const auto before = rdma_resources();
  if (!before) {
    std::printf("rdma tool (iproute2) not available: resource counts not checked\n");
    return;
  }
  {
    auto a = open_side(names[0]);
    auto b = open_side(names[1]);
    connect(*a, *b);
    const auto during = rdma_resources();
    REQUIRE(during);
    // The counting must see our objects, or its "nothing left" proves nothing.
    const long extra = names[0] == names[1] ? 2 : 1;
    for (const auto& n : {names[0], names[1]}) {
      INFO(n);
      CHECK(during->at(n).at("qp") == before->at(n).at("qp") + extra);
      CHECK(during->at(n).at("mr") == before->at(n).at("mr") + extra);
    }
    // Moving an owner transfers it; the moved-from one owns nothing.
    v::queue_pair moved = std::move(a->qp);
    CHECK(moved.native_handle() != nullptr);
    CHECK(a->qp.native_handle() == nullptr);
  }
  const auto after = rdma_resources();
  REQUIRE(after);
  for (const auto& n : {names[0], names[1]}) {
    for (const char* k : {"qp", "mr", "cq", "pd", "ctx"}) {
      INFO(n << " " << k);
      CHECK(after->at(n).at(k) == before->at(n).at(k));
    }
    std::printf("%s after teardown: qp %ld, mr %ld, cq %ld, pd %ld (as before)\n", n.c_str(), after->at(n).at("qp"),
                after->at(n).at("mr"), after->at(n).at("cq"), after->at(n).at("pd"));
  }
}
