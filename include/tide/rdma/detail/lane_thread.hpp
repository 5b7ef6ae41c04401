#pragma once
/// Where a lane thread runs (rdma/lane.hpp): the CPUs lane_cpus names, or
/// its NIC's NUMA node.  Not API.

#include <tide/detail/log.hpp>
#include <tide/errc.hpp>
#include <tide/result.hpp>

#include <numa.h>
#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <string>
#include <vector>

namespace tide::rdma::detail {

// Set from the starting thread, so a refusal is start()'s error; the lane
// runs unbound for the moment in between.
[[nodiscard]] inline status run_lane_on(pthread_t thread, const std::vector<int>& cpus) {
  const int count = cpus.back() + 1;  // ascending (topology::parse_cpu_list)
  cpu_set_t* set = CPU_ALLOC(count);
  if (set == nullptr) return fail(errc::out_of_memory, "lane_cpus: CPU_ALLOC");
  const std::size_t bytes = CPU_ALLOC_SIZE(count);
  CPU_ZERO_S(bytes, set);
  for (int c : cpus) CPU_SET_S(c, bytes, set);
  const int rc = pthread_setaffinity_np(thread, bytes, set);
  CPU_FREE(set);
  if (rc == 0) return {};
  std::string list;
  for (int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
  return fail(errc::config_invalid, "lane_cpus: the kernel refuses CPUs " + list + " for the lanes (" +
                                        std::strerror(rc) + "; offline, or outside this process's cpuset?)");
}

inline void bind_lane_to_node(int node) noexcept {
  if (node < 0 || numa_available() < 0) return;
  if (numa_run_on_node(node) != 0) TIDE_LOG_DEBUG("numa_run_on_node(" << node << ") failed");
}

}  // namespace tide::rdma::detail
