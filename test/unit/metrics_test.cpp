// Metrics (issue 18 parts 3-4): the latency histogram, the transfer meter,
// the batch roll-up of telemetry, the Prometheus formatter (escaping,
// cumulative buckets, every line parseable) and the HTTP endpoint.
#include <tide/engine.hpp>
#include <tide/metrics.hpp>
#include <tide/rdma/detail/task_telemetry.hpp>

#include <doctest/doctest.h>

#include "support/loopback_http.hpp"

#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace tide;

namespace {

// A Prometheus text-format parser, strict enough to catch what the format
// forbids: a sample before its family's TYPE, a bad name, a bad label
// block, an unparseable value, a family declared twice.
struct parsed_sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
struct parsed {
  std::map<std::string, std::string> types;  // family -> type
  std::vector<parsed_sample> samples;
  std::string error;  // "" = every line parsed
};

std::string family_of(const std::string& name, const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      if (auto it = types.find(base); it != types.end() && it->second == "histogram") return base;
    }
  }
  return name;
}

parsed parse(const std::string& text) {
  parsed out;
  const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  std::istringstream in(text);
  std::string line;
  int n = 0;
  std::set<std::string> helped;
  while (std::getline(in, line)) {
    ++n;
    auto bad = [&](const std::string& why) {
      if (out.error.empty()) out.error = "line " + std::to_string(n) + ": " + why + ": " + line;
    };
    if (line.empty()) {
      bad("empty line");
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      const std::string name = rest.substr(0, rest.find(' '));
      if (!std::regex_match(name, name_re)) bad("bad HELP name");
      if (!helped.insert(name).second) bad("second HELP");
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type, extra;
      t >> name >> type;
      if (!std::regex_match(name, name_re)) bad("bad TYPE name");
      if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped")
        bad("bad type");
      if (t >> extra) bad("text after the type");
      if (out.types.count(name) != 0) bad("second TYPE");
      out.types[name] = type;
      continue;
    }
    if (line[0] == '#') continue;
    parsed_sample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    if (!std::regex_match(s.name, name_re)) bad("bad metric name");
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::size_t eq = line.find('=', i);
        if (eq == std::string::npos) {
          bad("label without =");
          break;
        }
        const std::string lname = line.substr(i, eq - i);
        if (!std::regex_match(lname, std::regex("[a-zA-Z_][a-zA-Z0-9_]*"))) bad("bad label name");
        if (eq + 1 >= line.size() || line[eq + 1] != '"') {
          bad("label value not quoted");
          break;
        }
        std::string v;
        std::size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            if (++j >= line.size()) break;
            if (line[j] == 'n') v += '\n';
            else if (line[j] == '\\' || line[j] == '"') v += line[j];
            else bad("bad escape");
          } else {
            v += line[j];
          }
        }
        if (j >= line.size()) {
          bad("unterminated label value");
          break;
        }
        s.labels[lname] = v;
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) {
        bad("unterminated label block");
        continue;
      }
      ++i;  // '}'
    }
    if (i >= line.size() || line[i] != ' ') {
      bad("no space before the value");
      continue;
    }
    const std::string value = line.substr(i + 1);
    if (value == "+Inf") s.value = 1e308;
    else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0') bad("value does not parse");
    }
    if (out.types.count(family_of(s.name, out.types)) == 0) bad("sample before its TYPE");
    out.samples.push_back(std::move(s));
  }
  return out;
}

metrics::inputs sample_inputs() {
  metrics::inputs in;
  rdma::plan::nic_stats a;
  a.name = "rxe0";
  a.bytes = 123456;
  a.wrs = 17;
  a.errors = 2;
  a.inflight_bytes = 4096;
  a.inflight_wrs = 1;
  a.bandwidth_bps = 1.25e9;
  rdma::plan::nic_stats b = a;
  b.name = "we\"ird\\nic\nname";  // every character the format escapes
  in.transport.nics = {a, b};
  rdma::plan::rail_stats r;
  r.local = "rxe0";
  r.peer = "10.0.0.2:15001@rxe1";
  r.state.phase = rdma::plan::rail_phase::paused;
  r.state.failures = 3;
  r.state.pauses = 1;
  in.transport.rails = {r};
  transfer_meter m;
  m.record(transfer_op::write, 4096, 15'000, transfer_state::completed, errc::ok);
  m.record(transfer_op::write, 4096, 15'000, transfer_state::completed, errc::ok);
  m.record(transfer_op::write, 4000, 3'000'000, transfer_state::completed, errc::ok);
  m.record(transfer_op::read, 1u << 20, 60'000'000'000, transfer_state::timeout, errc::timed_out);
  m.record(transfer_op::read, 100, 700, transfer_state::failed, errc::transport_retry_exceeded);
  m.record(transfer_op::write, 65536, 20'000, transfer_state::completed, errc::ok,
           transfer_telemetry::kViaRdma | transfer_telemetry::kViaTcp);  // failed over
  m.record(transfer_op::write, 65536, 20'000, transfer_state::completed, errc::ok, transfer_telemetry::kViaTcp);
  in.tasks = m.read();
  in.server.accepted = 5;
  in.server.served = 9;
  in.server.auth_failed = 1;
  in.client = {4, 1, 2};
  in.notify.accepted = 7;
  in.notify.dropped_rate = 3;
  in.notify.duplicates = 2;
  tcp::stats t;
  t.ops_ok = 11;
  t.ops_failed = 1;
  t.bytes_written = 65536;
  t.bytes_served_out = 4096;
  t.refused_source = 492;
  t.open_connections = 3;
  in.tcp = t;
  return in;
}

const parsed_sample* find(const parsed& p, const std::string& name, const std::map<std::string, std::string>& labels) {
  for (const auto& s : p.samples) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) all &= s.labels.count(k) != 0 && s.labels.at(k) == v;
    if (all) return &s;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("latency_histogram: bucket bounds are inclusive, +Inf catches the rest, quantiles name the bucket") {
  CHECK(latency_histogram::bucket_of(0) == 0);
  CHECK(latency_histogram::bucket_of(1'000) == 0);
  CHECK(latency_histogram::bucket_of(1'001) == 1);
  CHECK(latency_histogram::bucket_of(10'000'000'000) == latency_histogram::kBoundsNs.size() - 1);
  CHECK(latency_histogram::bucket_of(10'000'000'001) == latency_histogram::kBuckets - 1);
  latency_histogram h;
  for (int i = 0; i < 90; ++i) h.record(1'500);         // 2 us bucket
  for (int i = 0; i < 9; ++i) h.record(150'000);        // 200 us bucket
  h.record(20'000'000'000);                             // +Inf
  h.record(-5);                                         // a clock step back counts as 0
  const auto s = h.read();
  CHECK(s.count() == 101);
  CHECK(s.sum_ns == 90ull * 1'500 + 9ull * 150'000 + 20'000'000'000ull);
  CHECK(s.buckets[0] == 1);
  CHECK(s.buckets[1] == 90);
  CHECK(s.quantile_bound_ns(0.5) == 2'000);
  CHECK(s.quantile_bound_ns(0.95) == 200'000);
  CHECK(s.quantile_bound_ns(1.0) == -1);
  CHECK(latency_histogram::snapshot{}.quantile_bound_ns(0.5) == 0);
}

TEST_CASE("transfer_meter: op, size class, final state and reason") {
  CHECK(size_class_of(0) == 0);
  CHECK(size_class_of(4096) == 0);
  CHECK(size_class_of(4097) == 1);
  CHECK(size_class_of(1u << 20) == 2);
  CHECK(size_class_of((1u << 20) + 1) == 3);
  const auto s = sample_inputs().tasks;
  CHECK(s.latency[1][0].count() == 3);  // write <= 4 KiB
  CHECK(s.latency[0][2].count() == 1);  // read <= 1 MiB
  CHECK(s.latency[0][0].count() == 1);
  CHECK(s.finals[0] == 5);
  CHECK(s.carried[0] == 1);  // rdma: the one failed over
  CHECK(s.carried[1] == 2);  // tcp: both
  CHECK(s.finals[1] == 1);
  CHECK(s.finals[2] == 1);
  CHECK(s.reasons[errc_slot(errc::timed_out)] == 1);
  CHECK(s.reasons[errc_slot(errc::transport_retry_exceeded)] == 1);
  CHECK(s.reasons[errc_slot(errc::ok)] == 0);  // completed tasks have no reason
  // Every errc has its own slot.
  std::set<std::size_t> slots;
  for (int v : {100, 123, 200, 215, 300, 310, 400, 404}) slots.insert(errc_slot(static_cast<errc>(v)));
  CHECK(slots.size() == 8);
}

TEST_CASE("batch telemetry: earliest submit and post, latest completion once all are final, sums and unions") {
  using tp = transfer_telemetry::time_point;
  using std::chrono::microseconds;
  transfer_telemetry a, b, sum;
  a.submit = tp{microseconds{10}};
  a.first_post = tp{microseconds{12}};
  a.completion = tp{microseconds{30}};
  a.bytes = 100;
  a.wrs = 2;
  a.tasks = 1;
  a.local_nics = 1;
  a.peer_nics = 2;
  a.state = transfer_state::completed;
  b = a;
  b.submit = tp{microseconds{9}};
  b.first_post = tp{microseconds{20}};
  b.completion = {};
  b.state = transfer_state::pending;
  b.local_nics = 2;
  b.retries = 1;
  rdma::detail::add_telemetry(sum, a);
  rdma::detail::add_telemetry(sum, b);
  CHECK(sum.submit == tp{microseconds{9}});
  CHECK(sum.first_post == tp{microseconds{12}});
  CHECK(sum.completion == tp{});  // b is not final
  CHECK(sum.state == transfer_state::pending);
  CHECK(sum.bytes == 200);
  CHECK(sum.wrs == 4);
  CHECK(sum.retries == 1);
  CHECK(sum.tasks == 2);
  CHECK(sum.local_nics == 3);
  b.completion = tp{microseconds{40}};
  b.state = transfer_state::failed;
  b.reason = errc::timed_out;
  transfer_telemetry done;
  rdma::detail::add_telemetry(done, a);
  rdma::detail::add_telemetry(done, b);
  CHECK(done.completion == tp{microseconds{40}});
  CHECK(done.state == transfer_state::failed);
  CHECK(done.reason == errc::timed_out);
  CHECK(done.latency() == std::chrono::microseconds{31});
}

TEST_CASE("task telemetry: stamps of the data path") {
  rdma::detail::batch_state b(2);
  transfer_meter m;
  b.meter = &m;
  auto& t = b.tasks[0];
  rdma::detail::reset_task(t, 2, 0, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  rdma::detail::start_telemetry(t, transfer_op::read, 70000, 1'000);
  b.unfinished.store(1);
  rdma::detail::note_posted(t, 1, 3, 2'000);
  rdma::detail::note_posted(t, 1, 70, 5'000);  // a peer index past 63 lands on bit 63
  rdma::detail::note_retry(t);
  auto mid = rdma::detail::telemetry_of(t);
  CHECK(mid.completion == transfer_telemetry::time_point{});
  CHECK(mid.first_post == rdma::detail::from_ns(2'000));
  CHECK(mid.wrs == 2);
  CHECK(mid.retries == 1);
  CHECK(mid.local_nics == 2u);
  CHECK(mid.peer_nics == ((std::uint64_t{1} << 3) | (std::uint64_t{1} << 63)));
  CHECK(rdma::detail::finish_task(t, transfer_state::completed));
  const auto fin = rdma::detail::telemetry_of(t);
  CHECK(fin.state == transfer_state::completed);
  CHECK(fin.completion > fin.first_post);
  CHECK(fin.bytes == 70000);
  const auto ms = m.read();
  CHECK(ms.latency[0][2].count() == 1);  // read, <= 1 MiB
  CHECK(ms.finals[0] == 1);
}

TEST_CASE("metrics::escape_label_value and seconds_text") {
  CHECK(metrics::escape_label_value("plain") == "plain");
  CHECK(metrics::escape_label_value("a\"b\\c\nd") == "a\\\"b\\\\c\\nd");
  CHECK(metrics::seconds_text(1'000) == "1e-06");
  CHECK(metrics::seconds_text(250'000'000) == "0.25");
  CHECK(metrics::seconds_text(10'000'000'000) == "10");
  CHECK(metrics::seconds_text(123'456'789) == "0.123456789");
}

TEST_CASE("metrics::format: every line parses, TYPE before samples, escaped labels, cumulative buckets") {
  const auto in = sample_inputs();
  const std::string text = metrics::format(in);
  const parsed p = parse(text);
  INFO(text);
  REQUIRE_MESSAGE(p.error.empty(), p.error);
  // Every family has HELP and TYPE; counters end in _total.
  for (const auto& [name, type] : p.types) {
    CHECK(name.rfind("tide_", 0) == 0);
    if (type == "counter") CHECK(name.size() > 6);
    if (type == "counter") CHECK(name.compare(name.size() - 6, 6, "_total") == 0);
  }
  // The escaped NIC name reads back as it was.
  const auto* odd = find(p, "tide_nic_bytes_total", {{"nic", "we\"ird\\nic\nname"}});
  REQUIRE(odd != nullptr);
  CHECK(odd->value == 123456);
  CHECK(text.find("nic=\"we\\\"ird\\\\nic\\nname\"") != std::string::npos);
  // Rail state: 1 for paused, 0 for the others.
  CHECK(find(p, "tide_rail_state", {{"state", "paused"}})->value == 1);
  CHECK(find(p, "tide_rail_state", {{"state", "healthy"}})->value == 0);
  CHECK(find(p, "tide_rail_state", {{"state", "local_nic_down"}})->value == 0);
  CHECK(find(p, "tide_nic_up", {{"nic", "rxe0"}})->value == 1);
  CHECK(find(p, "tide_rail_failures_total", {{"peer_nic", "10.0.0.2:15001@rxe1"}})->value == 3);
  CHECK(find(p, "tide_task_errors_total", {{"reason", "timed_out"}})->value == 1);
  CHECK(find(p, "tide_task_errors_total", {{"reason", "transport_retry_exceeded"}})->value == 1);
  CHECK(find(p, "tide_handshake_client_total", {{"result", "auth_failed"}})->value == 2);
  CHECK(find(p, "tide_notify_refused_total", {{"bound", "rate"}})->value == 3);
  CHECK(find(p, "tide_notify_duplicates_total", {})->value == 2);
  CHECK(find(p, "tide_tasks_carried_total", {{"transport", "tcp"}})->value == 2);
  CHECK(find(p, "tide_tasks_carried_total", {{"transport", "rdma"}})->value == 1);
  CHECK(find(p, "tide_tcp_requests_total", {{"result", "ok"}})->value == 11);
  CHECK(find(p, "tide_tcp_bytes_total", {{"direction", "served_out"}})->value == 4096);
  CHECK(find(p, "tide_tcp_connections_total", {{"event", "refused_source"}})->value == 492);
  CHECK(find(p, "tide_tcp_server_open_connections", {})->value == 3);
  // Histograms: cumulative, +Inf == _count, for every (op, size class).
  int series = 0;
  for (const char* op : {"read", "write"})
    for (std::size_t c = 0; c < kSizeClasses; ++c) {
      const std::string cls(size_class_name(c));
      double prev = 0, inf = -1;
      std::size_t buckets = 0;
      for (const auto& s : p.samples) {
        if (s.name != "tide_transfer_latency_seconds_bucket" || s.labels.at("op") != op ||
            s.labels.at("size_class") != cls)
          continue;
        ++buckets;
        CHECK(s.value >= prev);
        prev = s.value;
        if (s.labels.at("le") == "+Inf") inf = s.value;
      }
      CHECK(buckets == latency_histogram::kBuckets);
      const auto* count = find(p, "tide_transfer_latency_seconds_count", {{"op", op}, {"size_class", cls}});
      REQUIRE(count != nullptr);
      CHECK(count->value == inf);
      ++series;
    }
  CHECK(series == 8);
  // The three 4 KiB writes: two at 15 us (le 2e-05), one at 3 ms (le 0.005).
  CHECK(find(p, "tide_transfer_latency_seconds_bucket", {{"op", "write"}, {"size_class", "4KiB"}, {"le", "1e-05"}})->value == 0);
  CHECK(find(p, "tide_transfer_latency_seconds_bucket", {{"op", "write"}, {"size_class", "4KiB"}, {"le", "2e-05"}})->value == 2);
  CHECK(find(p, "tide_transfer_latency_seconds_bucket", {{"op", "write"}, {"size_class", "4KiB"}, {"le", "0.005"}})->value == 3);
  CHECK(find(p, "tide_transfer_latency_seconds_sum", {{"op", "write"}, {"size_class", "4KiB"}})->value ==
        doctest::Approx(0.00303));
  // The 60 s read is past the last bound: only +Inf holds it.
  CHECK(find(p, "tide_transfer_latency_seconds_bucket", {{"op", "read"}, {"size_class", "1MiB"}, {"le", "10"}})->value == 0);
  CHECK(find(p, "tide_transfer_latency_seconds_bucket", {{"op", "read"}, {"size_class", "1MiB"}, {"le", "+Inf"}})->value == 1);
}

TEST_CASE("metrics::format: no rails, no errors: those families are left out, the rest still parses") {
  metrics::inputs in;
  in.transport.nics.push_back({"rxe0", 1, 1, 0, 0, 0, 0, 0});
  const std::string text = metrics::format(in);
  const parsed p = parse(text);
  REQUIRE_MESSAGE(p.error.empty(), p.error);
  CHECK(p.types.count("tide_rail_state") == 0);
  CHECK(p.types.count("tide_task_errors_total") == 0);
  CHECK(p.types.count("tide_tcp_requests_total") == 0);  // TCP not installed
  CHECK(p.types.at("tide_transfer_latency_seconds") == "histogram");
}

TEST_CASE("metrics::format: a disabled local NIC reads local_nic_down on its rails, whatever their health") {
  auto in = sample_inputs();
  in.nic_active = {0, 1};  // rxe0 (the rail's local NIC) down
  const parsed p = parse(metrics::format(in));
  REQUIRE_MESSAGE(p.error.empty(), p.error);
  CHECK(find(p, "tide_nic_up", {{"nic", "rxe0"}})->value == 0);
  CHECK(find(p, "tide_nic_up", {{"nic", "we\"ird\\nic\nname"}})->value == 1);
  CHECK(find(p, "tide_rail_state", {{"state", "local_nic_down"}})->value == 1);
  CHECK(find(p, "tide_rail_state", {{"state", "paused"}})->value == 0);
  CHECK(find(p, "tide_rail_state", {{"state", "healthy"}})->value == 0);
}

using tide::test::http_exchange;

TEST_CASE("metrics::http_server: GET /metrics, 404 elsewhere, 405 for POST, oversized requests refused") {
  int calls = 0;
  auto s = metrics::http_server::start("127.0.0.1", 0, [&] {
    ++calls;
    return std::string("tide_x_total 1\n");
  });
  REQUIRE(s);
  const std::uint16_t port = (*s)->port();
  REQUIRE(port != 0);
  const std::string ok = http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(ok.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(ok.find("\r\n\r\ntide_x_total 1\n") != std::string::npos);
  CHECK(http_exchange(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.0 200", 0) == 0);
  CHECK(http_exchange(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").rfind("HTTP/1.1 404", 0) == 0);
  CHECK(http_exchange(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
  const std::string huge = "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n";
  CHECK(http_exchange(port, huge).find("200") == std::string::npos);
  CHECK(calls == 2);
  // Still serving after the bad ones.
  CHECK(http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").rfind("HTTP/1.1 200", 0) == 0);
  // A bad bind address is named; a taken port is already_exists.
  auto bad = metrics::http_server::start("localhost-ish", 0, [] { return std::string(); });
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::config_invalid);
  auto taken = metrics::http_server::start("127.0.0.1", port, [] { return std::string(); });
  REQUIRE_FALSE(taken);
  CHECK(taken.error().code == errc::already_exists);
}

TEST_CASE("engine_config: metrics_port and metrics_bind from JSON and the environment") {
  engine_config c;
  REQUIRE(c.apply_json(R"({"metrics_port": 9464, "metrics_bind": "0.0.0.0"})", "test"));
  CHECK(c.metrics_port == 9464);
  CHECK(c.metrics_bind == "0.0.0.0");
  auto r = c.apply_json(R"({"metrics_port": 70000})", "test");
  REQUIRE_FALSE(r);
  CHECK(r.error().detail.find("metrics_port") != std::string::npos);
  ::setenv("TIDE_METRICS_PORT", "9555", 1);
  REQUIRE(c.apply_env());
  CHECK(c.metrics_port == 9555);
  ::unsetenv("TIDE_METRICS_PORT");
  CHECK(engine_config{}.metrics_port == 0);  // off by default
  CHECK(engine_config{}.metrics_bind == "127.0.0.1");
}

// Review 1ab3d99 #11: metrics_text wrote six lines for every rail ever seen,
// so a node whose peers come and go grew every scrape without bound.
TEST_CASE("review 1ab3d99 #11: metrics list at most max_rails rails, the failed ones first, and count the rest") {
  metrics::inputs in;
  rdma::plan::nic_stats nic;
  nic.name = "rxe0";
  in.transport.nics = {nic};
  for (int i = 0; i < 1000; ++i) {
    rdma::plan::rail_stats r;
    r.local = "rxe0";
    r.peer = "10.0.0." + std::to_string(i) + ":15001@rxe1";
    if (i == 700) r.state.phase = rdma::plan::rail_phase::paused;
    if (i == 700 || i == 900) r.state.failures = 2;
    in.transport.rails.push_back(r);
  }
  in.max_rails = 10;
  const std::string text = metrics::format(in);
  const parsed p = parse(text);
  REQUIRE_MESSAGE(p.error.empty(), p.error);
  std::set<std::string> peers;
  for (const auto& s : p.samples)
    if (s.name.rfind("tide_rail_", 0) == 0) peers.insert(s.labels.at("peer_nic"));
  CHECK(peers.size() == 10);
  CHECK(peers.count("10.0.0.700:15001@rxe1") == 1);  // paused
  CHECK(peers.count("10.0.0.900:15001@rxe1") == 1);  // failed before
  CHECK(peers.count("10.0.0.0:15001@rxe1") == 1);    // then the others, in order
  CHECK(peers.count("10.0.0.8:15001@rxe1") == 0);
  CHECK(find(p, "tide_rails_omitted", {})->value == 990);
  CHECK(find(p, "tide_rail_state", {{"peer_nic", "10.0.0.700:15001@rxe1"}, {"state", "paused"}})->value == 1);
  // The default cap: a scrape of 1000 rails stays at kMaxRailSeries of them.
  in.max_rails = metrics::kMaxRailSeries;
  const parsed d = parse(metrics::format(in));
  REQUIRE(d.error.empty());
  CHECK(find(d, "tide_rails_omitted", {})->value == 1000 - static_cast<double>(metrics::kMaxRailSeries));
  // Under the cap every rail is listed and nothing is omitted.
  in.transport.rails.resize(5);
  const parsed all = parse(metrics::format(in));
  CHECK(find(all, "tide_rails_omitted", {})->value == 0);
  CHECK(find(all, "tide_rail_state", {{"peer_nic", "10.0.0.4:15001@rxe1"}, {"state", "healthy"}})->value == 1);
}
