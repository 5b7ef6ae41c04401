#pragma once
// Shared pieces of the policy microbenchmarks: options, statistics over
// repeats (median and spread, never one number), tables, JSON, Zipf.

#include <nlohmann/json.hpp>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace tide::bench {

struct options {
  int repeats = 5;
  double idle_seconds = 5.0;
  double run_seconds = 0.5;  // per throughput measurement
  bool rdma = false;         // cq_event on a real device (in the VM)
  bool quick = false;
};

/// Median, min and max of repeated measurements.
struct stat {
  double median = 0, min = 0, max = 0;
  static stat of(std::vector<double> v) {
    stat s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    s.min = v.front();
    s.max = v.back();
    return s;
  }
  /// "median [min-max]" with the given printf format for each number.
  std::string text(const char* fmt = "%.3f") const {
    char a[64], b[64], c[64];
    std::snprintf(a, sizeof a, fmt, median);
    std::snprintf(b, sizeof b, fmt, min);
    std::snprintf(c, sizeof c, fmt, max);
    return std::string(a) + " [" + b + "-" + c + "]";
  }
  nlohmann::json to_json() const { return {{"median", median}, {"min", min}, {"max", max}}; }
};

/// p-th percentile (0..100) of samples (sorted copy).
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * static_cast<double>(v.size() - 1);
  return v[static_cast<std::size_t>(std::lround(idx))];
}

/// Prints rows of cells with columns padded to their widest cell.
class table {
 public:
  explicit table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(const std::string& title) const {
    std::vector<std::size_t> w;
    for (const auto& r : rows_) {
      if (w.size() < r.size()) w.resize(r.size(), 0);
      for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    }
    std::printf("\n%s\n", title.c_str());
    for (std::size_t k = 0; k < rows_.size(); ++k) {
      for (std::size_t i = 0; i < rows_[k].size(); ++i) {
        std::printf("%s%-*s", i ? "  " : "", static_cast<int>(w[i]), rows_[k][i].c_str());
      }
      std::printf("\n");
      if (k == 0) {
        std::size_t total = 0;
        for (std::size_t x : w) total += x + 2;
        std::printf("%s\n", std::string(total - 2, '-').c_str());
      }
    }
    std::fflush(stdout);
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

inline std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// Zipf(alpha) over ranks 0..n-1 (rank 0 most popular), by inverse CDF.
class zipf {
 public:
  zipf(std::size_t n, double alpha) : cdf_(n) {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += 1.0 / std::pow(static_cast<double>(i + 1), alpha);
    double acc = 0;
    for (std::size_t i = 0; i < n; ++i) {
      acc += 1.0 / std::pow(static_cast<double>(i + 1), alpha) / sum;
      cdf_[i] = acc;
    }
    cdf_.back() = 1.0;
  }
  template <class Rng>
  std::uint32_t operator()(Rng& rng) {
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    return static_cast<std::uint32_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::vector<double> cdf_;
};

/// Popularity ranks scattered over key ids, so that key id order (insertion
/// order in a scan) says nothing about popularity.
inline std::vector<std::uint32_t> shuffled_ids(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint32_t> ids(n);
  for (std::size_t i = 0; i < n; ++i) ids[i] = static_cast<std::uint32_t>(i);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

inline double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

using clk = std::chrono::steady_clock;
inline double seconds_since(clk::time_point t0) { return std::chrono::duration<double>(clk::now() - t0).count(); }

// The sections; each prints its tables and returns its JSON.
nlohmann::json miss_ratio(const options& o);
nlohmann::json store_throughput(const options& o);
nlohmann::json shard_hashes(const options& o);
nlohmann::json idle_strategies(const options& o);
nlohmann::json submit_queues(const options& o);

}  // namespace tide::bench
