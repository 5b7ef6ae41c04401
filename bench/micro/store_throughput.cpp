// (b) find and insert throughput of tide::endpoint_store for each eviction
// policy, and of the Mooncake-style baseline, with 1 and 2 threads.

#include "common.hpp"
#include "mooncake_store.hpp"

#include <tide/policy/fifo.hpp>
#include <tide/policy/lru.hpp>
#include <tide/policy/sieve.hpp>
#include <tide/rdma/endpoint_store.hpp>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace tide::bench {
namespace {

constexpr std::size_t kCapacity = 1024;
constexpr std::size_t kInsertKeySpace = 16 * kCapacity;
constexpr std::size_t kSeq = 1 << 16;  // pre-drawn key indices per thread

struct bench_endpoint {
  std::atomic<std::size_t> out{0};
  std::size_t outstanding() const noexcept { return out.load(std::memory_order_acquire); }
  void on_evict() noexcept {}
};

std::vector<std::string> make_keys(std::size_t n) {
  std::vector<std::string> k;
  k.reserve(n);
  for (std::size_t i = 0; i < n; ++i) k.push_back("node" + std::to_string(i / 9) + ":15000@mlx5_" + std::to_string(i % 9));
  return k;
}

// Per-thread sequences of key indices: Zipf(1.0) over the capacity for
// finds (all hits), uniform over 16x the capacity for inserts (mostly
// misses, each evicting).
std::vector<std::uint32_t> find_sequence(unsigned seed) {
  zipf z(kCapacity, 1.0);
  const auto ids = shuffled_ids(kCapacity, 5);
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> s(kSeq);
  for (auto& x : s) x = ids[z(rng)];
  return s;
}
std::vector<std::uint32_t> insert_sequence(unsigned seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> s(kSeq);
  for (auto& x : s) x = static_cast<std::uint32_t>(rng() % kInsertKeySpace);
  return s;
}

struct rate {
  double wall = 0;  // operations per wall-clock second, all threads
  double cpu = 0;   // operations per CPU-second the threads actually ran
};

// Runs op(key index) on `threads` threads for `seconds`.  The CPU-time rate
// is robust to other load on the machine (a descheduled thread does not
// count); the wall rate is what a user sees.
template <class Op>
rate run(int threads, double seconds, bool insert, Op op) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<long> total{0};
  std::atomic<long> cpu_ns{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      const auto seq = insert ? insert_sequence(100u + static_cast<unsigned>(t)) : find_sequence(200u + static_cast<unsigned>(t));
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      const double c0 = thread_cpu_seconds();
      long n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        for (int i = 0; i < 1024; ++i) op(seq[static_cast<std::size_t>(n++) & (kSeq - 1)]);
      }
      cpu_ns.fetch_add(static_cast<long>((thread_cpu_seconds() - c0) * 1e9));
      total.fetch_add(n);
    });
  }
  const auto t0 = clk::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) th.join();
  const double ops = static_cast<double>(total.load());
  return {ops / seconds_since(t0), ops / (static_cast<double>(cpu_ns.load()) * 1e-9)};
}

const std::vector<std::string>& keys() {
  static const auto k = make_keys(kInsertKeySpace);
  return k;
}

auto factory = [](std::string_view) -> tide::result<std::unique_ptr<bench_endpoint>> {
  return std::make_unique<bench_endpoint>();
};

template <class P>
rate tide_find(int threads, double seconds) {
  auto s = std::move(*endpoint_store<bench_endpoint, P>::create(kCapacity));
  for (std::size_t i = 0; i < kCapacity; ++i) (void)s->insert(keys()[i], factory);
  return run(threads, seconds, false, [&](std::uint32_t k) {
    auto h = s->find(keys()[k]);
    if (!h) std::abort();
  });
}
template <class P>
rate tide_insert(int threads, double seconds) {
  auto s = std::move(*endpoint_store<bench_endpoint, P>::create(kCapacity));
  return run(threads, seconds, true, [&](std::uint32_t k) {
    auto h = s->get_or_insert(keys()[k], factory);
    if (!h) std::abort();
  });
}
template <class S>
rate baseline_find(int threads, double seconds) {
  S s(kCapacity);
  for (std::size_t i = 0; i < kCapacity; ++i) s.insert(keys()[i]);
  return run(threads, seconds, false, [&](std::uint32_t k) {
    auto p = s.get(keys()[k]);
    if (!p) std::abort();
  });
}
template <class S>
rate baseline_insert(int threads, double seconds) {
  S s(kCapacity);
  std::atomic<unsigned> n{0};
  return run(threads, seconds, true, [&](std::uint32_t k) {
    auto p = s.get(keys()[k]);
    if (!p) p = s.insert(keys()[k]);
    // Mooncake reclaims from its monitor thread at 1 Hz; here every 4096
    // operations so that the waiting list stays small (cost included).
    if ((n.fetch_add(1, std::memory_order_relaxed) & 4095) == 0) s.reclaim();
  });
}

struct variant {
  const char* name;
  rate (*find)(int, double);
  rate (*insert)(int, double);
};
const variant kVariants[] = {
    {"tide fifo", &tide_find<policy::fifo>, &tide_insert<policy::fifo>},
    {"tide sieve", &tide_find<policy::sieve>, &tide_insert<policy::sieve>},
    {"tide mooncake_sieve", &tide_find<policy::mooncake_sieve>, &tide_insert<policy::mooncake_sieve>},
    {"tide lru", &tide_find<policy::lru>, &tide_insert<policy::lru>},
    {"baseline fifo (Mooncake-style)", &baseline_find<mooncake_like::fifo_store>,
     &baseline_insert<mooncake_like::fifo_store>},
    {"baseline sieve (Mooncake-style)", &baseline_find<mooncake_like::sieve_store>,
     &baseline_insert<mooncake_like::sieve_store>},
};

constexpr std::size_t kBaseSieve = std::size(kVariants) - 1;

}  // namespace

nlohmann::json store_throughput(const options& o) {
  const int reps = o.quick ? 3 : o.repeats;
  constexpr int kCols = 4;
  const char* names[kCols] = {"find_1", "find_2", "insert_1", "insert_2"};
  // samples[variant][column][wall=0/cpu=1]: alternate the variants within
  // each repeat so that drifts in machine load hit all of them alike.
  std::vector<std::vector<std::vector<std::vector<double>>>> samples(
      std::size(kVariants), std::vector<std::vector<std::vector<double>>>(kCols, std::vector<std::vector<double>>(2)));
  for (int r = 0; r < reps; ++r) {
    for (std::size_t v = 0; v < std::size(kVariants); ++v) {
      const auto& var = kVariants[v];
      const rate rs[kCols] = {var.find(1, o.run_seconds), var.find(2, o.run_seconds),
                              var.insert != nullptr ? var.insert(1, o.run_seconds) : rate{},
                              var.insert != nullptr ? var.insert(2, o.run_seconds) : rate{}};
      for (int c = 0; c < kCols; ++c) {
        if (var.insert == nullptr && c >= 2) continue;
        samples[v][static_cast<std::size_t>(c)][0].push_back(rs[c].wall / 1e6);
        samples[v][static_cast<std::size_t>(c)][1].push_back(rs[c].cpu / 1e6);
      }
    }
  }
  nlohmann::json out = nlohmann::json::array();
  std::vector<std::vector<stat>> wall(std::size(kVariants)), cpu(std::size(kVariants));
  table tw({"store", "find 1 thr", "find 2 thr", "insert 1 thr", "insert 2 thr"});
  table tc({"store", "find 1 thr", "find 2 thr", "insert 1 thr", "insert 2 thr"});
  for (std::size_t v = 0; v < std::size(kVariants); ++v) {
    std::vector<std::string> rw{kVariants[v].name}, rc{kVariants[v].name};
    nlohmann::json j{{"store", kVariants[v].name}};
    for (std::size_t c = 0; c < kCols; ++c) {
      wall[v].push_back(stat::of(samples[v][c][0]));
      cpu[v].push_back(stat::of(samples[v][c][1]));
      rw.push_back(samples[v][c][0].empty() ? "-" : wall[v].back().text("%.2f"));
      rc.push_back(samples[v][c][1].empty() ? "-" : cpu[v].back().text("%.2f"));
      j[names[c]] = {{"wall_mops", wall[v].back().to_json()}, {"mops_per_cpu_second", cpu[v].back().to_json()}};
    }
    tw.add(rw);
    tc.add(rc);
    out.push_back(j);
  }
  const std::string what = "capacity " + std::to_string(kCapacity) +
                           "; find: Zipf(1.0) hits; insert: get_or_insert over " + std::to_string(kInsertKeySpace) +
                           " uniform keys (mostly misses, each evicting); median [min-max] of " + std::to_string(reps) +
                           " x " + fmt("%.1f", o.run_seconds) + " s";
  tw.print("(b) endpoint store throughput, Mops/s wall clock, " + what);
  tc.print("(b') the same runs, Mops per CPU-second the threads ran (insensitive to other load)");
  const double ratio_wall = wall[1][1].median / wall[kBaseSieve][1].median;
  const double ratio_cpu = cpu[1][1].median / cpu[kBaseSieve][1].median;
  std::printf("tide sieve / baseline sieve, find at 2 threads: %.2fx wall, %.2fx per CPU-second (target >= 2x); "
              "1 thread: %.2fx wall, %.2fx per CPU-second\n",
              ratio_wall, ratio_cpu, wall[1][0].median / wall[kBaseSieve][0].median, cpu[1][0].median / cpu[kBaseSieve][0].median);
  double load[3] = {0, 0, 0};
  if (::getloadavg(load, 3) < 0) load[0] = -1;
  std::printf("hardware threads: %u; load average at the end: %.2f (2-thread figures mean little when it is\n"
              "above the core count minus two)\n",
              std::thread::hardware_concurrency(), load[0]);
  return {{"rows", out},
          {"sieve_find_2thr_ratio_vs_baseline", {{"wall", ratio_wall}, {"per_cpu_second", ratio_cpu}}},
          {"load_average", load[0]}};
}

}  // namespace tide::bench
