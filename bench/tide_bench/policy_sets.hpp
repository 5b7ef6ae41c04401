#pragma once
/// The policy sets compiled into tide-bench, by name.  Each set is a full
/// transfer_engine instantiation, so the list is the defaults plus one axis
/// changed at a time plus Mooncake's own combination, rather than the whole
/// cross product (36 engines would dominate the build on small machines).

#include "options.hpp"

#include <string>
#include <vector>

namespace tide::bench {

enum class metadata_kind { p2p, etcd, http };

struct policy_entry {
  std::string name;         ///< --policy value
  std::string description;  ///< "eviction / shard hash / idle / path", from the policies' kName
  /// Runs the benchmark with this set and the given metadata backend;
  /// nullptr for a backend this set is not built with.
  int (*run_p2p)(const bench_options&) = nullptr;
  int (*run_etcd)(const bench_options&) = nullptr;
  int (*run_http)(const bench_options&) = nullptr;
};

/// "sieve / mooncake_hash / spin_event / load_aware": what P is made of, read from the policies themselves.
template <class P>
std::string describe() {
  std::string d(P::eviction::kName);
  d += " / ";
  d += P::shard_hash::kName;
  d += " / ";
  d += P::idle::kName;
  d += " / ";
  d += P::path::kName;
  return d;
}

/// Every compiled set, "default" first.  Defined across policy_sets_*.cpp.
[[nodiscard]] std::vector<policy_entry> policy_registry();

void add_default_sets(std::vector<policy_entry>& out);
void add_eviction_sets(std::vector<policy_entry>& out);
void add_idle_and_hash_sets(std::vector<policy_entry>& out);
void add_path_sets(std::vector<policy_entry>& out);

}  // namespace tide::bench
