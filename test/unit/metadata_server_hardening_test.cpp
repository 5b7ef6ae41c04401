// tide-metadata-server's bounds and write token (review finding 11), against
// the real binary in a child process: a key flood and oversize values stay
// within their bounds (the server's RSS is measured and printed), connections
// over the limit get a 503, slow clients are dropped, PUT/DELETE need the
// bearer token when one is configured, and a Mooncake-style client (plain
// GET/PUT, no token) still works when none is.

#include <tide/policy/http.hpp>

#include "../../src/metadata/http_client.hpp"
#include "support/process.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>

using namespace tide;
using namespace std::chrono_literals;
using tide::test::elapsed_ms;
using clock_type = std::chrono::steady_clock;

namespace {

std::string server_binary() {
  const char* p = std::getenv("TIDE_METADATA_SERVER");
  REQUIRE_MESSAGE(p != nullptr, "TIDE_METADATA_SERVER is not set (meson test sets it)");
  return p;
}

class server_process {
 public:
  explicit server_process(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv{server_binary(), "--host", "127.0.0.1", "--port", "0"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    proc_ = tide::test::child_process(argv, log());
    auto line = proc_.wait_for_log("listening on 127.0.0.1:", 5000ms);
    REQUIRE_MESSAGE(line.has_value(), "tide-metadata-server did not start; see " << log());
    const auto colon = line->rfind(':');
    port_ = static_cast<std::uint16_t>(std::stoi(line->substr(colon + 1)));
  }
  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/metadata"; }
  std::size_t rss() const { return tide::test::resident_bytes(proc_.pid()); }
  std::string log() const { return (dir_.path() / "server.log").string(); }
  const std::filesystem::path& dir() const { return dir_.path(); }

  detail::http_reply request(const std::string& method, const std::string& key, const std::string& body = {},
                             std::string authorization = {}) const {
    detail::http_request_options o;
    o.authorization = std::move(authorization);
    auto r = detail::http_request("127.0.0.1", port_, method, "/metadata?key=" + detail::url_escape(key), body,
                                  body.empty() ? "" : "application/json", 5000ms, o);
    REQUIRE_MESSAGE(r.has_value(), r.error());
    return *r;
  }

 private:
  tide::test::temp_dir dir_;
  tide::test::child_process proc_;
  std::uint16_t port_ = 0;
};

std::string write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
  REQUIRE(out.good());
  return p.string();
}

constexpr double kMiB = 1024.0 * 1024.0;

}  // namespace

TEST_CASE("a key flood stops at max_keys (507 naming it) and the server's RSS stays bounded") {
  server_process s{{"--max-keys", "1000", "--max-value-bytes", "1048576"}};
  const std::string value(64 * 1024, 'v');
  const std::size_t before = s.rss();
  int ok = 0;
  int full = 0;
  std::string refusal;
  constexpr int kFlood = 2500;  // 160 MiB if nothing bounded it; 64 MiB kept
  for (int i = 0; i < kFlood; ++i) {
    const auto r = s.request("PUT", "flood/" + std::to_string(i), value);
    if (r.status == 200) {
      ++ok;
    } else {
      REQUIRE(r.status == 507);
      ++full;
      refusal = r.body;
    }
  }
  const std::size_t after = s.rss();
  MESSAGE("key flood: " << ok << " stored, " << full << " refused (" << refusal.substr(0, refusal.size() - 1)
                        << "); server RSS " << before / kMiB << " MiB -> " << after / kMiB << " MiB");
  CHECK(ok == 1000);
  CHECK(full == kFlood - 1000);
  CHECK(refusal.find("max_keys = 1000") != std::string::npos);
  CHECK(after - std::min(after, before) < std::size_t{120} << 20);
  // Stored keys still read and overwrite; a delete makes room for a new key.
  CHECK(s.request("GET", "flood/999").body == value);
  CHECK(s.request("PUT", "flood/0", "{}").status == 200);
  CHECK(s.request("DELETE", "flood/1").status == 200);
  CHECK(s.request("PUT", "flood/new", "{}").status == 200);
  CHECK(s.request("PUT", "flood/newer", "{}").status == 507);
}

TEST_CASE("max_total_bytes bounds what is stored, overwrites included") {
  server_process s{{"--max-total-bytes", "200000"}};
  const std::string value(90000, 'v');
  CHECK(s.request("PUT", "a", value).status == 200);
  CHECK(s.request("PUT", "b", value).status == 200);
  const auto r = s.request("PUT", "c", value);
  CHECK(r.status == 507);
  CHECK(r.body.find("max_total_bytes = 200000") != std::string::npos);
  CHECK(s.request("PUT", "a", value + value).status == 507);  // growing a key counts too
  CHECK(s.request("PUT", "a", "{}").status == 200);           // shrinking it frees room
  CHECK(s.request("PUT", "c", value).status == 200);
}

TEST_CASE("values over max_value_bytes get 413 naming the bound without being buffered") {
  server_process s{{"--max-value-bytes", "1048576"}};
  const std::size_t before = s.rss();
  const std::string chunk(1 << 20, 'x');
  for (int i = 0; i < 16; ++i) {
    // Announces 64 MiB, sends 1 MiB: the server answers from the header.
    tide::test::raw_client c{s.port()};
    c.send("PUT /metadata?key=big HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(64 << 20) + "\r\n\r\n");
    c.send(chunk);
    const auto r = c.read_until_eof(5000ms);
    REQUIRE(r.data.starts_with("HTTP/1.1 413"));
    CHECK(r.data.find("max_value_bytes = 1048576") != std::string::npos);
  }
  const auto small = s.request("PUT", "big", std::string((1 << 20) + 1, 'y'));
  CHECK(small.status == 413);
  CHECK(s.request("GET", "big").status == 404);
  CHECK(s.request("PUT", "big", std::string(1 << 20, 'y')).status == 200);  // exactly the bound is allowed
  const std::size_t after = s.rss();
  MESSAGE("16 x 64 MiB announced: server RSS " << before / kMiB << " MiB -> " << after / kMiB << " MiB");
  CHECK(after - std::min(after, before) < std::size_t{32} << 20);
}

TEST_CASE("connections over max_connections get a 503 naming the bound; idle and trickling clients are dropped") {
  server_process s{{"--max-connections", "4", "--request-timeout-ms", "500"}};
  std::vector<std::unique_ptr<tide::test::raw_client>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<tide::test::raw_client>(s.port()));
  std::this_thread::sleep_for(100ms);  // let the server accept them
  {
    tide::test::raw_client fifth{s.port()};
    const auto r = fifth.read_until_eof(2000ms);
    MESSAGE("fifth connection: " << r.data.substr(0, r.data.find("\r\n")));
    CHECK(r.data.starts_with("HTTP/1.1 503"));
    CHECK(r.data.find("max_connections = 4") != std::string::npos);
  }
  const auto t0 = clock_type::now();
  for (auto& c : idle) CHECK(c->read_until_eof(3000ms).eof);
  const auto dropped = elapsed_ms(t0);
  CHECK(dropped < 2000);
  idle.clear();

  // A client sending its request one byte every 100 ms is dropped at the
  // request timeout, not kept alive by the trickle.
  tide::test::raw_client slow{s.port()};
  const std::string request = "GET /metadata?key=k HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(200, 'p') + "\r\n\r\n";
  const auto t1 = clock_type::now();
  bool closed = false;
  for (std::size_t i = 0; i < request.size() && elapsed_ms(t1) < 5000; ++i) {
    if (!slow.send(request.substr(i, 1))) {
      closed = true;
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  const auto trickled = elapsed_ms(t1);
  MESSAGE("idle clients dropped after " << dropped << " ms; the trickling client after " << trickled << " ms");
  CHECK(closed);
  CHECK(trickled < 2500);
  CHECK(s.request("GET", "k").status == 404);  // the slots are free again
}

TEST_CASE("with --token-file, PUT/DELETE need the bearer token (401 otherwise, nothing changes); GET stays open") {
  tide::test::temp_dir dir;
  const auto token_file = write_file(dir.path() / "token", "tok-4f9a2c\n");
  server_process s{{"--token-file", token_file}};

  auto none = s.request("PUT", "k", "{\"v\":1}");
  CHECK(none.status == 401);
  CHECK(none.body.find("Bearer") != std::string::npos);
  CHECK(s.request("PUT", "k", "{\"v\":1}", "Bearer wrong").status == 401);
  CHECK(s.request("PUT", "k", "{\"v\":1}", "tok-4f9a2c").status == 401);  // the scheme is part of it
  CHECK(s.request("GET", "k").status == 404);

  CHECK(s.request("PUT", "k", "{\"v\":1}", "Bearer tok-4f9a2c").status == 200);
  CHECK(s.request("PUT", "k", "{\"v\":2}", "Bearer tok-4f9a2").status == 401);
  CHECK(s.request("DELETE", "k").status == 401);
  const auto got = s.request("GET", "k");  // no token needed to read
  CHECK(got.status == 200);
  CHECK(got.body == "{\"v\":1}");

  SUBCASE("policy::http with metadata_config::token_file") {
    metadata_config c;
    c.connection = s.url();
    c.timeout = 2000ms;
    c.token_file = token_file;
    policy::http b{c};
    REQUIRE(b.put_segment("10.0.0.1:1", "{}").has_value());
    CHECK(*b.get_segment("10.0.0.1:1") == "{}");
    REQUIRE(b.remove_segment("10.0.0.1:1").has_value());

    c.token_file = write_file(dir.path() / "wrong", "not-it\n");
    auto wrong = policy::http{c}.put_segment("x", "{}");
    REQUIRE_FALSE(wrong.has_value());
    CHECK(wrong.error().code == errc::metadata_unavailable);
    CHECK(wrong.error().detail.find("401") != std::string::npos);
    CHECK(wrong.error().detail.find("not-it") == std::string::npos);
    MESSAGE(wrong.error().detail);

    c.token_file.clear();
    CHECK_FALSE(policy::http{c}.put_segment("x", "{}").has_value());
    CHECK(policy::http{c}.get_segment("10.0.0.1:1").error().code == errc::segment_not_found);

    c.token_file = (dir.path() / "missing").string();
    auto missing = policy::http{c}.get_segment("x");
    CHECK(missing.error().code == errc::config_invalid);
    CHECK(missing.error().detail.find("metadata_token_file") != std::string::npos);
  }
  SUBCASE("DELETE with the token") {
    CHECK(s.request("DELETE", "k", {}, "Bearer tok-4f9a2c").status == 200);
    CHECK(s.request("GET", "k").status == 404);
  }
}

TEST_CASE("tide-metadata-server refuses an unreadable token file and zero bounds") {
  tide::test::temp_dir dir;
  const std::string log = (dir.path() / "log").string();
  CHECK(tide::test::run_to_completion({server_binary(), "--port", "0", "--token-file", (dir.path() / "none").string()},
                                      log, 5000ms) == 1);
  CHECK(tide::test::run_to_completion({server_binary(), "--port", "0", "--max-keys", "0"}, log, 5000ms) == 2);
  write_file(dir.path() / "empty", "\n");
  CHECK(tide::test::run_to_completion({server_binary(), "--port", "0", "--token-file", (dir.path() / "empty").string()},
                                      log, 5000ms) == 1);
  std::ifstream in(log);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  MESSAGE(text);
  CHECK(text.find("token_file") != std::string::npos);
}

TEST_CASE("without a token, a Mooncake-style client's plain PUT and GET work as before") {
  server_process s;
  const std::string desc = R"({"name":"10.0.0.2:16002","protocol":"rdma"})";
  {
    tide::test::raw_client c{s.port()};
    c.send("PUT /metadata?key=mooncake%2Fram%2F10.0.0.2%3A16002 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n"
           "Content-Type: application/json\r\nContent-Length: " +
           std::to_string(desc.size()) + "\r\nConnection: close\r\n\r\n" + desc);
    const auto r = c.read_until_eof(3000ms);
    CHECK(r.data.starts_with("HTTP/1.1 200"));
    CHECK(r.data.find("metadata updated") != std::string::npos);
  }
  tide::test::raw_client c{s.port()};
  c.send("GET /metadata?key=mooncake%2Fram%2F10.0.0.2%3A16002 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  const auto r = c.read_until_eof(3000ms);
  CHECK(r.data.starts_with("HTTP/1.1 200"));
  CHECK(r.data.ends_with(desc));
}
