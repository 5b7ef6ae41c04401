// The etcd backend over TLS and with etcd's user/password auth, against
// Debian's etcd (3.4) started here on loopback with certificates that the
// `openssl` command makes in a temporary directory: a CA, a server
// certificate for IP 127.0.0.1, a client certificate, and a second CA that
// signed nothing etcd trusts.
//
// Exits 77 (meson: skipped) with the reason printed when etcd or openssl is
// missing; it never passes without running.

#define DOCTEST_CONFIG_IMPLEMENT
#include <tide/policy/etcd.hpp>

#include "../../src/metadata/etcd_codec.hpp"
#include "../../src/metadata/http_client.hpp"
#include "../../src/metadata/tls_context.hpp"
#include "support/backend_conformance.hpp"
#include "support/process.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <unistd.h>

using namespace tide;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string etcd_binary() {
  const char* p = std::getenv("TIDE_ETCD");
  return p && *p ? p : "/usr/bin/etcd";
}
const std::string kOpenssl = "/usr/bin/openssl";

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

// Certificates made by the openssl command (EC P-256: fast to generate).
class test_pki {
 public:
  test_pki() {
    make_ca("ca");
    make_ca("other-ca");
    // etcd's JSON gateway dials etcd's own gRPC port with the server
    // certificate, so under --client-cert-auth it needs clientAuth as well.
    make_leaf("server", "ca", "/CN=tide-test-etcd-server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n");
    // No Common Name: with auth on, etcd's gateway refuses client
    // certificates that carry one (it cannot pass the CN on as the user).
    make_leaf("client", "ca", "/O=tide-test-client", "extendedKeyUsage=clientAuth\n");
    make_leaf("stranger", "other-ca", "/O=tide-test-stranger", "extendedKeyUsage=clientAuth\n");
    make_leaf("named-client", "ca", "/CN=root", "extendedKeyUsage=clientAuth\n");
  }
  std::string file(const std::string& name) const { return (dir_.path() / name).string(); }
  const std::filesystem::path& dir() const { return dir_.path(); }

 private:
  void openssl(std::vector<std::string> args) {
    args.insert(args.begin(), kOpenssl);
    const int rc = tide::test::run_to_completion(args, file("openssl.log"), 30s);
    REQUIRE_MESSAGE(rc == 0, "openssl " << args[1] << " failed (" << rc << "); see " << file("openssl.log"));
  }
  void make_ca(const std::string& name) {
    openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             file(name + ".key"), "-out", file(name + ".crt"), "-days", "2", "-subj", "/CN=" + name});
  }
  void make_leaf(const std::string& name, const std::string& ca, const std::string& subject, const std::string& ext) {
    write_file(dir_.path() / (name + ".ext"), ext);
    openssl({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
             file(name + ".key"), "-out", file(name + ".csr"), "-subj", subject});
    openssl({"x509", "-req", "-in", file(name + ".csr"), "-CA", file(ca + ".crt"), "-CAkey", file(ca + ".key"),
             "-CAcreateserial", "-out", file(name + ".crt"), "-days", "2", "-extfile", file(name + ".ext")});
  }
  tide::test::temp_dir dir_;
};

// One etcd member serving clients over https with --client-cert-auth.
class tls_etcd {
 public:
  explicit tls_etcd(const test_pki& pki, std::vector<std::string> extra = {}) : pki_(pki) {
    const auto ports = tide::test::free_loopback_ports(2);
    port_ = ports[0];
    const std::string client = "https://127.0.0.1:" + std::to_string(ports[0]);
    const std::string peer = "http://127.0.0.1:" + std::to_string(ports[1]);
    std::vector<std::string> argv{etcd_binary(), "--name", "m0", "--data-dir", (dir_.path() / "m0").string(),
                                  "--listen-client-urls", client, "--advertise-client-urls", client,
                                  "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", "m0=" + peer, "--cert-file", pki.file("server.crt"),
                                  "--key-file", pki.file("server.key"), "--client-cert-auth",
                                  "--trusted-ca-file", pki.file("ca.crt"), "--heartbeat-interval", "50",
                                  "--election-timeout", "500", "--logger", "zap", "--log-level", "warn"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    proc_ = tide::test::child_process(argv, log());
    REQUIRE_MESSAGE(wait_ready(15s), "TLS etcd not ready; see " << log());
  }

  // The right CA and client certificate: what the tests' own setup uses.
  detail::http_request_options trusted(std::string authorization = {}) const {
    auto ctx = detail::tls_client_context::load(
        {.ca_file = pki_.file("ca.crt"), .cert_file = pki_.file("client.crt"), .key_file = pki_.file("client.key"),
         .verify_server = true,
         .field_prefix = {}});
    REQUIRE_MESSAGE(ctx.has_value(), ctx.error());
    return {.tls = *ctx, .authorization = std::move(authorization)};
  }

  detail::http_reply post(const std::string& path, const std::string& body, std::string authorization = {}) const {
    auto r = detail::http_request("127.0.0.1", port_, "POST", path, body, "application/json", 3000ms,
                                  trusted(std::move(authorization)));
    REQUIRE_MESSAGE(r.has_value(), r.error());
    return *r;
  }

  bool wait_ready(std::chrono::milliseconds timeout) const {
    const auto t0 = clock_type::now();
    const auto options = trusted();
    while (clock_type::now() - t0 < timeout) {
      if (!proc_.running()) return false;
      auto r = detail::http_request("127.0.0.1", port_, "POST", "/v3/kv/range", detail::etcd_key_request("ready?"),
                                    "application/json", 500ms, options);
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  // etcd auth on, with user root (role root) and `password`: through the
  // gateway, as `etcdctl user add root; user grant-role root root; auth enable`.
  void enable_auth(const std::string& password) const {
    REQUIRE(post("/v3/auth/user/add", R"({"name":"root","password":")" + password + R"("})").status == 200);
    REQUIRE(post("/v3/auth/user/grant", R"({"user":"root","role":"root"})").status == 200);
    const auto enabled = post("/v3/auth/enable", "{}");
    REQUIRE_MESSAGE(enabled.status == 200, enabled.body);
  }

  metadata_config config() const {
    metadata_config c;
    c.connection = "etcds://127.0.0.1:" + std::to_string(port_);
    c.timeout = 2000ms;
    c.etcd_ca_file = pki_.file("ca.crt");
    c.etcd_cert_file = pki_.file("client.crt");
    c.etcd_key_file = pki_.file("client.key");
    return c;
  }
  std::uint16_t port() const { return port_; }
  std::string log() const { return (dir_.path() / "etcd.log").string(); }

 private:
  const test_pki& pki_;
  tide::test::temp_dir dir_;
  std::uint16_t port_ = 0;
  tide::test::child_process proc_;
};

// Shared by the TEST_CASEs: generating certificates and starting etcd costs
// about a second each.
test_pki& pki() {
  static test_pki p;
  return p;
}

struct tls_fixture {
  static constexpr bool kSharedStore = true;
  tls_etcd server{pki()};
  metadata_config config() const { return server.config(); }
  std::string name(std::size_t i) const { return "10.0.0." + std::to_string(i) + ":16002"; }
};

std::string error_of(policy::etcd& b) {
  auto r = b.get_segment("x");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == errc::metadata_unavailable);
  return r.error().detail;
}

}  // namespace

TEST_CASE("etcds: the right CA and client certificate pass the backend conformance suite") {
  tls_fixture f;
  tide::test::check_backend_conformance<policy::etcd>(f);
}

TEST_CASE("etcds: put/get/remove, full keys, and a segment published and opened through the cache") {
  tls_etcd server{pki()};
  auto cfg = server.config();
  cfg.cluster_id = "secure";
  policy::etcd b{cfg};
  REQUIRE(b.put_key("mooncake/secure/rpc_meta/a", "{\"x\":1}").has_value());
  auto got = b.get_key("mooncake/secure/rpc_meta/a");
  REQUIRE_MESSAGE(got.has_value(), got.error());
  CHECK(*got == "{\"x\":1}");
  REQUIRE(b.remove_key("mooncake/secure/rpc_meta/a").has_value());
  CHECK(b.get_key("mooncake/secure/rpc_meta/a").error().code == errc::segment_not_found);

  segment_cache<policy::etcd> cache{cfg};
  REQUIRE(cache.publish(tide::test::conformance_segment("10.0.0.7:15000", 2)).has_value());
  auto id = cache.open("10.0.0.7:15000");
  REQUIRE_MESSAGE(id.has_value(), id.error());
  CHECK((*cache.get(*id))->buffers.size() == 2);
  // Stored as plain Mooncake JSON under Mooncake's key.
  auto raw = server.post("/v3/kv/range", detail::etcd_key_request("mooncake/secure/ram/10.0.0.7:15000"));
  REQUIRE(raw.status == 200);
  CHECK(detail::parse_etcd_range(raw.body)->has_value());

  SUBCASE("the etcd:// scheme with TLS files set is TLS as well") {
    auto plain_scheme = cfg;
    plain_scheme.connection = "etcd://127.0.0.1:" + std::to_string(server.port());
    policy::etcd b2{plain_scheme};
    CHECK(b2.get_segment("10.0.0.7:15000").has_value());
  }
  SUBCASE("failover: a dead endpoint first, the TLS member second") {
    const auto dead = tide::test::free_loopback_ports(1)[0];
    auto two = cfg;
    two.connection = "etcds://127.0.0.1:" + std::to_string(dead) + ",127.0.0.1:" + std::to_string(server.port());
    policy::etcd b2{two};
    auto r = b2.get_segment("10.0.0.7:15000");
    REQUIRE_MESSAGE(r.has_value(), r.error());
    CHECK(b2.get_segment("10.0.0.7:15000").has_value());
  }
}

TEST_CASE("etcds: a wrong CA, a wrong name, no client certificate, plain http -> metadata_unavailable naming why") {
  tls_etcd server{pki()};
  auto cfg = server.config();

  SUBCASE("a CA that did not sign the server's certificate") {
    cfg.etcd_ca_file = pki().file("other-ca.crt");
    policy::etcd b{cfg};
    const auto why = error_of(b);
    MESSAGE(why);
    CHECK(why.find("TLS handshake") != std::string::npos);
    CHECK(why.find("certificate verify failed") != std::string::npos);
  }
  SUBCASE("the server's certificate does not name the endpoint (localhost vs IP:127.0.0.1)") {
    cfg.connection = "etcds://localhost:" + std::to_string(server.port());
    policy::etcd b{cfg};
    const auto why = error_of(b);
    MESSAGE(why);
    CHECK(why.find("certificate verify failed") != std::string::npos);
    CHECK(why.find("hostname mismatch") != std::string::npos);

    cfg.etcd_verify_server = false;  // the operator's explicit opt-out
    policy::etcd unchecked{cfg};
    auto r = unchecked.get_segment("x");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::segment_not_found);
  }
  SUBCASE("no client certificate against --client-cert-auth") {
    cfg.etcd_cert_file.clear();
    cfg.etcd_key_file.clear();
    policy::etcd b{cfg};
    const auto why = error_of(b);
    MESSAGE(why);
    CHECK(why.find("TLS") != std::string::npos);
    CHECK(why.find("certificate") != std::string::npos);
  }
  SUBCASE("a client certificate from a CA etcd does not trust") {
    cfg.etcd_cert_file = pki().file("stranger.crt");
    cfg.etcd_key_file = pki().file("stranger.key");
    policy::etcd b{cfg};
    const auto why = error_of(b);
    MESSAGE(why);
    CHECK(why.find("TLS") != std::string::npos);
  }
  SUBCASE("plain http against the TLS port") {
    metadata_config plain;
    plain.connection = "etcd://127.0.0.1:" + std::to_string(server.port());
    plain.timeout = 2000ms;
    policy::etcd b{plain};
    MESSAGE(error_of(b));
  }
}

TEST_CASE("etcds: unreadable or mismatched files are config_invalid naming the field") {
  auto cfg = metadata_config{};
  cfg.connection = "etcds://127.0.0.1:2379";
  cfg.etcd_ca_file = pki().file("ca.crt");
  cfg.etcd_cert_file = pki().file("client.crt");
  cfg.etcd_key_file = pki().file("client.key");
  auto expect = [](metadata_config c, const std::string& field) {
    auto r = policy::etcd{c}.get_segment("x");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::config_invalid);
    CHECK_MESSAGE(r.error().detail.find(field) != std::string::npos, r.error().detail);
  };
  auto c = cfg;
  c.etcd_ca_file = pki().file("missing.crt");
  expect(c, "etcd_ca_file");
  c = cfg;
  c.etcd_ca_file = pki().file("server.ext");  // not PEM
  expect(c, "etcd_ca_file");
  c = cfg;
  c.etcd_key_file = pki().file("stranger.key");  // not client.crt's key
  expect(c, "etcd_key_file");
  c = cfg;
  c.etcd_key_file.clear();
  expect(c, "etcd_key_file");
  c = cfg;
  c.etcd_user = "root";
  expect(c, "etcd_password_file");
  c.etcd_password_file = pki().file("missing-password");
  expect(c, "etcd_password_file");
}

TEST_CASE("etcds + auth: the right password works, a wrong one is named; an expired token is replaced") {
  // Simple tokens live 1 s unused here (etcd's default is 300 s).
  tls_etcd server{pki(), {"--auth-token-ttl", "1"}};
  server.enable_auth("s3cret-pw");
  write_file(pki().dir() / "good-password", "s3cret-pw\n");
  write_file(pki().dir() / "bad-password", "guess\n");

  auto cfg = server.config();
  cfg.etcd_user = "root";
  cfg.etcd_password_file = pki().file("good-password");

  SUBCASE("no credentials: etcd refuses, and says so") {
    policy::etcd b{server.config()};
    auto r = b.put_segment("x", "{}");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::metadata_unavailable);
    MESSAGE(r.error().detail);
  }
  SUBCASE("a wrong password") {
    cfg.etcd_password_file = pki().file("bad-password");
    policy::etcd b{cfg};
    auto r = b.put_segment("x", "{}");
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == errc::metadata_unavailable);
    MESSAGE(r.error().detail);
    CHECK(r.error().detail.find("authentication as user \"root\"") != std::string::npos);
    CHECK(r.error().detail.find("guess") == std::string::npos);  // the password is never echoed
  }
  SUBCASE("a client certificate with a Common Name: etcd's gateway refuses it, the error says why") {
    cfg.etcd_cert_file = pki().file("named-client.crt");
    cfg.etcd_key_file = pki().file("named-client.key");
    policy::etcd b{cfg};
    auto r = b.put_segment("x", "{}");
    REQUIRE_FALSE(r.has_value());
    MESSAGE(r.error().detail);
    CHECK(r.error().detail.find("without a Common Name") != std::string::npos);
  }
  SUBCASE("the right password; the token expires and is replaced") {
    policy::etcd b{cfg};
    REQUIRE(b.put_segment("x", "{\"v\":1}").has_value());
    CHECK(*b.get_segment("x") == "{\"v\":1}");

    // A token of our own, to watch etcd expire it.
    auto auth = server.post("/v3/auth/authenticate", detail::etcd_authenticate_request("root", "s3cret-pw"));
    REQUIRE(auth.status == 200);
    const auto token = *detail::parse_etcd_token(auth.body);
    CHECK(server.post("/v3/kv/range", detail::etcd_key_request("x"), token).status == 200);
    std::this_thread::sleep_for(2500ms);
    const auto stale = server.post("/v3/kv/range", detail::etcd_key_request("x"), token);
    CHECK(stale.status == 401);
    MESSAGE("etcd on an expired token: HTTP " << stale.status << " " << stale.body);

    // The backend's token expired the same way; the call still succeeds.
    auto again = b.get_segment("x");
    REQUIRE_MESSAGE(again.has_value(), again.error());
    CHECK(*again == "{\"v\":1}");
    REQUIRE(b.remove_segment("x").has_value());

    // Several threads on one backend after the token expired again: they
    // race to replace it, and every call succeeds.
    std::this_thread::sleep_for(2500ms);
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&b, &failures, t] {
        const std::string name = "thread-" + std::to_string(t);
        for (int i = 0; i < 5; ++i) {
          const std::string v = "{\"i\":" + std::to_string(i) + "}";
          if (!b.put_segment(name, v) || b.get_segment(name).value_or("") != v) ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(failures.load() == 0);
  }
}

TEST_CASE("benchmark: etcd put+get latency, http vs https (printed, not asserted)") {
  const auto ports = tide::test::free_loopback_ports(2);
  tide::test::temp_dir dir;
  const std::string client = "http://127.0.0.1:" + std::to_string(ports[0]);
  const std::string peer = "http://127.0.0.1:" + std::to_string(ports[1]);
  tide::test::child_process plain_etcd(
      {etcd_binary(), "--name", "p0", "--data-dir", (dir.path() / "p0").string(), "--listen-client-urls", client,
       "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
       "--initial-cluster", "p0=" + peer, "--logger", "zap", "--log-level", "warn"},
      (dir.path() / "etcd.log").string());
  tls_etcd secure{pki()};
  metadata_config plain_cfg;
  plain_cfg.connection = "etcd://127.0.0.1:" + std::to_string(ports[0]);
  plain_cfg.timeout = 2000ms;
  policy::etcd plain{plain_cfg};
  const auto t_ready = clock_type::now();
  while (!plain.get_segment("x").has_value() && plain.get_segment("x").error().code != errc::segment_not_found &&
         clock_type::now() - t_ready < 15s) {
    std::this_thread::sleep_for(50ms);
  }
  policy::etcd tls{secure.config()};
  constexpr int kRounds = 50;
  for (auto* b : {&plain, &tls}) {
    const bool is_tls = b == &tls;
    REQUIRE(b->put_segment("bench", "{}").has_value());
    const auto t0 = clock_type::now();
    for (int i = 0; i < kRounds; ++i) {
      REQUIRE(b->put_segment("bench", "{\"i\":" + std::to_string(i) + "}").has_value());
      REQUIRE(b->get_segment("bench").has_value());
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - t0).count();
    MESSAGE((is_tls ? "https" : "http ") << ": put+get " << us / kRounds << " us per round (" << kRounds
                                         << " rounds, a new connection per request)");
  }
}

int main(int argc, char** argv) {
  const std::string etcd = etcd_binary();
  if (::access(etcd.c_str(), X_OK) != 0) {
    std::printf("SKIP: no etcd binary at %s (install Debian's etcd-server, or set TIDE_ETCD)\n", etcd.c_str());
    return 77;
  }
  if (::access(kOpenssl.c_str(), X_OK) != 0) {
    std::printf("SKIP: no %s (install Debian's openssl)\n", kOpenssl.c_str());
    return 77;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
