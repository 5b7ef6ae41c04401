// tide-bench: Mooncake's transfer_engine_bench for tide (see options.hpp for the flags).
#include "options.hpp"
#include "policy_sets.hpp"
#include "runner.hpp"

#include <algorithm>
#include <iostream>

int main(int argc, char** argv) {
  using namespace tide::bench;
  const auto registry = policy_registry();
  std::vector<std::string> names;
  for (const auto& e : registry) names.push_back(e.name);

  auto o = parse_options(argc, argv, names);
  if (!o) {
    std::cerr << "tide-bench: " << o.error().detail << "\n(tide-bench --help lists the flags)\n";
    return 2;
  }
  if (o->help) {
    std::cout << usage(names);
    for (const auto& e : registry) std::cout << "  policy " << e.name << ": " << e.description << "\n";
    return 0;
  }
  if (o->list_policies) {
    for (const auto& e : registry) std::cout << e.name << '\t' << e.description << "\n";
    return 0;
  }
  for (const auto& w : o->warnings) std::cerr << "tide-bench: warning: " << w << "\n";
  if (o->print_config) {
    tide::config_report report;
    auto cfg = bench_engine_config(*o).resolve(&report);
    if (!cfg) {
      std::cerr << "tide-bench: " << cfg.error().message() << "\n";
      return 1;
    }
    std::cout << report.to_text();
    return 0;
  }
  const auto& entry = *std::find_if(registry.begin(), registry.end(), [&](const auto& e) { return e.name == o->policy; });
  const std::string_view server = o->metadata_server;
  auto runner = entry.run_p2p;
  if (server.starts_with("etcd://") || server.starts_with("etcds://")) runner = entry.run_etcd;
  else if (server.starts_with("http://")) runner = entry.run_http;
  if (runner == nullptr) {
    std::cerr << "tide-bench: policy set '" << entry.name << "' is built with P2PHANDSHAKE metadata only; use --policy=default with "
              << server << "\n";
    return 2;
  }
  return runner(*o);
}
