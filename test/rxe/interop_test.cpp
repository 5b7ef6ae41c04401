// Mooncake wire-compatibility gaps that need a real engine (http metadata
// mode, against tide's own metadata server in this process):
//  - a Connection request with `local_gid: ""` is accepted and the GID taken
//    from the requester's published devices[] (Mooncake's passive side does
//    this), proven by an RDMA WRITE from hand-made QPs into the engine's
//    buffer; a device or segment that is not published gets a reply_msg;
//  - the engine publishes rpc_meta/<server name> and withdraws it.
//
// Devices: $TIDE_TEST_DEVICES or $RXE_VM_DEVICES ("rxe0 rxe1"), else the
// first two (the same one twice when there is only one).  The engine uses
// the first, the hand-made client the second, GID index 1 (RoCEv2 IPv4 in
// the VM).
#include <doctest/doctest.h>

#include <tide/engine.hpp>
#include <tide/metadata/http_metadata_server.hpp>
#include <tide/net/handshake_client.hpp>
#include <tide/policy/http.hpp>
#include <tide/verbs/device.hpp>

#include "devices_under_test.hpp"

#include <infiniband/verbs.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

struct http_policies : tide::default_policies {
  using metadata = tide::policy::http;
};
using engine_type = tide::transfer_engine<http_policies>;

using tide::test::devices_under_test;

struct fixture {
  fixture() {
    auto s = tide::http_metadata_server::start({.host = "127.0.0.1", .port = 0});
    REQUIRE_MESSAGE(s.has_value(), s.error());
    server.emplace(std::move(*s));
    meta.connection = "http://127.0.0.1:" + std::to_string(server->port()) + "/metadata";
    devices = devices_under_test();
    REQUIRE(devices.size() >= 2);
  }
  std::unique_ptr<engine_type> engine(std::string cluster_id = {}) {
    tide::engine_config c;
    c.local_server_name = "127.0.0.1";
    c.metadata = meta.connection;
    c.cluster_id = std::move(cluster_id);
    c.devices = {devices[0]};
    c.transports = "rdma";  // Mooncake's RDMA transport on the other side
    c.transfer_timeout = 60s;
    auto e = engine_type::create(c);
    REQUIRE_MESSAGE(e.has_value(), e.error());
    return std::move(*e);
  }
  std::optional<tide::http_metadata_server> server;
  tide::metadata_config meta;
  std::vector<std::string> devices;
};

// Two RC QPs and a 4 KiB MR on one device, with raw libibverbs, as a
// Mooncake peer would make them.  Every step REQUIREs.
struct raw_client {
  static constexpr std::size_t kBuf = 4096;
  static constexpr int kGidIndex = 1;

  explicit raw_client(const std::string& device) {
    int n = 0;
    ibv_device** list = ::ibv_get_device_list(&n);
    REQUIRE(list != nullptr);
    for (int i = 0; i < n; ++i)
      if (device == ::ibv_get_device_name(list[i])) ctx = ::ibv_open_device(list[i]);
    ::ibv_free_device_list(list);
    REQUIRE_MESSAGE(ctx != nullptr, "ibv_open_device " << device);
    REQUIRE((pd = ::ibv_alloc_pd(ctx)) != nullptr);
    REQUIRE((cq = ::ibv_create_cq(ctx, 64, nullptr, nullptr, 0)) != nullptr);
    buf = static_cast<char*>(std::aligned_alloc(4096, kBuf));
    REQUIRE(buf != nullptr);
    REQUIRE((mr = ::ibv_reg_mr(pd, buf, kBuf, kAccess)) != nullptr);
    for (auto& qp : qps) {
      ibv_qp_init_attr init{};
      init.send_cq = cq;
      init.recv_cq = cq;
      init.cap.max_send_wr = 16;
      init.cap.max_recv_wr = 1;
      init.cap.max_send_sge = 1;
      init.cap.max_recv_sge = 1;
      init.qp_type = IBV_QPT_RC;
      REQUIRE((qp = ::ibv_create_qp(pd, &init)) != nullptr);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qp_access_flags = kAccess;
      REQUIRE(::ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    }
    REQUIRE(::ibv_query_port(ctx, 1, &port) == 0);
    REQUIRE(::ibv_query_gid(ctx, 1, kGidIndex, &gid) == 0);
  }
  ~raw_client() {
    for (auto* qp : qps)
      if (qp != nullptr) ::ibv_destroy_qp(qp);
    if (mr != nullptr) ::ibv_dereg_mr(mr);
    if (cq != nullptr) ::ibv_destroy_cq(cq);
    if (pd != nullptr) ::ibv_dealloc_pd(pd);
    if (ctx != nullptr) ::ibv_close_device(ctx);
    std::free(buf);
  }
  raw_client(const raw_client&) = delete;

  std::vector<std::uint32_t> qp_nums() const { return {qps[0]->qp_num, qps[1]->qp_num}; }

  // RTR/RTS against the engine's reply, with Mooncake's attributes (§5).
  void connect(const tide::handshake_desc& reply) {
    REQUIRE(reply.local_gid.has_value());
    REQUIRE(reply.qp_num.size() == 2);
    for (std::size_t i = 0; i < 2; ++i) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = port.active_mtu;
      a.dest_qp_num = reply.qp_num[i];
      a.max_dest_rd_atomic = 16;
      a.min_rnr_timer = 12;
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, reply.local_gid->raw.data(), 16);
      a.ah_attr.grh.sgid_index = kGidIndex;
      a.ah_attr.grh.hop_limit = 16;
      a.ah_attr.dlid = reply.local_lid;
      a.ah_attr.port_num = 1;
      REQUIRE(::ibv_modify_qp(qps[i], &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
      a = {};
      a.qp_state = IBV_QPS_RTS;
      a.timeout = 14;
      a.retry_cnt = 6;
      a.rnr_retry = 7;
      a.max_rd_atomic = 16;
      REQUIRE(::ibv_modify_qp(qps[i], &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                  IBV_QP_MAX_QP_RD_ATOMIC) == 0);
    }
  }

  // One signaled RDMA WRITE of the whole buffer; returns the completion status
  // (or -1 when none arrives within 30 s).
  int write(std::size_t qp, std::uint64_t remote_addr, std::uint32_t rkey) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(buf), kBuf, mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    REQUIRE(::ibv_post_send(qps[qp], &wr, &bad) == 0);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    ibv_wc wc{};
    while (std::chrono::steady_clock::now() < deadline) {
      const int n = ::ibv_poll_cq(cq, 1, &wc);
      REQUIRE(n >= 0);
      if (n == 1) return static_cast<int>(wc.status);
      std::this_thread::sleep_for(1ms);
    }
    return -1;
  }

  static constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  ibv_qp* qps[2] = {nullptr, nullptr};
  ibv_port_attr port{};
  ibv_gid gid{};
  char* buf = nullptr;
};

// The client's segment as a Mooncake peer publishes it: devices[] with names
// (the NIC-path suffixes) and the GID to address.
void publish_client(tide::policy::http& store, const std::string& name, const raw_client& c,
                    const std::vector<std::string>& device_names) {
  tide::segment_desc d;
  d.name = name;
  for (const auto& dn : device_names) {
    tide::device_desc dev;
    dev.name = dn;
    std::memcpy(dev.gid.raw.data(), c.gid.raw, 16);
    d.devices.push_back(dev);
  }
  d.priority["cpu:0"] = tide::priority_entry{{device_names.front()}, {}};
  d.timestamp = tide::current_timestamp();
  REQUIRE(store.put_segment(name, tide::encode_segment(d)).has_value());
}

tide::handshake_desc request_from(const std::string& client_path, const engine_type& e, const std::string& dev,
                                  const raw_client& c) {
  tide::handshake_desc r;
  r.local_nic_path = client_path;
  r.peer_nic_path = e.segment_name() + "@" + dev;
  r.qp_num = c.qp_nums();
  r.ready_ack = false;  // local_gid stays empty: JSON ""
  return r;
}

// The reply_msg of a rejected request: exchange_handshake returns it as
// handshake_rejected with the detail "<host>:<port>: <reply_msg>".
std::string rejection(const tide::result<tide::handshake_desc>& r, std::uint16_t port) {
  REQUIRE_MESSAGE(!r.has_value(), "accepted, reply_msg empty");
  CHECK(r.error().code == tide::errc::handshake_rejected);
  const std::string prefix = "127.0.0.1:" + std::to_string(port) + ": ";
  REQUIRE(r.error().detail.starts_with(prefix));
  return r.error().detail.substr(prefix.size());
}

}  // namespace

TEST_CASE("a Connection request with local_gid \"\" takes the GID from the requester's devices[]") {
  fixture f;
  auto e = f.engine();
  raw_client client(f.devices[1]);
  tide::policy::http store(f.meta);
  const std::string seg = "127.0.0.1:40001";  // a Mooncake peer's server name
  publish_client(store, seg, client, {f.devices[1]});

  std::vector<unsigned char> target(raw_client::kBuf, 0);
  REQUIRE(e->register_memory(target.data(), target.size(), "cpu:0").has_value());
  const auto local = e->transport().local_segment();
  REQUIRE(local.buffers.size() == 1);
  const std::uint32_t rkey = local.buffers[0].rkey.at(0);

  auto req = request_from(seg + "@" + f.devices[1], *e, f.devices[0], client);
  CHECK(tide::encode_handshake(req).find("\"local_gid\":\"\"") != std::string::npos);
  auto reply = tide::net::exchange_handshake("127.0.0.1", e->handshake_port(), req);
  REQUIRE_MESSAGE(reply.has_value(), reply.error());
  INFO("reply_msg: " << reply->reply_msg);
  REQUIRE(reply->reply_msg.empty());
  CHECK(reply->local_nic_path == req.peer_nic_path);
  CHECK(reply->peer_nic_path == req.local_nic_path);
  CHECK(reply->qp_num.size() == 2);
  CHECK(reply->ready_ack.has_value());

  client.connect(*reply);
  // The ack is answered "" only by an endpoint that accepted our QPs.
  auto ack = req;
  ack.ready_ack = true;
  auto ack_reply = tide::net::exchange_handshake("127.0.0.1", e->handshake_port(), ack);
  REQUIRE_MESSAGE(ack_reply.has_value(), ack_reply.error());
  CHECK(ack_reply->reply_msg == "");

  // The engine's QPs address the GID it looked up: a WRITE on each of ours
  // lands (a wrong GID would leave it unacknowledged until retries ran out).
  for (std::size_t qp = 0; qp < 2; ++qp) {
    std::memset(client.buf, static_cast<int>(0x5a + qp), raw_client::kBuf);
    CHECK(client.write(qp, reinterpret_cast<std::uintptr_t>(target.data()), rkey) == IBV_WC_SUCCESS);
    CHECK(std::memcmp(target.data(), client.buf, raw_client::kBuf) == 0);
  }

  // A device published after the engine cached the segment is found by the
  // one forced refresh.
  auto id = e->open_segment(seg);  // caches devices[] without "late0"
  REQUIRE_MESSAGE(id.has_value(), id.error());
  publish_client(store, seg, client, {f.devices[1], "late0"});
  raw_client second(f.devices[1]);
  auto late = request_from(seg + "@late0", *e, f.devices[0], second);
  auto r = tide::net::exchange_handshake("127.0.0.1", e->handshake_port(), late);
  REQUIRE_MESSAGE(r.has_value(), r.error());
  CHECK(r->reply_msg == "");
  CHECK(r->qp_num.size() == 2);
  auto d = e->segment_descriptor(*id);
  REQUIRE(d.has_value());
  CHECK((*d)->devices.size() == 2);  // the refresh reached the user's view too
  CHECK(e->close_segment(*id).has_value());
  CHECK(e->unregister_memory(target.data()).has_value());
}

TEST_CASE("a Connection request with local_gid \"\" and no published GID is rejected with a reason") {
  fixture f;
  auto e = f.engine();
  raw_client client(f.devices[1]);
  tide::policy::http store(f.meta);
  const std::string seg = "127.0.0.1:40002";
  publish_client(store, seg, client, {f.devices[1]});

  const auto t0 = std::chrono::steady_clock::now();
  const auto port = e->handshake_port();
  auto absent = request_from(seg + "@nosuchdev", *e, f.devices[0], client);
  std::string msg = rejection(tide::net::exchange_handshake("127.0.0.1", port, absent), port);
  MESSAGE("absent device: " << msg);
  CHECK(msg == "Invalid peer GID: " + seg + "@nosuchdev not found in segment " + seg);

  auto unknown = request_from("127.0.0.1:40999@" + f.devices[1], *e, f.devices[0], client);
  msg = rejection(tide::net::exchange_handshake("127.0.0.1", port, unknown), port);
  MESSAGE("unpublished segment: " << msg);
  CHECK(msg.starts_with("Invalid peer GID: cannot read segment 127.0.0.1:40999: "));

  auto no_at = request_from("no-device-part", *e, f.devices[0], client);
  msg = rejection(tide::net::exchange_handshake("127.0.0.1", port, no_at), port);
  MESSAGE("no device part: " << msg);
  CHECK(msg.starts_with("Invalid peer GID: "));
  // Each answer took a bounded number of metadata round trips, not a hang.
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);

  // The engine still accepts a well-formed request afterwards.
  auto good = request_from(seg + "@" + f.devices[1], *e, f.devices[0], client);
  auto r = tide::net::exchange_handshake("127.0.0.1", port, good);
  REQUIRE_MESSAGE(r.has_value(), r.error());
  CHECK(r->reply_msg == "");
  CHECK(r->qp_num.size() == 2);
}

TEST_CASE("http mode: the engine publishes rpc_meta/<server name> and withdraws it") {
  fixture f;
  tide::policy::http store(f.meta);
  for (const std::string cluster : {"", "prod"}) {
    CAPTURE(cluster);
    auto e = f.engine(cluster);
    const std::string key = tide::rpc_meta_key(cluster, e->segment_name());
    auto v = store.get_key(key);
    REQUIRE_MESSAGE(v.has_value(), v.error());
    MESSAGE(key << " = " << *v);
    const auto j = nlohmann::json::parse(*v);
    CHECK(j.size() == 2);
    CHECK(j.at("ip_or_host_name") == "127.0.0.1");
    REQUIRE(j.at("rpc_port").is_number_unsigned());
    CHECK(j.at("rpc_port").get<unsigned>() == e->handshake_port());
    e.reset();
    CHECK(store.get_key(key).error().code == tide::errc::segment_not_found);
  }
}
