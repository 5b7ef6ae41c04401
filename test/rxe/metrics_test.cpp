// Telemetry and metrics on a real data path (issue 18 parts 3-4): during
// traffic the HTTP endpoint is scraped with curl and promtool accepts what
// it serves; after the traffic the byte counters equal the bytes moved
// (exactly), the task counts and histogram counts equal the tasks run, and
// every task's telemetry is consistent (first_post >= submit, completion >=
// first_post, bytes == request length, wrs >= 1).  Every byte is verified.
#include <doctest/doctest.h>

#include <tide/engine.hpp>

#include "devices_under_test.hpp"
#include "rxe_helpers.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <optional>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using tide::transfer_op;
using tide::transfer_request;
using tide::transfer_state;

// A port nothing listens on right now (bound and released).
std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  socklen_t len = sizeof sa;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  ::close(fd);
  return ntohs(sa.sin_port);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// curl's answer to GET url into `path`; the HTTP status code ("000" when none).
std::string curl(const std::string& url, const std::string& path) {
  const std::string cmd = "curl -s -o " + path + " -w '%{http_code}' --max-time 10 " + url + " > " + path + ".code";
  (void)std::system(cmd.c_str());
  return read_file(path + ".code");
}

// promtool check metrics on a file: "" when it passes, else what it said;
// nullopt when promtool is not installed.
std::optional<std::string> promtool(const std::string& path) {
  if (::access("/usr/bin/promtool", X_OK) != 0) return std::nullopt;
  const std::string out = path + ".promtool";
  const int rc = std::system(("/usr/bin/promtool check metrics < " + path + " > " + out + " 2>&1").c_str());
  const std::string said = read_file(out);
  if (rc != 0 || !said.empty()) return "exit " + std::to_string(rc) + ": " + said;
  return std::string();
}

// Sum of the values of every sample of `name` whose label block contains `match`.
double sum_of(const std::string& text, const std::string& name, const std::string& match = "") {
  std::istringstream in(text);
  double sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;  // another family with this prefix
    if (!match.empty() && line.find(match) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

}  // namespace

TEST_CASE("metrics: scraped during traffic, promtool accepts them, the counters add up after it") {
  const auto devs = tide::test::devices_under_test();
  auto ca = tide::test::config_for({devs[0]});
  ca.metrics_port = free_port();
  auto a = tide::test::make_engine(ca);
  auto b = tide::test::make_engine(tide::test::config_for({devs[1]}));
  REQUIRE(a->metrics_port() == ca.metrics_port);
  constexpr std::size_t kSize = 8u << 20;
  tide::test::buffer la(kSize), lb(kSize);
  REQUIRE(a->register_memory(la.data, la.size, "cpu:0"));
  REQUIRE(b->register_memory(lb.data, lb.size, "cpu:0"));
  const auto seg = a->open_segment(b->segment_name()).value();
  const std::string url = "http://127.0.0.1:" + std::to_string(a->metrics_port());

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> moved{0}, tasks{0}, batches{0};
  std::atomic<int> bad{0};
  std::string first_bad;
  std::thread load([&] {
    std::mt19937_64 rng(18);
    for (std::uint64_t i = 0; !stop.load() || i < 50; ++i) {
      // 1-4 requests of random sizes up to 1.5 MiB in disjoint ranges, one op per batch.
      const auto op = i % 2 == 0 ? transfer_op::write : transfer_op::read;
      const std::size_t n = 1 + rng() % 4;
      std::vector<transfer_request> reqs;
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t len = 1 + rng() % (3u << 19);
        const std::size_t off = k * (2u << 20);
        unsigned char* src = op == transfer_op::write ? la.data : lb.data;
        unsigned char* dst = op == transfer_op::write ? lb.data : la.data;
        tide::test::fill(src + off, len, i * 8 + k);
        std::memset(dst + off, 0, len);
        reqs.push_back(transfer_request::at_address(op, la.data + off, seg, reinterpret_cast<std::uint64_t>(lb.data + off), len));
      }
      auto bid = a->allocate_batch(n).value();
      REQUIRE(a->submit(bid, reqs));
      REQUIRE(a->wait(bid, 60s));
      std::string why;
      for (std::size_t k = 0; k < n && why.empty(); ++k) {
        const auto st = a->status_of(bid, k).value();
        const auto t = a->task_telemetry(bid, k).value();
        if (st.state != transfer_state::completed) why = "task ended " + std::string(to_string(st.state));
        else if (t.state != transfer_state::completed) why = "telemetry state " + std::string(to_string(t.state));
        else if (t.submit == decltype(t.submit){}) why = "no submit time";
        else if (t.first_post < t.submit) why = "first_post before submit";
        else if (t.completion < t.first_post) why = "completion before first_post";
        else if (t.bytes != reqs[k].length || t.transferred_bytes != reqs[k].length) why = "bytes";
        else if (t.wrs < 1) why = "no WR";
        else if (t.local_nics != 1u || t.peer_nics == 0) why = "rails";
        unsigned char* src = op == transfer_op::write ? la.data : lb.data;
        unsigned char* dst = op == transfer_op::write ? lb.data : la.data;
        const std::size_t off = k * (2u << 20);
        if (why.empty() && std::memcmp(src + off, dst + off, reqs[k].length) != 0) why = "bytes differ";
      }
      const auto bt = a->batch_telemetry(bid).value();
      std::uint64_t want = 0;
      for (const auto& r : reqs) want += r.length;
      if (why.empty() && (bt.tasks != n || bt.bytes != want || bt.completion == decltype(bt.completion){} ||
                          bt.latency() <= std::chrono::nanoseconds{0}))
        why = "batch telemetry";
      REQUIRE(a->free_batch(bid));
      if (!why.empty()) {
        if (bad++ == 0) first_bad = "batch " + std::to_string(i) + ": " + why;
        continue;
      }
      moved += want;
      tasks += n;
      ++batches;
    }
  });

  // Three scrapes while it runs.
  for (int s = 0; s < 3; ++s) {
    std::this_thread::sleep_for(300ms);
    const std::string path = "/tmp/tide-metrics-scrape-" + std::to_string(s);
    REQUIRE(curl(url + "/metrics", path) == "200");
    const std::string text = read_file(path);
    CHECK(text.find("# TYPE tide_transfer_latency_seconds histogram") != std::string::npos);
    if (auto p = promtool(path)) CHECK_MESSAGE(p->empty(), "promtool: " << *p);
    else MESSAGE("promtool not installed: only curl's scrape checked");
  }
  CHECK(curl(url + "/nope", "/tmp/tide-metrics-404") == "404");
  stop = true;
  load.join();
  REQUIRE_MESSAGE(bad.load() == 0, first_bad);

  // The traffic has ended: every counter is exact now.
  const std::string path = "/tmp/tide-metrics-after";
  REQUIRE(curl(url + "/metrics", path) == "200");
  const std::string text = read_file(path);
  if (auto p = promtool(path)) CHECK_MESSAGE(p->empty(), "promtool: " << *p);
  MESSAGE(batches.load() << " batches, " << tasks.load() << " tasks, " << moved.load() << " bytes");
  CHECK(sum_of(text, "tide_nic_bytes_total") == static_cast<double>(moved.load()));
  CHECK(sum_of(text, "tide_tasks_total", "state=\"completed\"") == static_cast<double>(tasks.load()));
  CHECK(sum_of(text, "tide_tasks_total", "state=\"failed\"") == 0);
  CHECK(sum_of(text, "tide_transfer_latency_seconds_count") == static_cast<double>(tasks.load()));
  CHECK(sum_of(text, "tide_transfer_latency_seconds_bucket", "le=\"+Inf\"") == static_cast<double>(tasks.load()));
  CHECK(sum_of(text, "tide_nic_inflight_bytes") == 0);
  CHECK(sum_of(text, "tide_nic_inflight_work_requests") == 0);
  CHECK(sum_of(text, "tide_nic_work_requests_total") >= static_cast<double>(batches.load()));
  CHECK(sum_of(text, "tide_handshake_client_total", "result=\"ok\"") >= 1);
  CHECK(sum_of(text, "tide_rail_state", "state=\"healthy\"") >= 1);
  // The target's side: it accepted our handshake.
  const std::string tb = b->metrics_text();
  CHECK(sum_of(tb, "tide_handshake_server_requests_served_total") >= 1);
  CHECK(sum_of(tb, "tide_nic_bytes_total") == 0);  // it initiated nothing
  CHECK(b->metrics_port() == 0);                    // off by default
}
