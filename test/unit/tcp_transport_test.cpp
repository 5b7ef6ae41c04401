// tcp::transport on loopback, without an engine: every byte verified, the
// bytes around each target untouched, the server's refusals, version 1,
// the authentication, stalls, cancel and shutdown with requests in flight.
#include <tide/memory/memory_kind.hpp>
#include <tide/tcp/tcp_transport.hpp>
#include <tide/wire/auth.hpp>
#include <tide/wire/descriptors.hpp>
#include <tide/wire/tcp_data.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using tide::errc;
using tide::transfer_op;
namespace wire = tide::wire;

namespace {

/// Registered buffers as a server sees them, with guard bytes around each.
class memory_table final : public tide::tcp::local_memory {
 public:
  struct region {
    std::vector<std::uint8_t> bytes;  ///< kGuard bytes, the buffer, kGuard bytes
    tide::buffer_access access = tide::buffer_access::remote_read_write;
    std::atomic<int> open{0};
    std::atomic<bool> closing{false};
    const tide::memory::copy_engine* stager = nullptr;  ///< the server stages through it
    [[nodiscard]] std::uint64_t addr() const { return reinterpret_cast<std::uint64_t>(bytes.data() + kGuard); }
    [[nodiscard]] std::size_t size() const { return bytes.size() - 2 * kGuard; }
    [[nodiscard]] bool guards_intact() const {
      for (std::size_t i = 0; i < kGuard; ++i)
        if (bytes[i] != 0xee || bytes[bytes.size() - 1 - i] != 0xee) return false;
      return true;
    }
  };
  static constexpr std::size_t kGuard = 64;

  region& add(std::size_t n, tide::buffer_access a = tide::buffer_access::remote_read_write) {
    auto r = std::make_unique<region>();
    r->bytes.assign(n + 2 * kGuard, 0xee);
    std::fill(r->bytes.begin() + kGuard, r->bytes.end() - kGuard, 0);
    r->access = a;
    regions_.push_back(std::move(r));
    return *regions_.back();
  }

  wire::tcp_status open_range(std::uint64_t addr, std::uint64_t length, transfer_op kind, void*& handle,
                              const tide::memory::copy_engine*& stager) noexcept override {
    for (auto& r : regions_) {
      if (addr < r->addr() || addr - r->addr() > r->size() || length > r->size() - (addr - r->addr())) continue;
      if (r->closing.load()) return wire::tcp_status::unavailable;
      if (kind == transfer_op::write ? !tide::allows_write(r->access) : !tide::allows_read(r->access))
        return wire::tcp_status::access_denied;
      r->open.fetch_add(1);
      opened.fetch_add(1);
      handle = r.get();
      stager = r->stager;
      return wire::tcp_status::ok;
    }
    return wire::tcp_status::addr_rejected;
  }
  void close_range(void* handle) noexcept override {
    static_cast<region*>(handle)->open.fetch_sub(1);
    closed.fetch_add(1);
  }

  std::atomic<int> opened{0}, closed{0};

 private:
  std::vector<std::unique_ptr<region>> regions_;
};

/// An op whose completion a test can wait for.
class test_op final : public tide::tcp::op {
 public:
  test_op(transfer_op k, void* local, std::uint64_t remote, std::uint64_t len) {
    kind = k;
    local_addr = reinterpret_cast<std::uint64_t>(local);
    remote_addr = remote;
    length = len;
  }
  void done(errc e) noexcept override {
    std::lock_guard lock(mu_);
    result_ = e;
    finished_ = true;
    ++calls_;
    cv_.notify_all();
  }
  errc stop_reason() const noexcept override { return stop.load(); }
  /// The outcome; fails the test if it does not come within `limit` (a hang guard, not a timing claim).
  errc wait(std::chrono::milliseconds limit = 20s) {
    std::unique_lock lock(mu_);
    REQUIRE(cv_.wait_for(lock, limit, [&] { return finished_; }));
    return result_;
  }
  [[nodiscard]] bool finished() {
    std::lock_guard lock(mu_);
    return finished_;
  }
  int calls() {
    std::lock_guard lock(mu_);
    return calls_;
  }
  std::atomic<errc> stop{errc::ok};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
  int calls_ = 0;
  errc result_ = errc::ok;
};

tide::tcp::config loopback_config() {
  tide::tcp::config c;
  c.bind_host = "127.0.0.1";
  c.io_threads = 2;
  return c;
}

std::vector<std::uint8_t> pattern(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  return v;
}

struct pair_of_transports {
  memory_table server_mem, client_mem;
  std::unique_ptr<tide::tcp::transport> server, client;
  tide::tcp::peer to_server;
  explicit pair_of_transports(tide::tcp::config sc = loopback_config(), tide::tcp::config cc = loopback_config()) {
    auto s = tide::tcp::transport::create(sc, server_mem);
    REQUIRE(s);
    server = std::move(*s);
    auto c = tide::tcp::transport::create(cc, client_mem);
    REQUIRE(c);
    client = std::move(*c);
    to_server = {"127.0.0.1", server->port(), 2};
  }
};

// A raw TCP connection to a port on 127.0.0.1 (or another loopback address).
int connect_raw(std::uint16_t port, const char* from = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  if (from != nullptr) {
    sockaddr_in local{};
    local.sin_family = AF_INET;
    ::inet_pton(AF_INET, from, &local.sin_addr);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) == 0);
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// Reads exactly n bytes (or fewer at EOF); returns how many.
std::size_t read_full(int fd, void* p, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t k = ::read(fd, static_cast<char*>(p) + got, n - got);
    if (k <= 0) break;
    got += static_cast<std::size_t>(k);
  }
  return got;
}

// Writes all n bytes.
void write_full(int fd, const void* p, std::size_t n) {
  for (std::size_t sent = 0; sent < n;) {
    const ssize_t k = ::write(fd, static_cast<const char*>(p) + sent, n - sent);
    REQUIRE(k > 0);
    sent += static_cast<std::size_t>(k);
  }
}

// Bounds every read on fd: one that would wait for a deadline under test fails instead.
void bound_reads(int fd, std::chrono::seconds limit) {
  const timeval bound{static_cast<time_t>(limit.count()), 0};
  REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound) == 0);
}

// Reads one version-2 status frame: true when it says ok.
bool status_ok(int fd) {
  wire::tcp_status_bytes st{};
  return read_full(fd, st.data(), st.size()) == st.size() && wire::decode_tcp_status(st) == 0u;
}

}  // namespace

TEST_CASE("tcp data codec: Mooncake's 24-byte header and status frames") {
  const wire::tcp_header h{0x1122334455667788ull, 0x0102030405060708ull, transfer_op::write, true};
  const auto b = wire::encode_tcp_header(h);
  CHECK(b[0] == 0x88);  // little-endian
  CHECK(b[8] == 0x08);
  CHECK(b[16] == 0x81);  // WRITE | v2
  for (std::size_t i = 17; i < 24; ++i) CHECK(b[i] == 0);
  CHECK(wire::decode_tcp_header(b) == h);
  auto r = b;
  r[16] = 0x80;
  CHECK(wire::decode_tcp_header(r).op == transfer_op::read);
  r[16] = 0x07;  // any opcode but 1 is a READ, as Mooncake's server reads it
  CHECK(wire::decode_tcp_header(r).op == transfer_op::read);
  CHECK_FALSE(wire::decode_tcp_header(r).v2);
  const auto ok = wire::encode_tcp_status(wire::tcp_status::ok);
  std::uint64_t v = 0;
  std::memcpy(&v, ok.data(), 8);
  CHECK(v == 0x4D43545600000000ull);  // "MCTV" in the high half, little-endian on this host
  const auto rej = wire::encode_tcp_status(wire::tcp_status::addr_rejected);
  CHECK(wire::decode_tcp_status(rej) == 1u);
  wire::tcp_status_bytes junk{};
  CHECK_FALSE(wire::decode_tcp_status(junk).has_value());
  CHECK(wire::tcp_status_errc(1) == errc::remote_access_error);
  CHECK(wire::tcp_status_errc(2) == errc::remote_access_denied);
}

TEST_CASE("tcp: WRITE and READ move every byte, in sizes around the pipeline's edges") {
  pair_of_transports t;
  auto& target = t.server_mem.add(8 << 20);
  for (const std::size_t n : {std::size_t{1}, std::size_t{4096}, std::size_t{65536}, std::size_t{65537},
                              std::size_t{1} << 20, std::size_t{8} << 20}) {
    CAPTURE(n);
    auto src = pattern(n, static_cast<unsigned>(n));
    test_op w(transfer_op::write, src.data(), target.addr(), n);
    t.client->submit(t.to_server, w);
    REQUIRE(w.wait() == errc::ok);
    CHECK(std::memcmp(target.bytes.data() + memory_table::kGuard, src.data(), n) == 0);
    std::vector<std::uint8_t> back(n + 2, 0x5a);
    test_op r(transfer_op::read, back.data() + 1, target.addr(), n);
    t.client->submit(t.to_server, r);
    REQUIRE(r.wait() == errc::ok);
    CHECK(std::memcmp(back.data() + 1, src.data(), n) == 0);
    CHECK(back.front() == 0x5a);
    CHECK(back.back() == 0x5a);
    CHECK(w.calls() == 1);
    CHECK(r.calls() == 1);
  }
  CHECK(target.guards_intact());
  // The server releases a READ's buffer once its last byte is written, which
  // may be just after the client took it.
  for (int i = 0; i < 2000 && t.server_mem.opened.load() != t.server_mem.closed.load(); ++i)
    std::this_thread::sleep_for(1ms);
  CHECK(t.server_mem.opened.load() == t.server_mem.closed.load());
}

TEST_CASE("tcp: many requests at once, from 8 threads, pipelined over the pool") {
  pair_of_transports t;
  constexpr std::size_t kThreads = 8, kPer = 64, kSize = 16384;
  auto& target = t.server_mem.add(kThreads * kPer * kSize);
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (std::size_t th = 0; th < kThreads; ++th)
    threads.emplace_back([&, th] {
      std::vector<std::vector<std::uint8_t>> srcs;
      std::vector<std::unique_ptr<test_op>> ops;
      for (std::size_t i = 0; i < kPer; ++i) {
        srcs.push_back(pattern(kSize, static_cast<unsigned>(th * kPer + i)));
        ops.push_back(std::make_unique<test_op>(transfer_op::write, srcs.back().data(),
                                                target.addr() + (th * kPer + i) * kSize, kSize));
        t.client->submit(t.to_server, *ops.back());
      }
      for (auto& o : ops)
        if (o->wait() != errc::ok) bad.fetch_add(1);
      for (std::size_t i = 0; i < kPer; ++i)
        if (std::memcmp(target.bytes.data() + memory_table::kGuard + (th * kPer + i) * kSize, srcs[i].data(), kSize) != 0)
          bad.fetch_add(1);
    });
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  const auto s = t.client->stats();
  CHECK(s.ops_ok == kThreads * kPer);
  CHECK(s.connections_opened >= 1);
  CHECK(s.connections_opened <= loopback_config().conns_per_peer);
  CHECK(target.guards_intact());
}

TEST_CASE("tcp: staged at both ends (the copy engine GPU memory uses), 8 threads WRITE then READ, sizes around 1 MiB") {
  pair_of_transports t;
  auto host = tide::memory::copy_engine_for(tide::memory::range_info{});
  REQUIRE(host);
  constexpr std::size_t kThreads = 8, kSize = (std::size_t{1} << 20) + 4099;
  auto& target = t.server_mem.add(kThreads * kSize);
  target.stager = *host;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (std::size_t th = 0; th < kThreads; ++th)
    threads.emplace_back([&, th] {
      const std::size_t n = kSize - th * 977;  // each a different tail
      auto src = pattern(n, static_cast<unsigned>(th));
      std::vector<std::uint8_t> back(n + 1, 0);
      test_op w(transfer_op::write, src.data(), target.addr() + th * kSize, n);
      w.stager = *host;
      t.client->submit(t.to_server, w);
      if (w.wait() != errc::ok) bad.fetch_add(1);
      test_op r(transfer_op::read, back.data(), target.addr() + th * kSize, n);
      r.stager = *host;
      t.client->submit(t.to_server, r);
      if (r.wait() != errc::ok) bad.fetch_add(1);
      if (std::memcmp(back.data(), src.data(), n) != 0 || back[n] != 0) bad.fetch_add(1);
    });
  for (auto& th : threads) th.join();
  CHECK(bad.load() == 0);
  CHECK(target.guards_intact());
  std::uint64_t moved = 0;
  for (std::size_t th = 0; th < kThreads; ++th) moved += 2 * (kSize - th * 977);
  CHECK(t.client->stats().bytes_staged == moved);
  CHECK(t.server->stats().bytes_staged == moved);
}

TEST_CASE("tcp server: a range outside every buffer, a denied operation, an unavailable buffer") {
  pair_of_transports t;
  auto& rw = t.server_mem.add(4096);
  auto& ro = t.server_mem.add(4096, tide::buffer_access::remote_read);
  auto& wo = t.server_mem.add(4096, tide::buffer_access::remote_write);
  std::vector<std::uint8_t> src = pattern(8192, 3), dst(8192, 0);

  test_op past(transfer_op::write, src.data(), rw.addr() + 1, 4096);  // one byte past the end
  t.client->submit(t.to_server, past);
  CHECK(past.wait() == errc::remote_access_error);
  test_op nowhere(transfer_op::read, dst.data(), 0x10, 16);
  t.client->submit(t.to_server, nowhere);
  CHECK(nowhere.wait() == errc::remote_access_error);
  test_op write_ro(transfer_op::write, src.data(), ro.addr(), 4096);
  t.client->submit(t.to_server, write_ro);
  CHECK(write_ro.wait() == errc::remote_access_denied);
  test_op read_wo(transfer_op::read, dst.data(), wo.addr(), 4096);
  t.client->submit(t.to_server, read_wo);
  CHECK(read_wo.wait() == errc::remote_access_denied);
  rw.closing = true;
  test_op gone(transfer_op::write, src.data(), rw.addr(), 16);
  t.client->submit(t.to_server, gone);
  CHECK(gone.wait() == errc::busy);
  rw.closing = false;
  // The server is healthy afterwards, and nothing was written anywhere.
  test_op fine(transfer_op::write, src.data(), rw.addr(), 4096);
  t.client->submit(t.to_server, fine);
  CHECK(fine.wait() == errc::ok);
  CHECK(std::all_of(ro.bytes.begin() + memory_table::kGuard, ro.bytes.end() - memory_table::kGuard,
                    [](std::uint8_t b) { return b == 0; }));
  CHECK(rw.guards_intact());
  CHECK(ro.guards_intact());
  CHECK(t.server->stats().requests_rejected == 5);
}

TEST_CASE("tcp server: bad input on a raw socket (truncated header, zero size, short payload, version 1)") {
  memory_table mem;
  auto& buf = mem.add(4096);
  auto srv = tide::tcp::transport::create(loopback_config(), mem);
  REQUIRE(srv);
  const std::uint16_t port = (*srv)->port();
  {
    // A header cut short, then a close: nothing opened, the server lives on.
    const int fd = connect_raw(port);
    const auto h = wire::encode_tcp_header({16, buf.addr(), transfer_op::write, true});
    REQUIRE(::write(fd, h.data(), 10) == 10);
    ::close(fd);
  }
  {
    // size 0: refused with Mooncake's AddrRejected, then closed.
    const int fd = connect_raw(port);
    const auto h = wire::encode_tcp_header({0, buf.addr(), transfer_op::write, true});
    REQUIRE(::write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    wire::tcp_status_bytes st{};
    REQUIRE(read_full(fd, st.data(), st.size()) == st.size());
    CHECK(wire::decode_tcp_status(st) == 1u);
    char more = 0;
    CHECK(::read(fd, &more, 1) == 0);  // closed
    ::close(fd);
  }
  {
    // addr + size wraps past 2^64.
    const int fd = connect_raw(port);
    const auto h = wire::encode_tcp_header({64, ~std::uint64_t{0} - 8, transfer_op::read, true});
    REQUIRE(::write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    wire::tcp_status_bytes st{};
    REQUIRE(read_full(fd, st.data(), st.size()) == st.size());
    CHECK(wire::decode_tcp_status(st) == 1u);
    ::close(fd);
  }
  {
    // A WRITE whose payload is shorter than announced, then a close: the bytes
    // that came are in the buffer, the buffer is released, nothing else moved.
    const int fd = connect_raw(port);
    const auto h = wire::encode_tcp_header({100, buf.addr(), transfer_op::write, true});
    REQUIRE(::write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    const std::vector<std::uint8_t> part(40, 0x42);
    REQUIRE(::write(fd, part.data(), part.size()) == 40);
    ::close(fd);
    // The session ends when it reads the close; then its buffer is released.
    for (int i = 0; i < 5000 && mem.closed.load() != 1; ++i) std::this_thread::sleep_for(1ms);
    REQUIRE(mem.opened.load() == 1);  // the first range any of these opened
    REQUIRE(mem.closed.load() == 1);
    const auto* p = reinterpret_cast<const std::uint8_t*>(buf.addr());
    CHECK(std::all_of(p, p + 40, [](std::uint8_t b) { return b == 0x42; }));
    CHECK(std::all_of(p + 40, p + 100, [](std::uint8_t b) { return b == 0; }));
  }
  {
    // Version 1 (no flag): a READ gets the bytes and no status frame.
    std::memset(reinterpret_cast<void*>(buf.addr()), 0x33, 64);
    const int fd = connect_raw(port);
    const auto h = wire::encode_tcp_header({64, buf.addr(), transfer_op::read, false});
    REQUIRE(::write(fd, h.data(), h.size()) == static_cast<ssize_t>(h.size()));
    std::vector<std::uint8_t> got(64);
    REQUIRE(read_full(fd, got.data(), got.size()) == 64);
    CHECK(std::all_of(got.begin(), got.end(), [](std::uint8_t b) { return b == 0x33; }));
    ::close(fd);
  }
  // Every range opened was closed again (the short payload's too), as the
  // sessions end.
  for (int i = 0; i < 2000 && mem.opened.load() != mem.closed.load(); ++i) std::this_thread::sleep_for(1ms);
  CHECK(mem.opened.load() == mem.closed.load());
  CHECK(buf.guards_intact());
  // Healthy: a real client is served.
  memory_table cm;
  auto cli = tide::tcp::transport::create(loopback_config(), cm);
  REQUIRE(cli);
  std::vector<std::uint8_t> src = pattern(4096, 9);
  test_op w(transfer_op::write, src.data(), buf.addr(), 4096);
  (*cli)->submit({"127.0.0.1", port, 2}, w);
  CHECK(w.wait() == errc::ok);
}

TEST_CASE("tcp: a version-1 peer gets one request per connection and no status frames") {
  pair_of_transports t;
  auto& target = t.server_mem.add(1 << 20);
  tide::tcp::peer v1 = t.to_server;
  v1.version = 1;
  std::vector<std::unique_ptr<test_op>> ops;
  std::vector<std::vector<std::uint8_t>> srcs;
  for (int i = 0; i < 16; ++i) {
    srcs.push_back(pattern(65536, static_cast<unsigned>(i)));
    ops.push_back(std::make_unique<test_op>(transfer_op::write, srcs.back().data(), target.addr() + i * 65536ull, 65536));
    t.client->submit(v1, *ops.back());
  }
  for (auto& o : ops) CHECK(o->wait() == errc::ok);
  // A version-1 WRITE is done when its bytes left (no status): they have
  // landed once the server has counted them.  READ them back over v1 too.
  for (int i = 0; i < 5000 && t.server->stats().bytes_served_in < 16 * 65536; ++i) std::this_thread::sleep_for(1ms);
  REQUIRE(t.server->stats().bytes_served_in == 16 * 65536);
  std::vector<std::uint8_t> back(1 << 20);
  test_op r(transfer_op::read, back.data(), target.addr(), 1 << 20);
  t.client->submit(v1, r);
  CHECK(r.wait() == errc::ok);
  for (int i = 0; i < 16; ++i) CHECK(std::memcmp(back.data() + i * 65536, srcs[static_cast<std::size_t>(i)].data(), 65536) == 0);
  CHECK(t.client->stats().connections_opened >= 17);
}

TEST_CASE("tcp: with a cluster secret both sides authenticate; a peer without it gets nothing") {
  auto secret = tide::wire::cluster_secret::from_bytes(std::string(32, 's'));
  REQUIRE(secret);
  auto other = tide::wire::cluster_secret::from_bytes(std::string(32, 'x'));
  REQUIRE(other);
  tide::tcp::config sc = loopback_config(), cc = loopback_config();
  sc.secret = cc.secret = *secret;
  sc.identity = "server:1";
  cc.identity = "client:2";
  pair_of_transports t(sc, cc);
  auto& target = t.server_mem.add(65536);
  auto src = pattern(65536, 5);
  test_op w(transfer_op::write, src.data(), target.addr(), 65536);
  t.client->submit(t.to_server, w);
  CHECK(w.wait() == errc::ok);
  CHECK(std::memcmp(target.bytes.data() + memory_table::kGuard, src.data(), 65536) == 0);

  SUBCASE("another secret") {
    tide::tcp::config oc = loopback_config();
    oc.secret = *other;
    oc.identity = "intruder:3";
    memory_table om;
    auto intruder = tide::tcp::transport::create(oc, om);
    REQUIRE(intruder);
    std::vector<std::uint8_t> dst(65536, 0);
    test_op r(transfer_op::read, dst.data(), target.addr(), 65536);
    (*intruder)->submit(t.to_server, r);
    CHECK(r.wait() == errc::auth_failed);
    CHECK(std::all_of(dst.begin(), dst.end(), [](std::uint8_t b) { return b == 0; }));
  }
  SUBCASE("no secret (Mooncake's protocol): refused before any request is read") {
    memory_table nm;
    auto plain = tide::tcp::transport::create(loopback_config(), nm);
    REQUIRE(plain);
    std::vector<std::uint8_t> zeros(4096, 0);
    test_op w2(transfer_op::write, zeros.data(), target.addr(), 4096);
    (*plain)->submit(t.to_server, w2);
    CHECK(w2.wait() != errc::ok);
    CHECK(std::memcmp(target.bytes.data() + memory_table::kGuard, src.data(), 4096) == 0);
  }
  CHECK(t.server->stats().auth_failed >= 1);
  CHECK(t.server_mem.opened.load() == 1);  // only the authenticated WRITE reached a buffer
}

TEST_CASE("tcp: a peer that stops answering fails the request; a canceled one ends without waiting for it") {
  // A listener that accepts and never reads or answers (a SIGSTOPped peer).
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 16) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const tide::tcp::peer silent{"127.0.0.1", ntohs(a.sin_port), 2};

  memory_table cm;
  std::vector<std::uint8_t> dst(4096, 0x77);
  SUBCASE("stalled: connection_lost after progress_timeout") {
    tide::tcp::config cc = loopback_config();
    cc.progress_timeout = 300ms;
    auto cli = tide::tcp::transport::create(cc, cm);
    REQUIRE(cli);
    test_op r(transfer_op::read, dst.data(), 0x1000, 4096);
    (*cli)->submit(silent, r);
    CHECK(r.wait() == errc::connection_lost);
  }
  SUBCASE("canceled while in flight: ends without waiting out progress_timeout, nothing written") {
    tide::tcp::config cc = loopback_config();
    cc.progress_timeout = 3600s;  // only the cancel can end it within the wait's guard
    auto cli = tide::tcp::transport::create(cc, cm);
    REQUIRE(cli);
    test_op r(transfer_op::read, dst.data(), 0x1000, 4096);
    (*cli)->submit(silent, r);
    // In flight for sure: the "peer" has its header.
    const int conn = ::accept(lfd, nullptr, nullptr);
    REQUIRE(conn >= 0);
    wire::tcp_header_bytes h{};
    REQUIRE(read_full(conn, h.data(), h.size()) == h.size());
    CHECK(wire::decode_tcp_header(h).size == 4096);
    r.stop = errc::canceled;
    CHECK(r.wait() == errc::connection_lost);
    ::close(conn);
  }
  CHECK(std::all_of(dst.begin(), dst.end(), [](std::uint8_t b) { return b == 0x77; }));
  ::close(lfd);
}

TEST_CASE("tcp: a refused connect fails at once with peer_unreachable") {
  // A port nothing listens on: bind, read the port, close.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  memory_table cm;
  auto cli = tide::tcp::transport::create(loopback_config(), cm);
  REQUIRE(cli);
  std::vector<std::uint8_t> src(64, 1);
  test_op w(transfer_op::write, src.data(), 0x1000, 64);
  (*cli)->submit({"127.0.0.1", ntohs(a.sin_port), 2}, w);
  CHECK(w.wait() == errc::peer_unreachable);
}

TEST_CASE("tcp: shutdown with requests queued and in flight ends each once, and later submits at once") {
  pair_of_transports t;
  // Each request writes its own MiB: two connections receiving into the same bytes would be
  // the caller's data race (as with RDMA), and TSan reports it.
  constexpr std::size_t each = 1 << 20;
  constexpr int requests = 64;
  auto& target = t.server_mem.add(requests * each);
  std::vector<std::uint8_t> src(requests * each, 0x11);
  std::vector<std::unique_ptr<test_op>> ops;
  for (int i = 0; i < requests; ++i) {
    ops.push_back(std::make_unique<test_op>(transfer_op::write, src.data() + i * each, target.addr() + i * each, each));
    t.client->submit(t.to_server, *ops.back());
  }
  t.client->shutdown();
  int completed = 0;
  for (auto& o : ops) {
    const errc e = o->wait();
    CHECK((e == errc::ok || e == errc::endpoint_closed));
    CHECK(o->calls() == 1);
    completed += e == errc::ok;
  }
  MESSAGE("completed before shutdown: " << completed << " of " << requests);
  test_op late(transfer_op::write, src.data(), target.addr(), 16);
  t.client->submit(t.to_server, late);
  CHECK(late.finished());
  CHECK(late.wait() == errc::endpoint_closed);
  t.server->shutdown();
  CHECK(t.server_mem.opened.load() == t.server_mem.closed.load());
}

TEST_CASE("tcp server: connection limits per source and in all; a flood leaves a real peer served") {
  memory_table mem;
  auto& buf = mem.add(65536);
  tide::tcp::config sc = loopback_config();
  sc.bind_host = "0.0.0.0";
  sc.max_connections_per_source = 8;
  sc.max_connections = 600;
  auto srv = tide::tcp::transport::create(sc, mem);
  REQUIRE(srv);
  const std::uint16_t port = (*srv)->port();
  // 500 idle connections from 127.0.0.2..: the per-source cap closes most.
  std::vector<int> idle;
  for (int i = 0; i < 500; ++i) idle.push_back(connect_raw(port, "127.0.0.2"));
  // The first 8 stay open; the rest read an end of stream.
  int closed = 0;
  for (std::size_t i = 8; i < idle.size(); ++i) {
    char c = 0;
    if (::read(idle[i], &c, 1) == 0) ++closed;
  }
  CHECK(closed == 492);
  CHECK((*srv)->stats().refused_source == 492);
  // A real peer from 127.0.0.1 still transfers.
  memory_table cm;
  auto cli = tide::tcp::transport::create(loopback_config(), cm);
  REQUIRE(cli);
  auto src = pattern(65536, 1);
  test_op w(transfer_op::write, src.data(), buf.addr(), 65536);
  (*cli)->submit({"127.0.0.1", port, 2}, w);
  CHECK(w.wait() == errc::ok);
  CHECK(std::memcmp(reinterpret_cast<void*>(buf.addr()), src.data(), 65536) == 0);
  for (int fd : idle) ::close(fd);
}

TEST_CASE("tcp server: a slow sender (slowloris) is dropped at request_timeout; others are served meanwhile") {
  memory_table mem;
  auto& buf = mem.add(4096);
  tide::tcp::config sc = loopback_config();
  sc.request_timeout = 300ms;
  auto srv = tide::tcp::transport::create(sc, mem);
  REQUIRE(srv);
  const int fd = connect_raw((*srv)->port());
  const auto h = wire::encode_tcp_header({16, buf.addr(), transfer_op::write, true});
  REQUIRE(::write(fd, h.data(), 1) == 1);  // one byte of a header, then nothing
  memory_table cm;
  auto cli = tide::tcp::transport::create(loopback_config(), cm);
  REQUIRE(cli);
  auto src = pattern(4096, 2);
  test_op w(transfer_op::write, src.data(), buf.addr(), 4096);
  (*cli)->submit({"127.0.0.1", (*srv)->port(), 2}, w);
  CHECK(w.wait() == errc::ok);
  char c = 0;
  CHECK(::read(fd, &c, 1) == 0);  // dropped
  CHECK((*srv)->stats().dropped >= 1);
  ::close(fd);
}

// The session's one timer follows its deadline as it moves: later (idle after
// requests, longer than progress_timeout and request_timeout, is not a stall)
// and earlier (a payload that stops after an idle spell is dropped at
// progress_timeout, not at the idle deadline the timer was armed for).
TEST_CASE("tcp server: deadlines after many requests: idle is not a stall, a stalled payload is dropped") {
  memory_table mem;
  auto& buf = mem.add(4096);
  tide::tcp::config sc = loopback_config();
  sc.progress_timeout = 200ms;
  sc.request_timeout = 300ms;
  auto srv = tide::tcp::transport::create(sc, mem);
  REQUIRE(srv);
  const int fd = connect_raw((*srv)->port());
  bound_reads(fd, 10s);  // not the 300 s idle deadline
  const std::vector<std::uint8_t> payload(64, 0x5c);
  const auto write_request = [&](std::size_t sent) {
    const auto h = wire::encode_tcp_header({64, buf.addr(), transfer_op::write, true});
    write_full(fd, h.data(), h.size());
    write_full(fd, payload.data(), sent);
  };
  for (int i = 0; i < 200; ++i) {
    write_request(payload.size());
    REQUIRE(status_ok(fd));
  }
  std::this_thread::sleep_for(700ms);  // idle: past both shorter deadlines
  write_request(payload.size());
  CHECK(status_ok(fd));
  CHECK((*srv)->stats().dropped == 0);
  std::this_thread::sleep_for(400ms);
  write_request(10);  // then the payload stops
  const auto t0 = std::chrono::steady_clock::now();
  char c = 0;
  CHECK(::read(fd, &c, 1) == 0);  // dropped
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 150ms);
  CHECK(waited < 5s);  // progress_timeout, not the 300 s idle deadline
  CHECK((*srv)->stats().dropped == 1);
  ::close(fd);
}

// Caught a gather list handed to async_write_some from the stack: a send
// that had to wait for the socket read freed memory and wrote other bytes.
TEST_CASE("tcp: 32 requests of 1 MiB pipelined at once, every byte where it belongs") {
  pair_of_transports t;
  auto& target = t.server_mem.add(32 << 20);
  auto src = pattern(32 << 20, 99);
  std::vector<std::unique_ptr<test_op>> ops;
  for (int i = 0; i < 32; ++i) {
    ops.push_back(std::make_unique<test_op>(transfer_op::write, src.data() + i * (1 << 20), target.addr() + i * (1ull << 20), 1 << 20));
    t.client->submit(t.to_server, *ops.back());
  }
  for (auto& o : ops) CHECK(o->wait() == errc::ok);
  for (int i = 0; i < 32; ++i) {
    const bool same = std::memcmp(target.bytes.data() + memory_table::kGuard + i * (1 << 20), src.data() + i * (1 << 20), 1 << 20) == 0;
    CHECK_MESSAGE(same, "op " << i);
  }
}

// The data port waits for the rest of a large payload (SO_RCVLOWAT) instead
// of waking for every few segments.  That mark must never exceed the bytes
// still due, or the last part of a payload would sit unread until the
// progress deadline, and it must be 1 again after the payload, or a header
// sent after a pause would.
TEST_CASE("tcp server: a large payload's last bytes and the next header are read at once") {
  memory_table mem;
  auto& buf = mem.add(2 << 20);
  tide::tcp::config sc = loopback_config();
  sc.progress_timeout = 5s;
  auto srv = tide::tcp::transport::create(sc, mem);
  REQUIRE(srv);
  const int fd = connect_raw((*srv)->port());
  bound_reads(fd, 3s);  // a status held back by the mark fails the read
  const auto payload = pattern(2 << 20, 5);
  const auto h = wire::encode_tcp_header({payload.size(), buf.addr(), transfer_op::write, true});
  write_full(fd, h.data(), h.size());
  write_full(fd, payload.data(), 256 << 10);
  std::this_thread::sleep_for(100ms);  // the server reads that and waits for the rest
  const auto t0 = std::chrono::steady_clock::now();
  write_full(fd, payload.data() + (256 << 10), payload.size() - (256 << 10));
  REQUIRE(status_ok(fd));
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK(std::memcmp(buf.bytes.data() + memory_table::kGuard, payload.data(), payload.size()) == 0);
  std::this_thread::sleep_for(100ms);  // the server waits for a header now
  const std::vector<std::uint8_t> small(64, 0x3c);
  const auto h2 = wire::encode_tcp_header({small.size(), buf.addr(), transfer_op::write, true});
  write_full(fd, h2.data(), h2.size());
  write_full(fd, small.data(), small.size());
  CHECK(status_ok(fd));
  CHECK(buf.bytes[memory_table::kGuard] == 0x3c);
  CHECK((*srv)->stats().dropped == 0);
  ::close(fd);
}
