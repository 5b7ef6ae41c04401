// tide-policy-bench: microbenchmarks of the policy axes.
//   (a) eviction miss ratio   (b) endpoint store throughput
//   (c) shard hashes          (d) idle strategies
//   (e) the lane submit queue (own MPSC vs Boost.Lockfree)
// Prints tables; --json FILE writes every figure.  Never asserts a timing.

#include "common.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace {
void usage() {
  std::printf(
      "usage: tide-policy-bench [--sections abcde] [--json FILE] [--repeats N] [--run-seconds S]\n"
      "                         [--idle-seconds S] [--quick] [--rdma]\n"
      "  --sections   which of (a) miss ratio, (b) store throughput, (c) shard hashes,\n"
      "               (d) idle strategies, (e) lane submit queues to run (default abcd)\n"
      "  --rdma       (d) also on a real CQ (needs an RDMA device: run it in the rxe VM)\n"
      "  --quick      shorter traces and fewer repeats (smoke test)\n");
}
}  // namespace

int main(int argc, char** argv) {
  tide::bench::options o;
  std::string sections = "abcd", json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--sections") sections = next();
    else if (a == "--json") json_path = next();
    else if (a == "--repeats") o.repeats = std::max(1, std::atoi(next().c_str()));
    else if (a == "--run-seconds") o.run_seconds = std::atof(next().c_str());
    else if (a == "--idle-seconds") o.idle_seconds = std::atof(next().c_str());
    else if (a == "--quick") o.quick = true;
    else if (a == "--rdma") o.rdma = true;
    else if (a == "--help" || a == "-h") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.c_str());
      usage();
      return 2;
    }
  }
  if (o.quick) {
    o.idle_seconds = std::min(o.idle_seconds, 1.0);
    o.run_seconds = std::min(o.run_seconds, 0.2);
  }
  nlohmann::json j;
  j["options"] = {{"repeats", o.repeats}, {"run_seconds", o.run_seconds}, {"idle_seconds", o.idle_seconds},
                  {"quick", o.quick}, {"rdma", o.rdma}};
  if (sections.find('a') != std::string::npos) j["miss_ratio"] = tide::bench::miss_ratio(o);
  if (sections.find('b') != std::string::npos) j["store_throughput"] = tide::bench::store_throughput(o);
  if (sections.find('c') != std::string::npos) j["shard_hashes"] = tide::bench::shard_hashes(o);
  if (sections.find('d') != std::string::npos) j["idle"] = tide::bench::idle_strategies(o);
  if (sections.find('e') != std::string::npos) j["submit_queues"] = tide::bench::submit_queues(o);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << j.dump(2) << '\n';
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
