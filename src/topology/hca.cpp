#include <tide/topology/hca.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

namespace tide::topology {
namespace fs = std::filesystem;
namespace {

// First line of a sysfs file, trailing whitespace removed; "" when unreadable.
std::string read_line(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  if (!in || !std::getline(in, s)) return {};
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

int parse_int(std::string_view s, int fallback, int base = 10) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  return ec == std::errc{} && p != s.data() ? v : fallback;
}

// Reads one port directory.
port_info scan_port(const fs::path& dir, int number) {
  port_info port;
  port.number = number;
  port.state = read_line(dir / "state");
  port.active = port.state.find("ACTIVE") != std::string::npos && port.state.rfind("4", 0) == 0;
  port.link_layer = read_line(dir / "link_layer");
  port.lid = static_cast<std::uint16_t>(parse_int(read_line(dir / "lid"), 0));
  port.rate = read_line(dir / "rate");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir / "gids", ec)) {
    const auto idx_text = e.path().filename().string();
    const int idx = parse_int(idx_text, -1);
    if (idx < 0) continue;
    auto raw = parse_sysfs_gid(read_line(e.path()));
    if (!raw) continue;
    gid_entry g;
    g.index = idx;
    g.raw = *raw;
    if (g.is_zero()) continue;
    g.type = read_line(dir / "gid_attrs" / "types" / idx_text);
    g.netdev = read_line(dir / "gid_attrs" / "ndevs" / idx_text);
    port.gids.push_back(std::move(g));
  }
  std::sort(port.gids.begin(), port.gids.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  return port;
}

}  // namespace

bool gid_entry::is_zero() const noexcept {
  return std::all_of(raw.begin(), raw.end(), [](std::uint8_t b) { return b == 0; });
}

bool gid_entry::is_ipv4_mapped() const noexcept {
  for (int i = 0; i < 10; ++i)
    if (raw[static_cast<std::size_t>(i)] != 0) return false;
  return raw[10] == 0xff && raw[11] == 0xff;
}

std::string gid_entry::to_string() const {
  std::string s;
  s.reserve(47);
  char buf[4];
  for (std::size_t i = 0; i < raw.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%02x", raw[i]);
    if (i != 0) s += ':';
    s += buf;
  }
  return s;
}

result<std::array<std::uint8_t, 16>> parse_sysfs_gid(std::string_view text) {
  std::array<std::uint8_t, 16> out{};
  if (text.size() != 39) return fail(errc::invalid_argument, "sysfs GID \"" + std::string(text) + "\": expected 8 groups of 4 hex digits");
  for (std::size_t g = 0; g < 8; ++g) {
    const auto group = text.substr(g * 5, 4);
    if (g < 7 && text[g * 5 + 4] != ':')
      return fail(errc::invalid_argument, "sysfs GID \"" + std::string(text) + "\": ':' expected");
    unsigned v = 0;
    auto [p, ec] = std::from_chars(group.data(), group.data() + 4, v, 16);
    if (ec != std::errc{} || p != group.data() + 4)
      return fail(errc::invalid_argument, "sysfs GID \"" + std::string(text) + "\": bad hex group");
    out[g * 2] = static_cast<std::uint8_t>(v >> 8);
    out[g * 2 + 1] = static_cast<std::uint8_t>(v & 0xff);
  }
  return out;
}

result<std::vector<hca_info>> scan_hcas(std::string_view sysfs_root) {
  std::vector<hca_info> out;
  const fs::path cls = fs::path(sysfs_root) / "class" / "infiniband";
  std::error_code ec;
  if (!fs::exists(cls, ec)) return out;
  for (const auto& e : fs::directory_iterator(cls, ec)) {
    hca_info h;
    h.name = e.path().filename().string();
    const fs::path dev = e.path();
    const fs::path pci = dev / "device";
    std::error_code ec2;
    if (fs::exists(pci, ec2)) {
      const auto canon = fs::canonical(pci, ec2);
      if (!ec2) h.pci_path = canon.string();
      h.numa_node = parse_int(read_line(pci / "numa_node"), -1);
      if (h.numa_node < -1) h.numa_node = -1;
    }
    std::error_code ec3;
    for (const auto& p : fs::directory_iterator(dev / "ports", ec3)) {
      const int n = parse_int(p.path().filename().string(), -1);
      if (n > 0) h.ports.push_back(scan_port(p.path(), n));
    }
    std::sort(h.ports.begin(), h.ports.end(), [](const auto& a, const auto& b) { return a.number < b.number; });
    out.push_back(std::move(h));
  }
  if (ec) return fail(errc::verbs_failed, "reading " + cls.string() + ": " + ec.message());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

std::vector<int> scan_numa_nodes(std::string_view sysfs_root) {
  std::vector<int> nodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(sysfs_root) / "devices" / "system" / "node", ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("node", 0) != 0) continue;
    const int n = parse_int(std::string_view(name).substr(4), -1);
    if (n >= 0) nodes.push_back(n);
  }
  if (nodes.empty()) nodes.push_back(0);
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

}  // namespace tide::topology
