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
  auto median_of = [&](double batch_phases::*field) {
    std::vector<double> v;
    v.reserve(f.phases.size());
    for (const auto& ph : f.phases) v.push_back(ph.*field);
    return percentile(v, 50);
  };
  s.phases_p50 = {median_of(&batch_phases::submit), median_of(&batch_phases::to_post),
                  median_of(&batch_phases::wire_and_poll), median_of(&batch_phases::wake),
                  median_of(&batch_phases::free)};
  if (f.bytes > 0) s.cpu_s_per_gb = f.cpu_seconds / (static_cast<double>(f.bytes) / 1e9);
  return s;
}

std::array<latency_histogram::snapshot, 2> latency_delta(const transfer_meter::snapshot& before,
                                                        const transfer_meter::snapshot& after) {
  std::array<latency_histogram::snapshot, 2> out{};
  for (std::size_t op = 0; op < 2; ++op)
    for (std::size_t c = 0; c < kSizeClasses; ++c) {
      const auto& a = after.latency[op][c];
      const auto& b = before.latency[op][c];
      for (std::size_t i = 0; i < latency_histogram::kBuckets; ++i) out[op].buckets[i] += a.buckets[i] - b.buckets[i];
      out[op].sum_ns += a.sum_ns - b.sum_ns;
    }
  return out;
}

namespace {
// "<= 50 us" (a bucket's upper bound), "> 10 s" for +Inf.
std::string bound_text(std::int64_t ns) {
  char buf[32];
  if (ns < 0) return "> 10 s";
  if (ns < 1'000'000) std::snprintf(buf, sizeof buf, "<= %lld us", static_cast<long long>(ns / 1000));
  else if (ns < 1'000'000'000) std::snprintf(buf, sizeof buf, "<= %lld ms", static_cast<long long>(ns / 1'000'000));
  else std::snprintf(buf, sizeof buf, "<= %lld s", static_cast<long long>(ns / 1'000'000'000));
  return buf;
}
}  // namespace

std::string format_report(const summary& s, const run_figures& f, const bench_options& o) {
  char buf[768];
  // Mooncake's result line, character for character (transfer_engine_bench.cpp: duration with
  // two decimals, the throughput with --report_precision), then tide's figures.
  std::snprintf(buf, sizeof buf,
                "Test completed: duration %.2f, batch count %zu, throughput %.*f %s/s\n"
                "  operation %s, block %llu B, batch %u, threads %u, policy %s\n"
                "  requests/s %.0f, failed requests %llu\n"
                "  batch latency p50 %.1f us, p99 %.1f us, p999 %.1f us\n"
                "  cpu %.2f s (%.2f s per GB)\n",
                f.seconds, f.batch_latency_us.size(), static_cast<int>(o.report_precision), s.throughput,
                o.unit.name.c_str(),
                o.operation == bench_operation::read ? "read" : "write",
                static_cast<unsigned long long>(o.block_size), o.batch_size, o.threads, o.policy.c_str(),
                s.requests_per_s, static_cast<unsigned long long>(f.failed_requests), s.p50_us, s.p99_us,
                s.p999_us, f.cpu_seconds, s.cpu_s_per_gb);
  std::string out = buf;
  if (!f.phases.empty()) {
    const auto& ph = s.phases_p50;
    std::snprintf(buf, sizeof buf,
                  "  batch phases p50 (us, each its own median): submit %.1f, to post %.1f, wire and poll %.1f, "
                  "wake %.1f, free %.1f\n",
                  ph.submit, ph.to_post, ph.wire_and_poll, ph.wake, ph.free);
    out += buf;
  }
  // Per request, from the engine's telemetry (bucket bounds: 1-2-5 per decade).
  for (std::size_t op = 0; op < 2; ++op) {
    const auto& h = f.transfer_latency[op];
    if (h.count() == 0) continue;
    out += std::string("  transfer latency ") + (op == 0 ? "read" : "write") + " (per request, telemetry): p50 " +
           bound_text(h.quantile_bound_ns(0.50)) + ", p90 " + bound_text(h.quantile_bound_ns(0.90)) + ", p99 " +
           bound_text(h.quantile_bound_ns(0.99)) + ", p999 " + bound_text(h.quantile_bound_ns(0.999)) + " (" +
           std::to_string(h.count()) + " requests, mean " +
           std::to_string(static_cast<double>(h.sum_ns) / 1e3 / static_cast<double>(h.count())).substr(0, 8) + " us)\n";
  }
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
  if (!f.phases.empty())
    j["phases_p50_us"] = {{"phase_submit_us", s.phases_p50.submit},
                          {"phase_to_post_us", s.phases_p50.to_post},
                          {"phase_wire_and_poll_us", s.phases_p50.wire_and_poll},
                          {"phase_wake_us", s.phases_p50.wake},
                          {"phase_free_us", s.phases_p50.free}};
  j["nics"] = nlohmann::json::array();
  for (const auto& n : f.nics)
    j["nics"].push_back({{"name", n.name}, {"bytes", n.bytes}, {"wrs", n.wrs}, {"errors", n.errors}, {"bandwidth_bps", n.bandwidth_bps}});
  j["transfer_latency"] = nlohmann::json::object();
  for (std::size_t op = 0; op < 2; ++op) {
    const auto& h = f.transfer_latency[op];
    if (h.count() == 0) continue;
    // Upper bounds of the histogram buckets holding each quantile (-1: above 10 s).
    auto us = [&](double q) { const auto ns = h.quantile_bound_ns(q); return ns < 0 ? -1.0 : static_cast<double>(ns) / 1e3; };
    j["transfer_latency"][op == 0 ? "read" : "write"] = {{"requests", h.count()}, {"mean_us", static_cast<double>(h.sum_ns) / 1e3 / static_cast<double>(h.count())},
                                                         {"p50_us_le", us(0.5)}, {"p90_us_le", us(0.9)},
                                                         {"p99_us_le", us(0.99)}, {"p999_us_le", us(0.999)}};
  }
  j["rails"] = nlohmann::json::array();
  for (const auto& r : f.rails)
    j["rails"].push_back({{"local", r.local}, {"peer", r.peer}, {"state", r.state}, {"failures", r.failures}, {"pauses", r.pauses}});
  return j.dump(2) + "\n";
}

}  // namespace tide::bench
