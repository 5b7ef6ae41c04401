// The in_process, p2p and http backends against real stores: the p2p one
// against handshake servers in this process, the http one against the
// tide-metadata-server executable started here.  etcd has its own suite.

#include <tide/detail/handshake_address.hpp>
#include <tide/net/handshake_server.hpp>
#include <tide/policy/http.hpp>
#include <tide/policy/in_process.hpp>
#include <tide/policy/p2p.hpp>

#include "../../src/metadata/http_client.hpp"
#include "support/backend_conformance.hpp"
#include "support/metadata_server.hpp"
#include "support/process.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <csignal>
#include <cstdlib>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace tide;
using namespace std::chrono_literals;
using tide::test::elapsed_ms;
using clock_type = std::chrono::steady_clock;
using tide::test::metadata_server_process;

namespace {

struct in_process_fixture {
  static constexpr bool kSharedStore = true;
  metadata_config config() const {
    metadata_config c;
    c.cluster_id = "conformance";
    return c;
  }
  std::string name(std::size_t i) const { return "seg-" + std::to_string(i); }
};

// p2p: one handshake server per segment name, serving from the registry.
struct p2p_fixture {
  static constexpr bool kSharedStore = false;
  p2p_fixture() {
    for (int i = 0; i < 2; ++i) {
      net::handshake_server_config cfg;
      cfg.host = "127.0.0.1";
      auto s = net::handshake_server::start(cfg, {});
      REQUIRE(s.has_value());
      servers.push_back(std::move(*s));
    }
  }
  metadata_config config() const {
    metadata_config c;
    c.connection = "P2PHANDSHAKE";
    c.timeout = 2000ms;
    return c;
  }
  std::string name(std::size_t i) const { return "127.0.0.1:" + std::to_string(servers.at(i).port()); }
  std::vector<net::handshake_server> servers;
};

struct http_fixture {
  static constexpr bool kSharedStore = true;
  metadata_server_process server;
  metadata_config config() const {
    metadata_config c;
    c.connection = server.url();
    c.timeout = 2000ms;
    return c;
  }
  std::string name(std::size_t i) const { return "10.0.0." + std::to_string(i) + ":16002"; }
};

template <class B, class F>
struct backend_case {
  using backend = B;
  using fixture = F;
};

}  // namespace

TEST_CASE_TEMPLATE("metadata backend conformance against a real store", T,
                   backend_case<policy::in_process, in_process_fixture>, backend_case<policy::p2p, p2p_fixture>,
                   backend_case<policy::http, http_fixture>) {
  typename T::fixture f;
  tide::test::check_backend_conformance<typename T::backend>(f);
}

TEST_CASE("p2p: unreachable, silent and misnamed peers") {
  metadata_config c;
  c.connection = "P2PHANDSHAKE";
  c.timeout = 500ms;
  policy::p2p b{c};

  const auto dead = tide::test::free_loopback_ports(1)[0];
  auto t0 = clock_type::now();
  auto r = b.get_segment("127.0.0.1:" + std::to_string(dead));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_unavailable);
  CHECK(r.error().detail.find("peer_unreachable") != std::string::npos);
  CHECK(elapsed_ms(t0) < 1000);

  tide::test::silent_listener silent;
  t0 = clock_type::now();
  auto hung = b.get_segment("127.0.0.1:" + std::to_string(silent.port()));
  REQUIRE_FALSE(hung.has_value());
  CHECK(hung.error().code == errc::metadata_unavailable);
  CHECK(elapsed_ms(t0) >= 450);
  CHECK(elapsed_ms(t0) < 2000);

  CHECK(b.get_segment("127.0.0.1:notaport").error().code == errc::config_invalid);
  CHECK(b.put_segment("", "{}").error().code == errc::config_invalid);

  metadata_config wrong;
  wrong.connection = "etcd://127.0.0.1:2379";
  CHECK(policy::p2p{wrong}.get_segment("127.0.0.1:1").error().code == errc::config_invalid);
}

TEST_CASE("http: requests on the wire are Mooncake's GET/PUT/DELETE ?key=<curl-escaped key>") {
  // A listener that records the request line and answers 404.
  tide::test::silent_listener l;
  std::string request_line;
  std::thread t([&] {
    pollfd pf{l.fd(), POLLIN, 0};
    if (::poll(&pf, 1, 5000) <= 0) return;
    const int fd = ::accept(l.fd(), nullptr, nullptr);
    if (fd < 0) return;
    std::string got;
    char buf[1024];
    while (got.find("\r\n\r\n") == std::string::npos) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    request_line = got.substr(0, got.find("\r\n"));
    const std::string reply = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    ::close(fd);
  });
  metadata_config c;
  c.connection = "http://127.0.0.1:" + std::to_string(l.port()) + "/metadata";
  c.cluster_id = "c1";
  auto r = policy::http{c}.get_segment("10.0.0.2:16002");
  t.join();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::segment_not_found);
  CHECK(request_line == "GET /metadata?key=mooncake%2Fc1%2Fram%2F10.0.0.2%3A16002 HTTP/1.1");
}

TEST_CASE("tide-metadata-server: paths, missing keys, methods, escapes") {
  metadata_server_process server;
  const auto port = server.port();
  auto req = [&](const char* method, const std::string& target, const std::string& body = {}) {
    auto r = detail::http_request("127.0.0.1", port, method, target, body, "application/json", 2000ms);
    REQUIRE_MESSAGE(r.has_value(), r.error());
    return *r;
  };
  CHECK(req("PUT", "/metadata?key=a%2Fb+c", "{\"x\":1}").status == 200);
  auto got = req("GET", "/metadata?other=1&key=a/b%20c");  // decoded keys match however they were escaped
  CHECK(got.status == 200);
  CHECK(got.body == "{\"x\":1}");
  CHECK(req("GET", "/metadata?key=missing").status == 404);
  CHECK(req("GET", "/elsewhere?key=a%2Fb+c").status == 404);
  CHECK(req("GET", "/metadata").status == 400);
  CHECK(req("GET", "/metadata?key=").status == 400);
  CHECK(req("GET", "/metadata?key=%zz").status == 400);
  CHECK(req("POST", "/metadata?key=a%2Fb+c", "{}").status == 405);
  CHECK(req("DELETE", "/metadata?key=a%2Fb%20c").status == 200);
  CHECK(req("DELETE", "/metadata?key=a%2Fb%20c").status == 404);

  // Garbage on the port closes that connection only.
  {
    tide::test::raw_client junk{port};
    junk.send("\x01\x02 not http at all\r\n\r\n");
    const auto r = junk.read_until_eof(3000ms);
    CHECK(r.eof);
  }
  CHECK(req("GET", "/metadata?key=missing").status == 404);
  CHECK(server.process().terminate() == 0);  // SIGTERM: a clean exit
}

TEST_CASE("http: full keys (rpc_meta) through get_key/put_key/remove_key") {
  metadata_server_process server;
  metadata_config c;
  c.connection = "http://127.0.0.1:" + std::to_string(server.port()) + "/metadata";
  c.cluster_id = "c1";
  policy::http b{c};
  const std::string key = rpc_meta_key(c.cluster_id, "10.0.0.1:15321");
  REQUIRE(b.put_key(key, encode_rpc_meta("10.0.0.1", 15321)).has_value());
  // Mooncake's client asks for the escaped key.
  auto raw = detail::http_request("127.0.0.1", server.port(), "GET",
                                  "/metadata?key=mooncake%2Fc1%2Frpc_meta%2F10.0.0.1%3A15321", {}, {}, 2000ms);
  REQUIRE_MESSAGE(raw.has_value(), raw.error());
  CHECK(raw->status == 200);
  CHECK(raw->body == R"({"ip_or_host_name":"10.0.0.1","rpc_port":15321})");
  auto got = b.get_key(key);
  REQUIRE_MESSAGE(got.has_value(), got.error());
  CHECK(*got == raw->body);
  REQUIRE(b.remove_key(key).has_value());
  CHECK(b.get_key(key).error().code == errc::segment_not_found);
  CHECK(b.remove_key(key).error().code == errc::segment_not_found);
}

TEST_CASE("http: server down -> metadata_unavailable within the timeout; back on the same port -> works") {
  metadata_server_process server;
  metadata_config c;
  c.connection = server.url();
  c.timeout = 1000ms;
  policy::http b{c};
  REQUIRE(b.put_segment("s", "{}").has_value());

  const std::uint16_t port = server.port();
  server.process().kill();
  auto t0 = clock_type::now();
  auto down = b.get_segment("s");
  REQUIRE_FALSE(down.has_value());
  CHECK(down.error().code == errc::metadata_unavailable);
  CHECK(elapsed_ms(t0) < 1500);

  server.start(port);
  // The store was in memory: empty now, and the same backend object works.
  CHECK(b.get_segment("s").error().code == errc::segment_not_found);
  REQUIRE(b.put_segment("s", "{\"back\":1}").has_value());
  CHECK(*b.get_segment("s") == "{\"back\":1}");

  // A stopped (SIGSTOP) server accepts nothing: bounded by the timeout.
  server.process().signal(SIGSTOP);
  REQUIRE(tide::test::wait_stopped(server.process().pid()));
  t0 = clock_type::now();
  auto hung = b.get_segment("s");
  server.process().signal(SIGCONT);
  REQUIRE_FALSE(hung.has_value());
  CHECK(hung.error().code == errc::metadata_unavailable);
  CHECK(elapsed_ms(t0) >= 900);
  CHECK(elapsed_ms(t0) < 2500);
  CHECK(*b.get_segment("s") == "{\"back\":1}");
}

TEST_CASE("http: bad connection strings are config_invalid at the first call") {
  for (const char* url : {"https://127.0.0.1:8080/metadata", "127.0.0.1:8080", "http://", "http://:80/x",
                          "http://h:99999/x", "http://h:80/metadata?x=1"}) {
    metadata_config c;
    c.connection = url;
    auto r = policy::http{c}.get_segment("s");
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.error().code == errc::config_invalid, url);
  }
}

// The exact value a Mooncake target publishes (jsoncpp FastWriter: sorted
// keys, compact, trailing newline), under the key it uses.
TEST_CASE("http: a Mooncake peer's rpc_meta gives its handshake address; absent falls back to the segment name") {
  metadata_server_process server;
  metadata_config c;
  c.connection = server.url();
  policy::http b{c};
  REQUIRE(b.put_key("mooncake/rpc_meta/10.47.0.1:12345", "{\"ip_or_host_name\":\"10.47.0.2\",\"rpc_port\":15358}\n"));
  std::mutex mu;
  std::map<std::string, net::peer_address, std::less<>> cache;
  auto a = tide::detail::handshake_address(b, "", "10.47.0.1:12345", mu, cache, false);
  REQUIRE_MESSAGE(a, (a ? "" : a.error().message()));
  CHECK(a->host == "10.47.0.2");
  CHECK(a->port == 15358);
  // Cached: a changed entry is seen only with a fresh read.
  REQUIRE(b.put_key("mooncake/rpc_meta/10.47.0.1:12345", "{\"ip_or_host_name\":\"10.47.0.2\",\"rpc_port\":15400}\n"));
  CHECK(tide::detail::handshake_address(b, "", "10.47.0.1:12345", mu, cache, false)->port == 15358);
  CHECK(tide::detail::handshake_address(b, "", "10.47.0.1:12345", mu, cache, true)->port == 15400);
  // No entry: the segment name is the address.
  auto plain = tide::detail::handshake_address(b, "", "10.47.0.3:16001", mu, cache, false);
  REQUIRE(plain);
  CHECK(plain->host == "10.47.0.3");
  CHECK(plain->port == 16001);
  // A malformed entry is an error naming the field, not a silent fallback.
  REQUIRE(b.put_key("mooncake/rpc_meta/10.47.0.4:1", "{\"ip_or_host_name\":\"h\",\"rpc_port\":70000}"));
  auto bad = tide::detail::handshake_address(b, "", "10.47.0.4:1", mu, cache, false);
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::metadata_malformed);
  CHECK(bad.error().detail.find("rpc_port") != std::string::npos);
  // The cluster prefix is part of the key.
  REQUIRE(b.put_key(rpc_meta_key("c9", "x:1"), encode_rpc_meta("10.47.0.9", 15001)));
  CHECK(tide::detail::handshake_address(b, "c9", "x:1", mu, cache, false)->port == 15001);
  CHECK(decode_rpc_meta(encode_rpc_meta("h", 1)).value() == rpc_meta{"h", 1});
}

namespace {

std::shared_ptr<const wire::cluster_secret> shared_secret() {
  return wire::cluster_secret::from_bytes(std::string(32, 's')).value();
}

segment_desc routed_segment(const std::string& name, std::size_t nbuffers) {
  segment_desc d;
  d.name = name;
  d.devices = {{"rxe0", 0, *parse_gid("00:00:00:00:00:00:00:00:00:00:ff:ff:0a:2f:00:01")}};
  d.priority = {{"cpu:0", {{"rxe0"}, {}}}};
  for (std::size_t i = 0; i < nbuffers; ++i) {
    buffer_desc b{"cpu:0", 0x100000 * (i + 1), 0x10000, {static_cast<std::uint32_t>(i)},
                  {static_cast<std::uint32_t>(100 + i)}};
    b.id = static_cast<std::uint32_t>(i);
    d.buffers.push_back(b);
  }
  return d;
}

}  // namespace

// Review 1ab3d99 #9: with a secret the handshake address still came from the
// unauthenticated rpc_meta entry, so a store writer without the secret
// could point every handshake at a black hole or at a relay it runs.
TEST_CASE("review 1ab3d99 #9: with a secret the handshake address comes from the MACed descriptor, never rpc_meta") {
  metadata_server_process server;
  metadata_config c;
  c.connection = server.url();
  c.secret = shared_secret();
  segment_cache<policy::http> publisher{c}, reader{c};
  publisher.set_handshake_address("10.47.0.2:15358");
  REQUIRE(publisher.publish(routed_segment("10.47.0.1:12345", 1)));
  // What the publisher also writes for Mooncake peers, then a store writer's version of it.
  REQUIRE(publisher.backend().put_key(rpc_meta_key("", "10.47.0.1:12345"), encode_rpc_meta("10.47.0.2", 15358)));
  REQUIRE(reader.backend().put_key(rpc_meta_key("", "10.47.0.1:12345"), encode_rpc_meta("10.66.6.6", 1)));
  std::mutex mu;
  std::map<std::string, net::peer_address, std::less<>> cache;
  auto a = tide::detail::handshake_address(reader, "", "10.47.0.1:12345", mu, cache, false);
  REQUIRE_MESSAGE(a, (a ? "" : a.error().message()));
  CHECK(a->host == "10.47.0.2");
  CHECK(a->port == 15358);
  // The descriptor's own field altered in the store: its header MAC fails.
  auto stored = reader.backend().get_segment("10.47.0.1:12345").value();
  const auto at = stored.find("10.47.0.2:15358");
  REQUIRE(at != std::string::npos);
  stored.replace(at, 15, "10.66.6.6:15358");
  REQUIRE(reader.backend().put_segment("10.47.0.1:12345", stored));
  auto tampered = tide::detail::handshake_address(reader, "", "10.47.0.1:12345", mu, cache, true);
  REQUIRE_FALSE(tampered);
  CHECK(tampered.error().code == errc::metadata_malformed);
  CHECK(tampered.error().detail.find("mac.header") != std::string::npos);
  // A sealed descriptor without the field (an older tide): no address, and
  // no fallback to rpc_meta either.
  segment_cache<policy::http> old_publisher{c};
  REQUIRE(old_publisher.publish(routed_segment("10.47.0.5:1", 1)));
  REQUIRE(reader.backend().put_key(rpc_meta_key("", "10.47.0.5:1"), encode_rpc_meta("10.66.6.6", 1)));
  auto missing = tide::detail::handshake_address(reader, "", "10.47.0.5:1", mu, cache, false);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == errc::metadata_malformed);
  CHECK(missing.error().detail.find("tide_handshake: missing") != std::string::npos);

  // Without a secret nothing changes on the wire: rpc_meta as Mooncake
  // writes and reads it, and no tide_handshake or tide_stamp in the descriptor.
  metadata_config plain_cfg;
  plain_cfg.connection = server.url();
  segment_cache<policy::http> plain{plain_cfg};
  plain.set_handshake_address("10.47.0.7:15001");
  const std::string json = plain.publish_json(routed_segment("10.47.0.6:1", 1)).value();
  CHECK(json.find("tide_handshake") == std::string::npos);
  CHECK(json.find("tide_stamp") == std::string::npos);
  REQUIRE(plain.backend().put_key(rpc_meta_key("", "10.47.0.6:1"), encode_rpc_meta("10.47.0.8", 15002)));
  std::map<std::string, net::peer_address, std::less<>> plain_cache;
  CHECK(tide::detail::handshake_address(plain, "", "10.47.0.6:1", mu, plain_cache, false)->port == 15002);
}
