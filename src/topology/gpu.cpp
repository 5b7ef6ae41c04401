#include <tide/topology/gpu.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

namespace tide::topology {

namespace fs = std::filesystem;

gpu_info locate_gpu(int ordinal, std::string_view bus_id, std::string_view sysfs_root) {
  gpu_info g;
  g.ordinal = ordinal;
  g.bus_id = std::string(bus_id);
  std::transform(g.bus_id.begin(), g.bus_id.end(), g.bus_id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::error_code ec;
  const fs::path fn = fs::path(std::string(sysfs_root)) / "bus/pci/devices" / g.bus_id;
  const fs::path canon = fs::canonical(fn, ec);
  if (ec) return g;
  g.pci_path = canon.string();
  std::ifstream in(canon / "numa_node");
  int node = -1;
  if (in >> node) g.numa_node = node < 0 ? -1 : node;
  return g;
}

int pci_distance(std::string_view a, std::string_view b) noexcept {
  if (a.empty() || b.empty()) return -1;
  // Components of each path below their deepest common ancestor.
  auto next = [](std::string_view& p) {
    while (!p.empty() && p.front() == '/') p.remove_prefix(1);
    const std::size_t n = std::min(p.find('/'), p.size());
    std::string_view c = p.substr(0, n);
    p.remove_prefix(n);
    return c;
  };
  auto count = [&](std::string_view p) {
    int n = 0;
    while (!next(p).empty()) ++n;
    return n;
  };
  for (;;) {
    std::string_view ra = a, rb = b;
    const std::string_view ca = next(ra), cb = next(rb);
    if (ca.empty() || cb.empty() || ca != cb) return count(a) + count(b);
    a = ra;
    b = rb;
  }
}

}  // namespace tide::topology
