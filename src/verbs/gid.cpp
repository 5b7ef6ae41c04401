#include <tide/verbs/gid.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <system_error>

namespace tide::verbs {

std::string gid::to_string() const {
  std::string s(47, ':');
  constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < raw.size(); ++i) {
    s[i * 3] = kHex[raw[i] >> 4];
    s[i * 3 + 1] = kHex[raw[i] & 0xf];
  }
  return s;
}

bool gid::is_zero() const noexcept {
  return std::all_of(raw.begin(), raw.end(), [](std::uint8_t b) { return b == 0; });
}

bool gid::is_ipv4_mapped() const noexcept {
  for (int i = 0; i < 10; ++i)
    if (raw[i] != 0) return false;
  return raw[10] == 0xff && raw[11] == 0xff;
}

bool gid::is_link_local() const noexcept { return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80; }

gid gid::from_ibv(const ibv_gid& g) noexcept {
  gid r;
  std::copy(std::begin(g.raw), std::end(g.raw), r.raw.begin());
  return r;
}

ibv_gid gid::to_ibv() const noexcept {
  ibv_gid g{};
  std::copy(raw.begin(), raw.end(), std::begin(g.raw));
  return g;
}

namespace {

std::optional<unsigned> hex_value(std::string_view part) {
  unsigned v = 0;
  const auto [p, ec] = std::from_chars(part.data(), part.data() + part.size(), v, 16);
  if (ec != std::errc{} || p != part.data() + part.size()) return std::nullopt;
  return v;
}

std::string quoted(std::string_view s) {
  std::string q = "\"";
  q.append(s.substr(0, 64));
  if (s.size() > 64) q.append("...");
  q.append("\"");
  return q;
}

}  // namespace

result<gid> parse_gid(std::string_view text) {
  gid g;
  std::size_t pos = 0;
  for (int i = 0; i < 16; ++i) {
    const std::size_t end = i == 15 ? text.size() : text.find(':', pos);
    if (end == std::string_view::npos)
      return fail(errc::invalid_argument, "gid " + quoted(text) + ": expected 16 ':'-separated parts, got " +
                                              std::to_string(i + 1));
    const std::string_view part = text.substr(pos, end - pos);
    if (i == 15 && part.find(':') != std::string_view::npos)
      return fail(errc::invalid_argument, "gid " + quoted(text) + ": more than 16 parts");
    if (part.empty() || part.size() > 2)
      return fail(errc::invalid_argument, "gid " + quoted(text) + ": part " + std::to_string(i) +
                                              " must be 1 or 2 hex digits, got " + quoted(part));
    const auto v = hex_value(part);
    if (!v || part.front() == '+' || part.front() == '-')
      return fail(errc::invalid_argument,
                  "gid " + quoted(text) + ": part " + std::to_string(i) + " is not hex: " + quoted(part));
    g.raw[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(*v);
    pos = end + 1;
  }
  return g;
}

result<gid> parse_sysfs_gid(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  gid g;
  if (text.size() != 39)
    return fail(errc::invalid_argument, "sysfs gid " + quoted(text) + ": expected 8 groups of 4 hex digits");
  for (std::size_t i = 0; i < 8; ++i) {
    if (i < 7 && text[i * 5 + 4] != ':')
      return fail(errc::invalid_argument, "sysfs gid " + quoted(text) + ": expected ':' after group " + std::to_string(i));
    const auto v = hex_value(text.substr(i * 5, 4));
    if (!v) return fail(errc::invalid_argument, "sysfs gid " + quoted(text) + ": group " + std::to_string(i) + " is not hex");
    g.raw[i * 2] = static_cast<std::uint8_t>(*v >> 8);
    g.raw[i * 2 + 1] = static_cast<std::uint8_t>(*v & 0xff);
  }
  return g;
}

namespace {

// Unpopulated type/ndev files fail to read (EINVAL from the kernel): nullopt.
std::optional<std::string> read_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

std::string where(std::string_view device, int port) {
  return std::string(device) + " port " + std::to_string(port);
}

}  // namespace

result<std::vector<gid_entry>> read_gid_table(std::string_view device, int port, std::string_view sysfs_root) {
  namespace fs = std::filesystem;
  if (device.empty() || device.find('/') != std::string_view::npos || device == "." || device == "..")
    return fail(errc::invalid_argument, "device name " + quoted(device) + " is not a device name");
  if (port < 1 || port > 255) return fail(errc::invalid_argument, "port " + std::to_string(port) + " is outside 1..255");
  const fs::path port_dir =
      fs::path(sysfs_root) / "class" / "infiniband" / std::string(device) / "ports" / std::to_string(port);
  std::error_code ec;
  if (!fs::is_directory(port_dir / "gids", ec))
    return fail(errc::device_not_found, where(device, port) + ": no GID table at " + (port_dir / "gids").string());

  std::vector<gid_entry> table;
  for (const auto& de : fs::directory_iterator(port_dir / "gids", ec)) {
    const std::string name = de.path().filename().string();
    int index = -1;
    const auto [p, perr] = std::from_chars(name.data(), name.data() + name.size(), index);
    if (perr != std::errc{} || p != name.data() + name.size() || index < 0) continue;
    const auto text = read_line(de.path());
    if (!text) continue;
    auto g = parse_sysfs_gid(*text);
    if (!g || g->is_zero()) continue;
    gid_entry e;
    e.index = index;
    e.value = *g;
    if (const auto t = read_line(port_dir / "gid_attrs" / "types" / name)) {
      if (*t == "RoCE v2")
        e.type = gid_type::roce_v2;
      else if (*t == "IB/RoCE v1")
        e.type = gid_type::ib_roce_v1;
    }
    if (const auto nd = read_line(port_dir / "gid_attrs" / "ndevs" / name)) e.netdev = *nd;
    table.push_back(std::move(e));
  }
  if (ec) return fail(errc::verbs_failed, where(device, port) + ": reading " + (port_dir / "gids").string() + ": " + ec.message());
  std::sort(table.begin(), table.end(), [](const gid_entry& a, const gid_entry& b) { return a.index < b.index; });
  return table;
}

result<int> select_gid_index(const std::vector<gid_entry>& table, std::string_view device, int port,
                             int explicit_index) {
  if (explicit_index >= 0) {
    const auto it = std::find_if(table.begin(), table.end(), [&](const gid_entry& e) { return e.index == explicit_index; });
    if (it == table.end())
      return fail(errc::gid_not_found, where(device, port) + ": GID index " + std::to_string(explicit_index) +
                                           " is not populated (" + std::to_string(table.size()) + " populated entries)");
    return explicit_index;
  }
  // Lower rank is better; see the header for the order.
  auto rank = [](const gid_entry& e) {
    const bool v2 = e.type == gid_type::roce_v2;
    const bool nd = !e.netdev.empty();
    if (v2 && nd && e.value.is_ipv4_mapped()) return 0;
    if (v2 && nd && !e.value.is_link_local()) return 1;
    if (v2 && nd) return 2;
    return 9;
  };
  const gid_entry* best = nullptr;
  for (const auto& e : table)
    if (rank(e) < 9 && (best == nullptr || rank(e) < rank(*best))) best = &e;
  if (best != nullptr) return best->index;
  // InfiniBand: no entry has a net device; the first populated GID is the port GID.
  const bool any_netdev = std::any_of(table.begin(), table.end(), [](const gid_entry& e) { return !e.netdev.empty(); });
  if (!any_netdev && !table.empty()) return table.front().index;
  return fail(errc::gid_not_found, where(device, port) + ": no usable GID (" + std::to_string(table.size()) +
                                       " populated entries, none RoCE v2 with a net device)");
}

result<int> select_gid_index(std::string_view device, int port, int explicit_index, std::string_view sysfs_root) {
  auto table = read_gid_table(device, port, sysfs_root);
  if (!table) return fail(std::move(table.error()));
  return select_gid_index(*table, device, port, explicit_index);
}

}  // namespace tide::verbs
