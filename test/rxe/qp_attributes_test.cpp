// The traffic class, service level and P_Key index of the RC QPs (Mooncake's
// MC_IB_TC, MC_IB_SL, MC_PKEY_INDEX; engine_config::ib_traffic_class,
// ib_service_level, pkey_index), on real devices: an endpoint's QPs carry them
// after a handshake, an engine configured with them moves bytes and says so,
// and a P_Key index outside the port's table is refused at create.
#include <tide/log.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/verbs/cq.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/pd.hpp>

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace v = tide::verbs;
namespace r = tide::rdma;

namespace {

constexpr std::uint8_t kPort = 1;

template <class T>
T take(tide::result<T> x, const char* what) {
  INFO(what);
  REQUIRE_MESSAGE(x.has_value(), (x ? std::string() : x.error().message()));
  return std::move(*x);
}

// One end: a device, its PD and CQ, one endpoint with one QP (members in the
// order verbs needs them destroyed: QP, CQ, PD, device).
struct end {
  v::context ctx;
  ibv_port_attr port;
  v::protection_domain pd;
  std::shared_ptr<v::completion_queue> cq;
  std::unique_ptr<r::endpoint> ep;
};

std::unique_ptr<end> open_end(const std::string& device, const std::string& peer_device, std::uint8_t tc,
                              std::uint8_t sl, std::uint16_t pkey_index) {
  auto ctx = take(v::context::open(device), "open");
  const auto port = take(ctx.query_port(kPort), "query_port");
  const int gid_index = take(v::select_gid_index(device, kPort), "select_gid_index");
  const auto gid = take(ctx.query_gid(kPort, gid_index), "query_gid");
  auto pd = take(v::protection_domain::create(ctx), "pd");
  auto cq = std::make_shared<v::completion_queue>(take(v::completion_queue::create(ctx, 64), "cq"));
  auto e = std::unique_ptr<end>(new end{std::move(ctx), port, std::move(pd), std::move(cq), nullptr});
  r::endpoint_params p;
  p.pd = &e->pd;
  p.local_nic_path = "127.0.0.1:1@" + device;
  p.port = kPort;
  p.traffic_class = tc;
  p.service_level = sl;
  p.pkey_index = pkey_index;
  p.gid_index = gid_index;
  p.local_gid = gid;
  p.lid = port.lid;
  p.mtu = port.active_mtu;
  p.num_qp = 1;
  p.caps.max_send_wr = 16;
  p.caps.max_recv_wr = 1;
  p.caps.max_send_sge = 1;
  p.caps.max_recv_sge = 1;
  const std::shared_ptr<v::completion_queue> cqs[] = {e->cq};
  e->ep = take(r::endpoint::create(p, cqs, "127.0.0.1:2@" + peer_device), "endpoint");
  return e;
}

}  // namespace

TEST_CASE("an endpoint's QPs carry the configured traffic class, service level and P_Key index") {
  const auto devs = tide::test::devices_under_test();
  REQUIRE(devs.size() >= 1);
  const std::string da = devs[0], db = devs.size() > 1 ? devs[1] : devs[0];
  auto a = open_end(da, db, 106, 3, 0);
  auto b = open_end(db, da, 0, 0, 0);
  // The route each side computes from the other's handshake, as a connect does.
  auto to_b = take(a->ep->route_to(b->ep->local_desc(false)), "route a -> b");
  auto to_a = take(b->ep->route_to(a->ep->local_desc(false)), "route b -> a");
  CHECK(to_b.base.traffic_class == 106);
  CHECK(to_b.base.service_level == 3);
  REQUIRE(a->ep->lane_connect(0, to_b));
  REQUIRE(b->ep->lane_connect(0, to_a));

  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  REQUIRE(::ibv_query_qp(a->ep->native_qp(0), &attr, IBV_QP_AV | IBV_QP_PKEY_INDEX | IBV_QP_STATE, &init) == 0);
  CHECK(attr.qp_state == IBV_QPS_RTS);
  CHECK(int(attr.ah_attr.grh.traffic_class) == 106);
  // The SL went into the same modify (to_rtr); Soft-RoCE keeps no SL in its
  // address vector (RoCE has none), so it is not read back here.
  CHECK(attr.pkey_index == 0);
  REQUIRE(::ibv_query_qp(b->ep->native_qp(0), &attr, IBV_QP_AV, &init) == 0);
  CHECK(int(attr.ah_attr.grh.traffic_class) == 0);
}

TEST_CASE("engines with a traffic class and service level move bytes and log what each device uses") {
  using namespace tide;
  const auto devs = test::devices_under_test();
  REQUIRE(devs.size() >= 1);
  std::mutex mu;
  std::vector<std::string> lines;
  set_log_level(log_level::info);
  set_log_sink([&](log_level, std::string_view m) {
    std::lock_guard lock(mu);
    lines.emplace_back(m);
  });
  {
    auto c = test::config_for({devs[0]});
    c.ib_traffic_class = 106;
    c.ib_service_level = 3;
    auto target = test::make_engine(c);
    c.devices = {devs.size() > 1 ? devs[1] : devs[0]};
    auto initiator = test::make_engine(c);
    test::buffer src(65536), dst(65536);
    test::fill(src.data, src.size, 34);
    REQUIRE(target->register_memory(dst.data, dst.size));
    REQUIRE(initiator->register_memory(src.data, src.size));
    auto seg = initiator->open_segment(target->segment_name());
    REQUIRE(seg);
    REQUIRE(test::run_one(*initiator, transfer_request::in_buffer(transfer_op::write, src.data, *seg, 0, 0, src.size)));
    CHECK(std::memcmp(src.data, dst.data, src.size) == 0);
  }
  set_log_sink({});
  set_log_level(log_level::warn);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  INFO(all);
  CHECK(all.find(": opened port 1 as 127.0.0.1:") != std::string::npos);
  CHECK(all.find("traffic class 106, SL 3, P_Key index 0") != std::string::npos);
  CHECK(all.find("configuration: defaults; program: ") != std::string::npos);
  CHECK(all.find("transports: rdma on 1 device(s)") != std::string::npos);
}

TEST_CASE("a P_Key index outside the port's table is refused at create, naming it") {
  using namespace tide;
  const auto devs = test::devices_under_test();
  REQUIRE(devs.size() >= 1);
  auto c = test::config_for({devs[0]});
  c.pkey_index = 65535;
  auto e = transfer_engine<>::create(c);
  REQUIRE_FALSE(e);
  CHECK(e.error().code == errc::config_invalid);
  CHECK(e.error().detail.find("pkey_index 65535: port 1 of " + devs[0] + " has a P_Key table of") != std::string::npos);
}
