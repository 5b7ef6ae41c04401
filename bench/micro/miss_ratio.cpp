// (a) Miss ratio of each eviction policy on Zipf traces and on a Zipf +
// sequential-scan mix.  The policies' orders are driven directly (the
// store's choice of victim is exactly the order's), over key ids.

#include "common.hpp"

#include <tide/policy/fifo.hpp>
#include <tide/policy/lru.hpp>
#include <tide/policy/sieve.hpp>

#include <memory>
#include <string>
#include <vector>

namespace tide::bench {
namespace {

constexpr std::size_t kKeys = 10'000;

template <class P>
double simulate(const std::vector<std::uint32_t>& trace, std::size_t key_space, std::size_t capacity) {
  struct item : P::hook {
    std::uint32_t id = 0;
    bool present = false;
  };
  std::vector<item> items(key_space);
  for (std::size_t i = 0; i < key_space; ++i) items[i].id = static_cast<std::uint32_t>(i);
  typename P::order order;
  std::size_t size = 0, misses = 0;
  for (std::uint32_t k : trace) {
    item& it = items[k];
    if (it.present) {
      order.touch(it);
      continue;
    }
    ++misses;
    if (size == capacity) {
      auto* v = static_cast<item*>(order.evict());
      v->present = false;
      --size;
    }
    order.insert(it);
    it.present = true;
    ++size;
  }
  while (auto* v = order.evict()) static_cast<item*>(v)->present = false;
  return static_cast<double>(misses) / static_cast<double>(trace.size());
}

std::vector<std::uint32_t> zipf_trace(double alpha, std::size_t length, std::uint64_t seed) {
  zipf z(kKeys, alpha);
  const auto ids = shuffled_ids(kKeys, seed * 7 + 1);
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> t(length);
  for (auto& k : t) k = ids[z(rng)];
  return t;
}

// Zipf(1.0) requests in blocks of 20,000, each followed by a sequential scan
// of 2,000 keys that are never requested again (one-hit wonders: a backup,
// a bulk copy to peers seen once).  Key space: 10,000 + the scan keys.
std::vector<std::uint32_t> scan_mix_trace(std::size_t length, std::uint64_t seed, std::size_t& key_space) {
  zipf z(kKeys, 1.0);
  const auto ids = shuffled_ids(kKeys, seed * 7 + 1);
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> t;
  t.reserve(length);
  std::uint32_t next_scan = kKeys;
  while (t.size() < length) {
    for (int i = 0; i < 20'000 && t.size() < length; ++i) t.push_back(ids[z(rng)]);
    for (int i = 0; i < 2'000 && t.size() < length; ++i) t.push_back(next_scan++);
  }
  key_space = next_scan;
  return t;
}

struct policy_row {
  const char* name;
  double (*run)(const std::vector<std::uint32_t>&, std::size_t, std::size_t);
};
const policy_row kPolicies[] = {
    {"fifo", &simulate<policy::fifo>},
    {"lru", &simulate<policy::lru>},
    {"sieve", &simulate<policy::sieve>},
    {"mooncake_sieve", &simulate<policy::mooncake_sieve>},
};

}  // namespace

nlohmann::json miss_ratio(const options& o) {
  const std::size_t length = o.quick ? 200'000 : 1'000'000;
  const int seeds = std::max(1, std::min(o.repeats, 3));
  const double alphas[] = {0.6, 0.8, 1.0, 1.2};
  const double caps[] = {0.01, 0.05, 0.10, 0.25};
  nlohmann::json out = nlohmann::json::array();

  table t({"trace", "capacity", "fifo", "lru", "sieve", "mooncake_sieve", "sieve<=fifo,lru"});
  auto run_row = [&](const std::string& trace_name, std::size_t cap, auto make_trace) {
    std::vector<std::vector<double>> per_policy(std::size(kPolicies));
    for (int s = 0; s < seeds; ++s) {
      std::size_t key_space = kKeys;
      const auto trace = make_trace(static_cast<std::uint64_t>(s + 1), key_space);
      for (std::size_t p = 0; p < std::size(kPolicies); ++p) {
        per_policy[p].push_back(kPolicies[p].run(trace, key_space, cap));
      }
    }
    std::vector<std::string> row{trace_name, std::to_string(cap)};
    nlohmann::json j{{"trace", trace_name}, {"capacity", cap}, {"requests", length}, {"seeds", seeds}};
    std::vector<stat> st;
    for (std::size_t p = 0; p < std::size(kPolicies); ++p) {
      st.push_back(stat::of(per_policy[p]));
      row.push_back(st.back().text("%.4f"));
      j["miss_ratio"][kPolicies[p].name] = st.back().to_json();
    }
    const bool target = st[2].median <= st[0].median && st[2].median <= st[1].median;
    row.push_back(target ? "yes" : "NO");
    j["sieve_not_worse"] = target;
    t.add(row);
    out.push_back(j);
  };
  for (double a : alphas) {
    for (double c : caps) {
      const auto cap = static_cast<std::size_t>(c * kKeys);
      run_row("zipf " + fmt("%.1f", a), cap, [&](std::uint64_t seed, std::size_t&) {
        return zipf_trace(a, length, seed);
      });
    }
  }
  for (double c : caps) {
    const auto cap = static_cast<std::size_t>(c * kKeys);
    run_row("zipf 1.0 + scans", cap, [&](std::uint64_t seed, std::size_t& ks) {
      return scan_mix_trace(length, seed, ks);
    });
  }
  t.print("(a) miss ratio, 10,000 keys, " + std::to_string(length) + " requests; median [min-max] over " +
          std::to_string(seeds) + " seeds");
  return out;
}

}  // namespace tide::bench
