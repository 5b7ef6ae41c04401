#include "report.hpp"

#include <nlohmann/json.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace tide::bench {

double process_cpu_seconds() noexcept {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return secs(ru.ru_utime) + secs(ru.ru_stime);
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Less an epsilon: 99.9 % of 1000 is 999, not the 999.0000001 that double arithmetic gives.
  const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()) - 1e-9));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

summary summarize(run_figures f, const bench_options& o) {
  summary s;
  if (f.seconds > 0) {
    s.throughput = static_cast<double>(f.bytes) / o.unit.bytes_per_unit / f.seconds;
    s.requests_per_s = static_cast<double>(f.requests) / f.seconds;
  }
  s.p50_us = percentile(f.batch_latency_us, 50);
  s.p99_us = percentile(f.batch_latency_us, 99);
  s.p999_us = percentile(f.batch_latency_us, 99.9);
  if (f.bytes > 0) s.cpu_s_per_gb = f.cpu_seconds / (static_cast<double>(f.bytes) / 1e9);
  return s;
}

std::string format_report(const summary& s, const run_figures& f, const bench_options& o) {
  char buf[768];
  std::snprintf(buf, sizeof buf,
                "Test completed: duration %.2f s, batch count %zu, throughput %.3f %s/s\n"
                "  operation %s, block %llu B, batch %u, threads %u, policy %s\n"
                "  requests/s %.0f, failed requests %llu\n"
                "  batch latency p50 %.1f us, p99 %.1f us, p999 %.1f us\n"
                "  cpu %.2f s (%.2f s per GB)\n",
                f.seconds, f.batch_latency_us.size(), s.throughput, o.unit.name.c_str(),
                o.operation == bench_operation::read ? "read" : "write",
                static_cast<unsigned long long>(o.block_size), o.batch_size, o.threads, o.policy.c_str(),
                s.requests_per_s, static_cast<unsigned long long>(f.failed_requests), s.p50_us, s.p99_us,
                s.p999_us, f.cpu_seconds, s.cpu_s_per_gb);
  std::string out = buf;
  std::uint64_t all = 0;
  for (const auto& n : f.nics) all += n.bytes;
  for (const auto& n : f.nics) {
    std::snprintf(buf, sizeof buf, "  nic %s: %.1f MB (%.1f %%), %llu WRs, %llu errors\n", n.name.c_str(),
                  static_cast<double>(n.bytes) / 1e6, all ? 100.0 * static_cast<double>(n.bytes) / static_cast<double>(all) : 0.0,
                  static_cast<unsigned long long>(n.wrs), static_cast<unsigned long long>(n.errors));
    out += buf;
  }
  for (const auto& r : f.rails) {
    std::snprintf(buf, sizeof buf, "  rail %s -> %s: %s, %llu failures, %llu pauses\n", r.local.c_str(), r.peer.c_str(),
                  r.state.c_str(), static_cast<unsigned long long>(r.failures), static_cast<unsigned long long>(r.pauses));
    out += buf;
  }
  return out;
}

std::string format_json(const summary& s, const run_figures& f, const bench_options& o) {
  nlohmann::json j = {
      {"operation", o.operation == bench_operation::read ? "read" : "write"},
      {"block_size", o.block_size},
      {"batch_size", o.batch_size},
      {"threads", o.threads},
      {"policy", o.policy},
      {"duration_s", f.seconds},
      {"bytes", f.bytes},
      {"requests", f.requests},
      {"failed_requests", f.failed_requests},
      {"batches", f.batch_latency_us.size()},
      {"throughput", s.throughput},
      {"unit", o.unit.name + "/s"},
      {"bytes_per_s", f.seconds > 0 ? static_cast<double>(f.bytes) / f.seconds : 0.0},
      {"requests_per_s", s.requests_per_s},
      {"p50_us", s.p50_us},
      {"p99_us", s.p99_us},
      {"p999_us", s.p999_us},
      {"open_segment_ms", f.open_segment_ms},
      {"first_batch_us", f.first_batch_us},
      {"cpu_seconds", f.cpu_seconds},
      {"cpu_s_per_gb", s.cpu_s_per_gb},
  };
  j["nics"] = nlohmann::json::array();
  for (const auto& n : f.nics)
    j["nics"].push_back({{"name", n.name}, {"bytes", n.bytes}, {"wrs", n.wrs}, {"errors", n.errors}, {"bandwidth_bps", n.bandwidth_bps}});
  j["rails"] = nlohmann::json::array();
  for (const auto& r : f.rails)
    j["rails"].push_back({{"local", r.local}, {"peer", r.peer}, {"state", r.state}, {"failures", r.failures}, {"pauses", r.pauses}});
  return j.dump(2) + "\n";
}

}  // namespace tide::bench
