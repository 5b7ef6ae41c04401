#pragma once
/// Where a GPU sits on the PCI tree, to pick the NICs closest to its memory
/// (priority_matrix::from_hcas gives each "cuda:N" key the NICs at the
/// smallest PCI distance, among those on the GPU's NUMA node when any are).

#include <string>
#include <string_view>

namespace tide::topology {

struct gpu_info {
  int ordinal = -1;        ///< the CUDA device ordinal N of "cuda:N"
  std::string bus_id;      ///< "0000:3b:00.0", as the driver names it
  std::string pci_path;    ///< canonical path of its PCI function; "" when sysfs lacks it
  int numa_node = -1;      ///< -1: unknown
};

/// Finds the GPU with PCI bus id `bus_id` under <sysfs_root>/bus/pci/devices
/// (the id is matched lower-case, as sysfs spells it).  A GPU sysfs does not
/// list keeps pci_path "" and numa_node -1.  Any thread; reads files.
[[nodiscard]] gpu_info locate_gpu(int ordinal, std::string_view bus_id, std::string_view sysfs_root = "/sys");

/// The PCI distance of two functions, as Mooncake measures it: the path
/// components each has below their deepest common ancestor, summed.  0 for
/// the same function; -1 when either path is unknown ("").
[[nodiscard]] int pci_distance(std::string_view a, std::string_view b) noexcept;

}  // namespace tide::topology
