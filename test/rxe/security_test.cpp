// The attack suite against real engines on Soft-RoCE (p2p mode, one process,
// engine A on the first device, peers on the second):
//  - a stranger's connect gets no QP (counted with `rdma resource show qp`);
//    without the secret the same request gets one (today's behaviour);
//  - peers sharing the secret transfer; a wrong secret gets auth_failed and
//    the target counts the refusal;
//  - buffer access: WRITE into a read-only peer buffer refused at submit,
//    local_only buffers absent from the descriptor, and a WRITE forced past
//    the check (a forged descriptor) fails with remote_access_error on the
//    NIC, the target bytes unchanged;
//  - with the secret, a WRITE by buffer id lands in that buffer after an
//    unregister and past a local_only buffer (ids survive sealing);
//  - with the secret, a member cannot connect another's NIC path, and its
//    notify is queued under its own identity whatever name it claims;
//  - concurrent register/unregister: the stored descriptor lists exactly
//    what is registered;
//  - an empty-GID connect naming a host makes no outbound connection;
//  - probe: live ok (timed, printed), wrong secret auth_failed, dead peer
//    peer_unreachable within the timeout, no QP made;
//  - the cost of authentication: open_segment + first transfer timed with
//    and without the secret (printed; never asserted).
#include <doctest/doctest.h>

#include <tide/engine.hpp>
#include <tide/net/handshake_client.hpp>

#include "devices_under_test.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tide::errc;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;
using engine = tide::transfer_engine<>;

std::string secret_file(char seed) {
  char path[] = "/tmp/tide-sec-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::string bytes(32, '\0');
  std::mt19937 g(static_cast<unsigned>(seed));
  for (auto& b : bytes) b = static_cast<char>(g());
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == 32);
  ::close(fd);  // mkstemp made it 0600
  return path;
}

std::unique_ptr<engine> make(const std::string& device, const std::string& secret = "") {
  tide::engine_config c;
  c.local_server_name = "127.0.0.1";
  c.devices = {device};
  c.transports = "rdma";
  c.transfer_timeout = 20s;
  c.max_retry = 0;
  c.auth_secret_file = secret;
  auto e = engine::create(c);
  if (!e) FAIL("create: " << e.error().message());
  return std::move(*e);
}

struct buffer {
  explicit buffer(std::size_t n, unsigned char fill = 0)
      : size(n), data(static_cast<unsigned char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    std::memset(data, fill, n);
  }
  ~buffer() { std::free(data); }
  buffer(const buffer&) = delete;
  std::size_t size;
  unsigned char* data;
};

// RC QPs on `device`, from the kernel (`rdma resource show qp`; only this
// test process makes RC QPs in the VM); -1 when rdma(8) is missing.
int kernel_qps(const std::string& device) {
  const std::string cmd = "rdma resource show qp 2>/dev/null | grep 'link " + device + "/' | grep -c 'type RC'";
  int n = -1;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    if (std::fscanf(p, "%d", &n) != 1) n = -1;
    ::pclose(p);
  }
  return n;
}

std::string kernel_qp_listing() {
  std::string out;
  if (FILE* p = ::popen("rdma resource show qp 2>&1", "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    ::pclose(p);
  }
  return out;
}

// What a stranger sends: a connect with made-up QPNs from a host on the
// RDMA network (the second device's GID, so that RTR can resolve it).
tide::handshake_desc stranger_connect(engine& target, const std::string& device, const tide::gid_bytes& gid) {
  tide::handshake_desc req;
  req.local_nic_path = "10.47.0.99:16666@evil0";
  req.peer_nic_path = target.segment_name() + "@" + device;
  req.local_gid = gid;
  req.qp_num = {0x1234, 0x1235};
  req.ready_ack = false;
  return req;
}

tide::net::request_options quick(std::shared_ptr<const tide::wire::cluster_secret> s = nullptr) {
  tide::net::request_options o;
  o.connect_timeout = 3s;
  o.receive_timeout = 10s;
  o.secret = std::move(s);
  o.identity = "10.47.0.99:16666";
  return o;
}

tide::transfer_status run(engine& e, const transfer_request& r) {
  auto b = e.allocate_batch(1).value();
  auto s = e.submit(b, {&r, 1});
  REQUIRE_MESSAGE(s.has_value(), s.error());
  CHECK(e.wait(b, 30s).has_value());
  auto st = e.status_of(b, 0).value();
  (void)e.free_batch(b);
  return st;
}

}  // namespace

TEST_CASE("a stranger's connect gets no QP with the secret; without it, it gets one (Mooncake's model)") {
  const auto devs = tide::test::devices_under_test();
  const std::string key = secret_file('k');
  const tide::gid_bytes gid = make(devs[1])->transport().local_segment().devices.at(0).gid;
  {
    auto a = make(devs[0], key);
    const int before = kernel_qps(devs[0]);
    auto r = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), stranger_connect(*a, devs[0], gid), quick());
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::auth_failed);
    // A stranger holding a guessed secret fares no better.
    auto wrong = tide::wire::cluster_secret::from_bytes(std::string(32, 'g')).value();
    auto w = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), stranger_connect(*a, devs[0], gid),
                                           quick(wrong));
    REQUIRE_FALSE(w.has_value());
    CHECK(w.error().code == errc::auth_failed);
    auto meta = tide::net::fetch_metadata("127.0.0.1", a->handshake_port(), quick());
    CHECK(meta.error().code == errc::auth_failed);
    const int after = kernel_qps(devs[0]);
    MESSAGE("with the secret: the kernel lists " << before << " QP(s) before the stranger's connect, " << after
                                                 << " after; refusals counted: " << a->handshake_stats().auth_failed);
    CHECK(a->handshake_stats().auth_failed == 3);
    CHECK(a->transport().context(0).live_endpoints() == 0);
    if (before >= 0) CHECK(after == before);
  }
  {
    auto a = make(devs[0]);
    const int before = kernel_qps(devs[0]);
    auto r = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), stranger_connect(*a, devs[0], gid), quick());
    const int after = kernel_qps(devs[0]);
    MESSAGE("without the secret: " << before << " QP(s) before, " << after << " after; reply "
                                   << (r ? "accepted" : r.error().message()) << "\n" << kernel_qp_listing());
    REQUIRE_MESSAGE(r.has_value(), r.error());
    CHECK(r->qp_num.size() == 2);
    CHECK(a->transport().context(0).live_endpoints() == 1);
    if (before >= 0) CHECK(after == before + 2);
  }
  ::unlink(key.c_str());
}

TEST_CASE("peers sharing the secret transfer; a wrong secret gets auth_failed on both sides") {
  const auto devs = tide::test::devices_under_test();
  const std::string key = secret_file('k');
  const std::string other = secret_file('o');
  auto a = make(devs[0], key);
  auto b = make(devs[1], key);
  auto c = make(devs[1], other);
  buffer target(1 << 16), src(1 << 16, 0x3c), back(1 << 16);
  REQUIRE(a->register_memory(target.data, target.size, "cpu:0").has_value());
  REQUIRE(b->register_memory(src.data, src.size, "cpu:0").has_value());
  REQUIRE(b->register_memory(back.data, back.size, "cpu:0").has_value());

  auto id = b->open_segment(a->segment_name());
  REQUIRE_MESSAGE(id.has_value(), id.error());
  auto desc = b->segment_descriptor(*id).value();
  REQUIRE(desc->buffers.size() == 1);
  CHECK(desc->buffers[0].addr == reinterpret_cast<std::uint64_t>(target.data));  // opened transparently
  auto st = run(*b, transfer_request::in_buffer(transfer_op::write, src.data, *id, 0, 0, src.size));
  CHECK(st.state == transfer_state::completed);
  CHECK(std::memcmp(target.data, src.data, src.size) == 0);
  st = run(*b, transfer_request::in_buffer(transfer_op::read, back.data, *id, 0, 0, back.size));
  CHECK(st.state == transfer_state::completed);
  CHECK(std::memcmp(back.data, src.data, back.size) == 0);
  REQUIRE(b->send_notify(*id, "sealed and delivered").has_value());
  auto got = a->take_notifies();
  REQUIRE(got.size() == 1);
  CHECK(got[0].name == b->segment_name());

  const auto refused = a->handshake_stats().auth_failed;
  auto no = c->open_segment(a->segment_name());
  REQUIRE_FALSE(no.has_value());
  MESSAGE("wrong secret: " << no.error().message());
  CHECK(no.error().code == errc::auth_failed);
  CHECK(a->handshake_stats().auth_failed == refused + 1);
  CHECK(b->close_segment(*id).has_value());
  ::unlink(key.c_str());
  ::unlink(other.c_str());
}

// Review turn 3, finding 1: sealed descriptors dropped the buffer ids, so
// an id fell back to the index and a WRITE by id landed in another buffer.
TEST_CASE("with the secret, a WRITE by id lands in that buffer after an unregister and past a local_only buffer") {
  const auto devs = tide::test::devices_under_test();
  const std::string key = secret_file('k');
  auto a = make(devs[0], key);
  auto b = make(devs[1], key);
  buffer x(8192, 0x01), y(8192, 0x02), z(8192, 0x03), src(8192, 0x5a);
  REQUIRE(a->register_memory(x.data, x.size, "cpu:0").has_value());
  REQUIRE(a->register_memory(y.data, y.size, "cpu:0").has_value());
  REQUIRE(a->register_memory(z.data, z.size, "cpu:0").has_value());
  REQUIRE(b->register_memory(src.data, src.size, "cpu:0").has_value());
  const std::uint32_t y_id = a->buffer_id(y.data).value();
  REQUIRE(a->unregister_memory(x.data).has_value());
  REQUIRE(y_id != 0);  // so that index and id differ once X is gone

  auto id = b->open_segment(a->segment_name());
  REQUIRE_MESSAGE(id.has_value(), id.error());
  auto desc = b->segment_descriptor(*id).value();
  REQUIRE(desc->buffers.size() == 2);
  CHECK(desc->buffers[0].id == std::optional<std::uint32_t>(y_id));
  auto st = run(*b, transfer_request::in_buffer(transfer_op::write, src.data, *id, y_id, 0, 4096));
  CHECK(st.state == transfer_state::completed);
  CHECK(std::all_of(y.data, y.data + 4096, [](unsigned char c) { return c == 0x5a; }));
  CHECK(std::all_of(y.data + 4096, y.data + y.size, [](unsigned char c) { return c == 0x02; }));
  CHECK(std::all_of(z.data, z.data + z.size, [](unsigned char c) { return c == 0x03; }));

  // A local_only buffer takes an id but is not published: ids and indices
  // of the published list differ from then on.
  buffer local(8192, 0x11), w(8192, 0x04);
  REQUIRE(a->register_memory(local.data, local.size, "cpu:0", tide::buffer_access::local_only).has_value());
  REQUIRE(a->register_memory(w.data, w.size, "cpu:0").has_value());
  const std::uint32_t w_id = a->buffer_id(w.data).value();
  st = run(*b, transfer_request::in_buffer(transfer_op::write, src.data, *id, w_id, 4096, 4096));
  MESSAGE("WRITE to id " << w_id << " (published index 2): state " << static_cast<int>(st.state) << ", reason "
                         << tide::to_string(st.reason));
  CHECK(st.state == transfer_state::completed);
  CHECK(std::all_of(w.data, w.data + 4096, [](unsigned char c) { return c == 0x04; }));
  CHECK(std::all_of(w.data + 4096, w.data + w.size, [](unsigned char c) { return c == 0x5a; }));
  CHECK(std::all_of(z.data, z.data + z.size, [](unsigned char c) { return c == 0x03; }));
  CHECK(std::all_of(local.data, local.data + local.size, [](unsigned char c) { return c == 0x11; }));
  CHECK(std::all_of(y.data + 4096, y.data + y.size, [](unsigned char c) { return c == 0x02; }));
  CHECK(b->close_segment(*id).has_value());
  ::unlink(key.c_str());
}

// Review turn 3, finding 14: with the shared secret, a member claims only
// its own NIC paths, and a notification is queued under who sent it.
TEST_CASE("with the secret a member cannot connect another's NIC path or notify under another's name") {
  const auto devs = tide::test::devices_under_test();
  const std::string key = secret_file('k');
  auto a = make(devs[0], key);
  auto b = make(devs[1], key);
  auto secret = tide::wire::cluster_secret::load(key).value();
  const tide::gid_bytes gid = b->transport().local_segment().devices.at(0).gid;
  // An insider (the secret, its own identity) connects a path naming b.
  tide::handshake_desc req;
  req.local_nic_path = b->segment_name() + "@" + devs[1];
  req.peer_nic_path = a->segment_name() + "@" + devs[0];
  req.local_gid = gid;
  req.qp_num = {0x1234, 0x1235};
  req.ready_ack = false;
  auto o = quick(secret);
  o.identity = "127.0.0.1:1";
  auto r = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), req, o);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::handshake_rejected);
  MESSAGE("claiming b's path: " << r.error().detail);
  CHECK(r.error().detail.find("authenticated peer \"127.0.0.1:1\"") != std::string::npos);
  CHECK(a->transport().context(0).live_endpoints() == 0);
  // The same insider's notify claiming to be b is queued under its own identity.
  REQUIRE(tide::net::send_notify("127.0.0.1", a->handshake_port(), {b->segment_name(), "spoof"}, o).has_value());
  auto got = a->take_notifies();
  REQUIRE(got.size() == 1);
  CHECK(got[0].name == "127.0.0.1:1");
  CHECK(got[0].notify_msg == "spoof");
  // b itself still connects and transfers (its identity is its path's server).
  buffer target(4096), src(4096, 0x77);
  REQUIRE(a->register_memory(target.data, target.size, "cpu:0").has_value());
  REQUIRE(b->register_memory(src.data, src.size, "cpu:0").has_value());
  auto id = b->open_segment(a->segment_name()).value();
  auto st = run(*b, transfer_request::in_buffer(transfer_op::write, src.data, id, a->buffer_id(target.data).value(), 0,
                                                src.size));
  CHECK(st.state == transfer_state::completed);
  CHECK(target.data[4095] == 0x77);
  CHECK(b->close_segment(id).has_value());
  ::unlink(key.c_str());
}

// Review turn 3, finding 7: a publish snapshotted and stored with no lock
// across both, so a slower thread could store an older snapshot last.
TEST_CASE("concurrent register and unregister: the stored descriptor ends up listing exactly what is registered") {
  const auto devs = tide::test::devices_under_test();
  const std::string key = secret_file('k');
  auto a = make(devs[0], key);
  auto b = make(devs[1], key);
  constexpr int kThreads = 4, kEach = 24;
  buffer pool(std::size_t{kThreads} * kEach * 4096);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        unsigned char* p = pool.data + (static_cast<std::size_t>(t) * kEach + static_cast<std::size_t>(i)) * 4096;
        if (!a->register_memory(p, 4096, "cpu:0")) ++failures;
        if (i % 2 == 1 && !a->unregister_memory(p - 4096)) ++failures;  // every other one goes again
      }
    });
  }
  for (auto& th : threads) th.join();
  REQUIRE(failures == 0);
  std::vector<std::uint64_t> want;
  for (int t = 0; t < kThreads; ++t)
    for (int i = 1; i < kEach; i += 2)
      want.push_back(reinterpret_cast<std::uint64_t>(pool.data) + (static_cast<std::uint64_t>(t) * kEach + i) * 4096);
  auto id = b->open_segment(a->segment_name()).value();
  auto desc = b->segment_descriptor(id).value();
  std::vector<std::uint64_t> got;
  for (const auto& pb : desc->buffers) got.push_back(pb.addr);
  std::sort(got.begin(), got.end());
  CHECK(got == want);
  CHECK(a->transport().registered_buffers() == want.size());
  CHECK(b->close_segment(id).has_value());
  ::unlink(key.c_str());
}

TEST_CASE("buffer access: read-only refused at submit, local_only unpublished, a forced WRITE fails on the NIC") {
  const auto devs = tide::test::devices_under_test();
  auto a = make(devs[0]);
  auto b = make(devs[1]);
  buffer ro(8192, 0xaa), rw(8192), local(8192, 0x11), src(8192, 0x55), back(8192);
  REQUIRE(a->register_memory(ro.data, ro.size, "cpu:0", tide::buffer_access::remote_read).has_value());
  REQUIRE(a->register_memory(local.data, local.size, "cpu:0", tide::buffer_access::local_only).has_value());
  REQUIRE(a->register_memory(rw.data, rw.size, "cpu:0").has_value());
  REQUIRE(b->register_memory(src.data, src.size, "cpu:0").has_value());
  REQUIRE(b->register_memory(back.data, back.size, "cpu:0").has_value());

  auto id = b->open_segment(a->segment_name()).value();
  auto desc = b->segment_descriptor(id).value();
  REQUIRE(desc->buffers.size() == 2);  // local_only is not published
  for (const auto& pb : desc->buffers) CHECK(pb.addr != reinterpret_cast<std::uint64_t>(local.data));
  const auto ro_index = static_cast<std::uint32_t>(
      std::find_if(desc->buffers.begin(), desc->buffers.end(),
                   [&](const auto& x) { return x.addr == reinterpret_cast<std::uint64_t>(ro.data); }) -
      desc->buffers.begin());
  REQUIRE(ro_index < 2);
  CHECK(desc->buffers[ro_index].access == tide::buffer_access::remote_read);

  auto batch = b->allocate_batch(4).value();
  const auto w = transfer_request::in_buffer(transfer_op::write, src.data, id, ro_index, 0, 4096);
  auto refused = b->submit(batch, {&w, 1});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == errc::remote_access_denied);
  MESSAGE("submit: " << refused.error().message());
  const auto wraw = transfer_request::at_address(transfer_op::write, src.data, id,
                                                 reinterpret_cast<std::uint64_t>(ro.data), 4096);
  CHECK(b->submit(batch, {&wraw, 1}).error().code == errc::remote_access_denied);
  (void)b->free_batch(batch);
  // Reading it is allowed.
  auto st = run(*b, transfer_request::in_buffer(transfer_op::read, back.data, id, ro_index, 0, 4096));
  CHECK(st.state == transfer_state::completed);
  CHECK(back.data[0] == 0xaa);

  // Forced past the check: a forged descriptor claims read-write.  The MR
  // has no REMOTE_WRITE, so the NIC refuses and nothing is written.
  tide::segment_desc forged = *desc;
  forged.buffers[ro_index].access = tide::buffer_access::remote_read_write;
  REQUIRE(b->transport().set_segment(id, forged).has_value());
  st = run(*b, wraw);
  MESSAGE("forced WRITE: state " << static_cast<int>(st.state) << ", reason " << tide::to_string(st.reason));
  CHECK(st.state == transfer_state::failed);
  CHECK(st.reason == errc::remote_access_error);
  CHECK(std::all_of(ro.data, ro.data + ro.size, [](unsigned char x) { return x == 0xaa; }));
  CHECK(b->close_segment(id).has_value());
}

TEST_CASE("an empty-GID connect naming a host makes no outbound connection (p2p mode)") {
  const auto devs = tide::test::devices_under_test();
  auto a = make(devs[0]);
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor bait(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const auto port = bait.local_endpoint().port();
  tide::handshake_desc req;
  req.local_nic_path = "127.0.0.1:" + std::to_string(port) + "@" + devs[1];
  req.peer_nic_path = a->segment_name() + "@" + devs[0];
  req.qp_num = {0x1234, 0x1235};
  req.ready_ack = false;  // local_gid stays empty: "look it up in my descriptor"
  auto r = tide::net::exchange_handshake("127.0.0.1", a->handshake_port(), req, quick());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::handshake_rejected);
  MESSAGE("reply: " << r.error().detail);
  CHECK(r.error().detail.find("not open here") != std::string::npos);
  bait.non_blocking(true);
  boost::system::error_code ec;
  (void)bait.accept(ec);
  CHECK(ec == boost::asio::error::would_block);  // nobody dialled the bait
}

TEST_CASE("probe: a live peer answers, a wrong secret is auth_failed, a dead one peer_unreachable; no QP either way") {
  const auto devs = tide::test::devices_under_test();
  const std::string key = secret_file('p');
  const std::string other_key = secret_file('q');
  auto target = make(devs[1], key);
  auto member = make(devs[0], key);
  auto outsider = make(devs[0], other_key);
  const std::string seg = target->segment_name();
  const int qps_before[2] = {kernel_qps(devs[0]), kernel_qps(devs[1])};

  auto plain_target = make(devs[1]);
  auto plain = make(devs[0]);
  auto time_probes = [](engine& from, const std::string& to, const std::string& what) {
    std::vector<double> ms;
    for (int i = 0; i < 20; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto s = from.probe(to, 2s);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      REQUIRE_MESSAGE(s.has_value(), s.error());
    }
    std::sort(ms.begin(), ms.end());
    MESSAGE("probe of a live peer " << what << ": p50 " << ms[ms.size() / 2] << " ms, max " << ms.back()
                                    << " ms (20 probes)");
  };
  time_probes(*member, seg, "with the secret");
  time_probes(*plain, plain_target->segment_name(), "without a secret");

  auto wrong = outsider->probe(seg, 2s);
  REQUIRE_FALSE(wrong.has_value());
  CHECK(wrong.error().code == errc::auth_failed);

  auto bad_name = member->probe("127.0.0.1:not-a-port", 2s);
  REQUIRE_FALSE(bad_name.has_value());
  CHECK(bad_name.error().code == errc::invalid_argument);

  // Probes open nothing: the kernel lists as many RC QPs as before.
  if (qps_before[0] >= 0) {
    CHECK(kernel_qps(devs[0]) == qps_before[0]);
    CHECK(kernel_qps(devs[1]) == qps_before[1]);
  }

  // The peer goes away: unreachable, within the timeout.
  target.reset();
  const auto t0 = std::chrono::steady_clock::now();
  auto dead = member->probe(seg, 1500ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(dead.has_value());
  CHECK(dead.error().code == errc::peer_unreachable);
  CHECK(took < 3s);  // the timeout plus scheduling slack: the call does not hang
  std::remove(key.c_str());
  std::remove(other_key.c_str());
}
