// (c) shard hashes: ns per call and max/mean shard load over realistic
// keys (segment ids 0..N-1, device ids 0..8, "node<t>:15000@mlx5_<d>").

#include "common.hpp"

#include <tide/policy/mix_hash.hpp>
#include <tide/policy/mooncake_hash.hpp>
#include <tide/policy/peer_path_hash.hpp>

#include <string>
#include <vector>

namespace tide::bench {
namespace {

struct keyset {
  std::vector<std::string> paths;
  std::vector<shard_key> keys;
};

keyset make_keys(std::size_t segments) {
  keyset k;
  k.paths.reserve(segments * 9);
  for (std::uint64_t t = 0; t < segments; ++t) {
    for (std::uint32_t d = 0; d < 9; ++d) k.paths.push_back("node" + std::to_string(t) + ":15000@mlx5_" + std::to_string(d));
  }
  std::size_t i = 0;
  for (std::uint64_t t = 0; t < segments; ++t) {
    for (std::uint32_t d = 0; d < 9; ++d) k.keys.push_back({t, d, k.paths[i++]});
  }
  return k;
}

template <class H>
double ns_per_call(const keyset& k, std::size_t shards) {
  volatile std::size_t opaque = shards;  // a run-time count, as a configured pool has
  const std::size_t n = opaque;
  std::size_t sink = 0;
  const std::size_t calls = 4'000'000;
  const auto t0 = clk::now();
  for (std::size_t i = 0; i < calls; ++i) sink += H::shard(k.keys[i % k.keys.size()], n);
  const double s = seconds_since(t0);
  volatile std::size_t keep = sink;
  (void)keep;
  return s * 1e9 / static_cast<double>(calls);
}

template <class H>
double max_over_mean(const keyset& k, std::size_t shards) {
  std::vector<std::size_t> load(shards, 0);
  for (const auto& key : k.keys) ++load[H::shard(key, shards)];
  std::size_t mx = 0;
  for (auto l : load) mx = std::max(mx, l);
  return static_cast<double>(mx) / (static_cast<double>(k.keys.size()) / static_cast<double>(shards));
}

template <class H>
void row(table& t, nlohmann::json& out, const options& o, const std::vector<keyset>& sets,
         const std::vector<std::size_t>& segs) {
  std::vector<std::string> r{std::string(H::kName)};
  nlohmann::json j{{"hash", H::kName}};
  for (std::size_t shards : {8, 16}) {
    std::vector<double> ns;
    for (int i = 0; i < (o.quick ? 3 : o.repeats); ++i) ns.push_back(ns_per_call<H>(sets.back(), shards));
    const stat s = stat::of(ns);
    r.push_back(s.text("%.2f"));
    j["ns_per_call"][std::to_string(shards)] = s.to_json();
  }
  for (std::size_t shards : {8, 16}) {
    for (std::size_t i = 0; i < sets.size(); ++i) {
      const double m = max_over_mean<H>(sets[i], shards);
      r.push_back(fmt("%.2f", m));
      j["max_over_mean"][std::to_string(shards)][std::to_string(segs[i])] = m;
    }
  }
  t.add(r);
  out.push_back(j);
}

}  // namespace

nlohmann::json shard_hashes(const options& o) {
  const std::vector<std::size_t> segs{16, 128, 1024};
  std::vector<keyset> sets;
  for (auto n : segs) sets.push_back(make_keys(n));
  table t({"hash", "ns/call 8 sh", "ns/call 16 sh", "8 sh N=16", "8 sh N=128", "8 sh N=1024", "16 sh N=16",
           "16 sh N=128", "16 sh N=1024"});
  nlohmann::json out = nlohmann::json::array();
  row<policy::mooncake_hash>(t, out, o, sets, segs);
  row<policy::mix_hash>(t, out, o, sets, segs);
  row<policy::peer_path_hash>(t, out, o, sets, segs);
  t.print("(c) shard hashes: ns per call (run-time shard count; median [min-max]) and max/mean shard load over "
          "N segments x 9 devices (1.00 = perfectly even)");
  return out;
}

}  // namespace tide::bench
