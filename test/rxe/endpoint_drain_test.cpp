// rdma::endpoint's drain marker on real devices (review turn 3, finding 10).
// When a post is only partly accepted, the prefix's last WR may be unsignaled.
// If the whole prefix completes before the QP reaches ERR, no completion ever
// names it, and the ring kept its entries for good: the credits leaked and the
// tasks never became final. The ring here ends in such a WR (an entry no
// completion will name), the QP goes to ERR, and the signaled marker posted
// behind it must flush and take the entry out.
#include <tide/rdma/detail/batch.hpp>
#include <tide/rdma/endpoint.hpp>
#include <tide/verbs/cq.hpp>
#include <tide/verbs/device.hpp>
#include <tide/verbs/gid.hpp>
#include <tide/verbs/pd.hpp>

#include "devices_under_test.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace v = tide::verbs;
namespace r = tide::rdma;
using tide::errc;

namespace {

constexpr std::uint8_t kPort = 1;

template <class T>
T take(tide::result<T> x, const char* what) {
  INFO(what);
  REQUIRE_MESSAGE(x.has_value(), (x ? std::string() : x.error().message()));
  return std::move(*x);
}

// One end: a device, its PD and CQ, and one endpoint with one QP. Members in
// construction order, so they go in the order verbs needs (QP, CQ, PD, device).
struct end {
  std::string device;
  v::context ctx;
  ibv_port_attr port;
  int gid_index;
  v::gid gid;
  v::protection_domain pd;
  std::shared_ptr<v::completion_queue> cq;
  std::unique_ptr<r::endpoint> ep;
};

std::unique_ptr<end> open_end(const std::string& device, const std::string& peer_device) {
  auto ctx = take(v::context::open(device), "open");
  const auto port = take(ctx.query_port(kPort), "query_port");
  const int gid_index = take(v::select_gid_index(device, kPort), "select_gid_index");
  const auto gid = take(ctx.query_gid(kPort, gid_index), "query_gid");
  auto pd = take(v::protection_domain::create(ctx), "pd");
  auto cq = std::make_shared<v::completion_queue>(take(v::completion_queue::create(ctx, 64), "cq"));
  auto e = std::unique_ptr<end>(
      new end{device, std::move(ctx), port, gid_index, gid, std::move(pd), std::move(cq), nullptr});
  r::endpoint_params p;
  p.pd = &e->pd;
  p.local_nic_path = "127.0.0.1:1@" + device;
  p.port = kPort;
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

void connect(end& a, const end& b) {
  r::peer_route route;
  route.base.dgid = b.gid;
  route.base.lid = b.port.lid;
  route.base.path_mtu = v::path_mtu(a.port.active_mtu, b.port.active_mtu);
  route.base.sgid_index = a.gid_index;
  route.qp_num = {b.ep->qp_num(0)};
  route.rq_psn = {0};
  auto s = a.ep->lane_connect(0, route);
  REQUIRE_MESSAGE(s, (s ? "" : s.error().message()));
}

// The first completion on `e`'s CQ within 10 s, or none.
bool next_completion(end& e, ibv_wc& wc) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until)
    if (e.cq->poll({&wc, 1}) == 1) return true;
  return false;
}

}  // namespace

TEST_CASE("a QP in ERR whose ring ends in a WR without a completion empties through its drain marker") {
  const auto devs = tide::test::devices_under_test();
  REQUIRE(devs.size() >= 2);
  auto a = open_end(devs[0], devs[1]);
  auto b = open_end(devs[1], devs[0]);
  connect(*a, *b);
  connect(*b, *a);
  r::endpoint& ep = *a->ep;
  r::lane_qp& lane = ep.lane(0);

  // Nothing in the ring: no marker is needed.
  ep.lane_error(0);
  CHECK(ep.post_drain_marker(0) == r::drain_post::not_needed);
  connect(*a, *b);  // back to RTS (lane_connect resets the QP first)

  // A WR the QP took and completed without a completion of its own: the
  // unsignaled end of a partly accepted post.
  tide::rdma::detail::slice silent;
  CHECK(ep.sq_room(0) == 16);
  lane.ring.push(&silent);
  ep.hold();  // as post() counts a posted WR
  ep.lane_error(0);
  REQUIRE(ep.post_drain_marker(0) == r::drain_post::posted);
  CHECK(ep.post_drain_marker(0) == r::drain_post::not_needed);  // once per ERR

  ibv_wc wc{};
  REQUIRE_MESSAGE(next_completion(*a, wc), "no completion for the drain marker within 10 s");
  auto* s = reinterpret_cast<tide::rdma::detail::slice*>(wc.wr_id);
  CHECK(s == &lane.drain);
  CHECK(wc.status == IBV_WC_WR_FLUSH_ERR);
  REQUIRE(ep.in_ring(0, s));
  tide::rdma::detail::slice* unknown = nullptr;
  CHECK(ep.complete_through(0, s, &unknown) == 2);
  CHECK(unknown == &silent);  // handed back to be redone, as the lane does with a flush
  CHECK(lane.ring.empty());
  ep.release(2);
  CHECK(ep.outstanding() == 0);
}
