// The etcd backend against Debian's etcd (3.4), started here on loopback
// ports with temporary data directories: conformance, Mooncake's keys, a
// stopped / restarted member, and a 3-member cluster losing one member.
//
// Exits 77 (meson: skipped) with the reason printed when no etcd binary can
// be found; it never passes without running.

#define DOCTEST_CONFIG_IMPLEMENT
#include <tide/detail/handshake_address.hpp>
#include <tide/policy/etcd.hpp>

#include "../../src/metadata/etcd_codec.hpp"
#include "../../src/metadata/http_client.hpp"
#include "support/backend_conformance.hpp"
#include "support/etcd_cluster.hpp"
#include "support/process.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <cstdlib>

using namespace tide;
using namespace std::chrono_literals;
using tide::test::elapsed_ms;
using clock_type = std::chrono::steady_clock;
using tide::test::etcd_cluster;

namespace {

struct etcd_fixture {
  static constexpr bool kSharedStore = true;
  etcd_cluster cluster{1};
  metadata_config config() const { return cluster.config(); }
  std::string name(std::size_t i) const { return "10.0.0." + std::to_string(i) + ":16002"; }
};

// The raw value under `key`, read through the gateway as Mooncake's client would.
std::optional<std::string> raw_get(std::uint16_t port, const std::string& key) {
  auto r = detail::http_request("127.0.0.1", port, "POST", "/v3/kv/range", detail::etcd_key_request(key),
                                "application/json", 2000ms);
  REQUIRE(r.has_value());
  REQUIRE(r->status == 200);
  auto v = detail::parse_etcd_range(r->body);
  REQUIRE(v.has_value());
  return *v;
}

}  // namespace

TEST_CASE("etcd backend conformance on a single member") {
  etcd_fixture f;
  tide::test::check_backend_conformance<policy::etcd>(f);
}

TEST_CASE("etcd: Mooncake's keys and JSON, both ways") {
  etcd_cluster c{1};
  auto cfg = c.config();
  cfg.cluster_id = "prod";
  policy::etcd b{cfg};
  segment_cache<policy::etcd> cache{cfg};
  REQUIRE(cache.publish(tide::test::conformance_segment("10.0.0.1:15321", 1)).has_value());
  auto stored = raw_get(c.client_port(0), "mooncake/prod/ram/10.0.0.1:15321");
  REQUIRE(stored.has_value());
  CHECK(stored->find("\"priority_matrix\":{\"cpu:0\":[[\"rxe0\"],[\"rxe1\"]]}") != std::string::npos);

  // A descriptor as Mooncake writes it, put under Mooncake's key directly.
  const std::string mooncake =
      R"({"buffers":[{"addr":140230000000000,"length":1073741824,"lkey":[2099712],"name":"cpu:0","rkey":[2099712]}],)"
      R"("devices":[{"gid":"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:02","lid":0,"name":"mlx5_0"}],)"
      R"("name":"10.0.0.2:16002","priority_matrix":{"cpu:0":[["mlx5_0"],[]]},"protocol":"rdma",)"
      R"("tcp_data_port":0,"tcp_proto_version":1,"timestamp":"2026-01-01 12:00:00.123456"})"
      "\n";
  auto put = detail::http_request("127.0.0.1", c.client_port(0), "POST", "/v3/kv/put",
                                  detail::etcd_put_request("mooncake/prod/ram/10.0.0.2:16002", mooncake),
                                  "application/json", 2000ms);
  REQUIRE(put.has_value());
  REQUIRE(put->status == 200);
  auto id = cache.open("10.0.0.2:16002");
  REQUIRE_MESSAGE(id.has_value(), id.error());
  auto loc = cache.find_buffer(*id, 140230000000000ULL + 4096, 4096);
  REQUIRE(loc.has_value());
  CHECK(loc->buffer().rkey[0] == 2099712u);
  CHECK(encode_segment(*loc->segment) == mooncake);
}

TEST_CASE("etcd: full keys (rpc_meta) through get_key/put_key/remove_key") {
  etcd_cluster c{1};
  auto cfg = c.config();
  cfg.cluster_id = "prod";
  policy::etcd b{cfg};
  const std::string key = rpc_meta_key(cfg.cluster_id, "10.0.0.1:15321");
  REQUIRE(key == "mooncake/prod/rpc_meta/10.0.0.1:15321");
  REQUIRE(b.put_key(key, encode_rpc_meta("10.0.0.1", 15321)).has_value());
  // Stored under exactly that key, as a Mooncake peer reads it.
  auto stored = raw_get(c.client_port(0), key);
  REQUIRE(stored.has_value());
  CHECK(*stored == R"({"ip_or_host_name":"10.0.0.1","rpc_port":15321})");
  auto got = b.get_key(key);
  REQUIRE_MESSAGE(got.has_value(), got.error());
  CHECK(*got == *stored);
  CHECK(b.get_segment("10.0.0.1:15321").error().code == errc::segment_not_found);  // not under ram/
  REQUIRE(b.remove_key(key).has_value());
  CHECK_FALSE(raw_get(c.client_port(0), key).has_value());
  CHECK(b.get_key(key).error().code == errc::segment_not_found);
  CHECK(b.remove_key(key).error().code == errc::segment_not_found);
}

TEST_CASE("etcd stopped -> metadata_unavailable within the timeout; started again -> works, nothing restarted") {
  etcd_cluster c{1};
  segment_cache<policy::etcd> cache{c.config(1000ms)};
  REQUIRE(cache.publish(tide::test::conformance_segment("peer", 1)).has_value());

  SUBCASE("killed and restarted") {
    c.process(0).kill();
    const auto t0 = clock_type::now();
    auto r = cache.open("peer");
    const auto took = elapsed_ms(t0);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::metadata_unavailable);
    CHECK(took < 1500);
    MESSAGE("killed etcd: open failed in " << took << " ms: " << r.error().message());

    c.start(0);  // same ports, same data directory
    REQUIRE(c.wait_ready(0, 15s));
    auto back = cache.open("peer");
    REQUIRE_MESSAGE(back.has_value(), back.error());
    CHECK((*cache.get(*back))->name == "peer");
  }
  SUBCASE("frozen (SIGSTOP) and thawed") {
    c.process(0).signal(SIGSTOP);
    // kill() returns before every thread of etcd has stopped.
    REQUIRE(tide::test::wait_stopped(c.process(0).pid()));
    const auto t0 = clock_type::now();
    auto r = cache.open("peer");
    const auto took = elapsed_ms(t0);
    c.process(0).signal(SIGCONT);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::metadata_unavailable);
    CHECK(took >= 900);
    CHECK(took < 2500);
    MESSAGE("frozen etcd: open failed in " << took << " ms");
    REQUIRE(c.wait_ready(0, 15s));
    CHECK(cache.open("peer").has_value());
  }
}

TEST_CASE("a 3-member etcd cluster with one member killed still works") {
  etcd_cluster c{3};
  // Member 0 is the first endpoint the backend tries.
  segment_cache<policy::etcd> cache{c.config(1000ms)};
  REQUIRE(cache.publish(tide::test::conformance_segment("before", 1)).has_value());
  c.process(0).kill();

  // If the killed member led, the others elect a new leader (election
  // timeout 500 ms); allow that, bounded.
  const auto t0 = clock_type::now();
  status put = fail(errc::metadata_unavailable);
  while (!put && elapsed_ms(t0) < 10000) {
    put = cache.publish(tide::test::conformance_segment("after", 2));
    if (!put) std::this_thread::sleep_for(100ms);
  }
  REQUIRE_MESSAGE(put.has_value(), put.error());
  MESSAGE("first write after the kill succeeded " << elapsed_ms(t0) << " ms later");
  auto before = cache.open("before");
  REQUIRE_MESSAGE(before.has_value(), before.error());
  auto after = cache.open("after");
  REQUIRE_MESSAGE(after.has_value(), after.error());
  CHECK((*cache.get(*after))->buffers.size() == 2);

  // Steady state: every call goes to a live member first, no timeouts paid.
  const auto t1 = clock_type::now();
  for (int i = 0; i < 10; ++i) REQUIRE(cache.refresh(*after).has_value());
  CHECK(elapsed_ms(t1) < 2000);
}

TEST_CASE("etcd: bad connection strings are config_invalid; an endpoint that is not etcd is unavailable") {
  for (const char* s : {"", "etcd://", "etcd://host:notaport", "etcd://,,"}) {
    metadata_config c;
    c.connection = s;
    auto r = policy::etcd{c}.get_segment("x");
    REQUIRE_FALSE(r.has_value());
    CHECK_MESSAGE(r.error().code == errc::config_invalid, s);
  }
  tide::test::scripted_server not_etcd{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"};
  metadata_config c;
  c.connection = "127.0.0.1:" + std::to_string(not_etcd.port());
  c.timeout = 1000ms;
  auto r = policy::etcd{c}.get_segment("x");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_unavailable);
}

TEST_CASE("base64 as etcd's gateway expects it") {
  CHECK(detail::base64_encode("") == "");
  CHECK(detail::base64_encode("f") == "Zg==");
  CHECK(detail::base64_encode("fo") == "Zm8=");
  CHECK(detail::base64_encode("foo") == "Zm9v");
  CHECK(detail::base64_encode("mooncake/ram/a") == "bW9vbmNha2UvcmFtL2E=");
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    CHECK(*detail::base64_decode(detail::base64_encode(s)) == s);
  }
  for (const char* bad : {"Zg=", "Z===", "Zg=a", "Zm9v!AAA", "=AAA", "Zh==", "Zm9=", "Zm8=Zm8="}) CHECK_FALSE(detail::base64_decode(bad).has_value());
}

TEST_CASE("etcd: a Mooncake peer's rpc_meta gives its handshake address (exact value Mooncake writes)") {
  etcd_fixture f;
  auto c = f.config();
  c.cluster_id = "mc";
  policy::etcd b{c};
  REQUIRE(b.put_key("mooncake/mc/rpc_meta/10.47.0.1:12345", "{\"ip_or_host_name\":\"10.47.0.2\",\"rpc_port\":15358}\n"));
  std::mutex mu;
  std::map<std::string, net::peer_address, std::less<>> cache;
  auto a = tide::detail::handshake_address(b, "mc", "10.47.0.1:12345", mu, cache, false);
  REQUIRE_MESSAGE(a, (a ? "" : a.error().message()));
  CHECK(a->host == "10.47.0.2");
  CHECK(a->port == 15358);
  auto plain = tide::detail::handshake_address(b, "mc", "10.47.0.3:16001", mu, cache, false);
  REQUIRE(plain);
  CHECK(plain->port == 16001);
}

int main(int argc, char** argv) { return tide::test::run_if_etcd(argc, argv); }
