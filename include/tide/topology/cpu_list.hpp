#pragma once
/// CPU lists as taskset -c and the kernel's cpulist files write them
/// ("0,2-3"): where the engine's lanes run (engine_config::lane_cpus).

#include <tide/result.hpp>

#include <string_view>
#include <vector>

namespace tide::topology {

/// The CPUs of `text`, ascending, each once.  Errors (config_invalid, naming
/// `what` and the part at fault): an empty list or item, a part that is not
/// a number or a range lo-hi with lo <= hi, a CPU >= `cpu_count` (the CPUs
/// this machine has configured).
[[nodiscard]] result<std::vector<int>> parse_cpu_list(std::string_view text, int cpu_count,
                                                      std::string_view what = "lane_cpus");

/// The machine's configured CPUs (sysconf(_SC_NPROCESSORS_CONF)).
[[nodiscard]] int configured_cpus() noexcept;

}  // namespace tide::topology
