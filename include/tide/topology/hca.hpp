#pragma once
/// The sysfs scan of RDMA HCAs: what the kernel tells about each device
/// under /sys/class/infiniband/<dev> (NUMA node, PCI path, ports and their
/// GID tables) and the host's NUMA nodes.  Every function takes the sysfs
/// root ("/sys" normally) so tests can point it at a fake tree.

#include <tide/result.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::topology {

struct gid_entry {
  int index = 0;
  std::array<std::uint8_t, 16> raw{};
  std::string type;    ///< "RoCE v2", "IB/RoCE v1", or "" when sysfs has no gid_attrs
  std::string netdev;  ///< the netdev bound to this GID ("" when none)

  [[nodiscard]] bool is_zero() const noexcept;
  /// An IPv4-mapped address (::ffff:a.b.c.d).
  [[nodiscard]] bool is_ipv4_mapped() const noexcept;
  /// Mooncake's wire form: 16 lowercase hex bytes joined by ':'.
  [[nodiscard]] std::string to_string() const;
};

struct port_info {
  int number = 1;
  bool active = false;   ///< state is "4: ACTIVE"
  std::string state;     ///< the sysfs text, e.g. "4: ACTIVE"
  std::string link_layer;  ///< "Ethernet" or "InfiniBand"
  std::uint16_t lid = 0;
  std::vector<gid_entry> gids;  ///< only the non-zero entries
  std::string rate;  ///< speed x width as sysfs prints it, e.g. "100 Gb/sec (4X EDR)"; "" when absent
};

struct hca_info {
  std::string name;
  /// NUMA node from device/numa_node; -1 when unknown (no device link, as
  /// for rxe, or the kernel says -1).  Unknown counts as close to every node.
  int numa_node = -1;
  /// Canonical path of the PCI function (realpath of device/), "" if none.
  std::string pci_path;
  std::vector<port_info> ports;
};

/// Scans <sysfs_root>/class/infiniband.  Devices are sorted by name.  A
/// missing class directory gives an empty list (no RDMA here), not an error.
/// Errors: errc::verbs_failed when a device directory cannot be read.
/// Setup path: reads files, allocates.  Any thread.
[[nodiscard]] result<std::vector<hca_info>> scan_hcas(std::string_view sysfs_root = "/sys");

/// The host's NUMA nodes from <sysfs_root>/devices/system/node/node*;
/// {0} when that directory does not exist (a non-NUMA kernel).
[[nodiscard]] std::vector<int> scan_numa_nodes(std::string_view sysfs_root = "/sys");

/// Parses a sysfs GID ("fe80:0000:0000:0000:0202:c9ff:fe00:0001", eight
/// groups of four hex digits).  errc::invalid_argument on anything else.
[[nodiscard]] result<std::array<std::uint8_t, 16>> parse_sysfs_gid(std::string_view text);

}  // namespace tide::topology
