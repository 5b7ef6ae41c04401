#include <tide/topology/cpu_list.hpp>

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <string>

namespace tide::topology {
namespace {

// A CPU number: digits only (no sign, no spaces), as the kernel writes them.
bool read_cpu(std::string_view s, int& out) {
  if (s.empty() || s.front() < '0' || s.front() > '9') return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && p == s.data() + s.size();
}

}  // namespace

result<std::vector<int>> parse_cpu_list(std::string_view text, int cpu_count, std::string_view what) {
  const std::string where = std::string(what) + " \"" + std::string(text) + "\"";
  if (text.empty()) return fail(errc::config_invalid, where + ": empty (expected CPUs such as \"0,2-3\")");
  std::vector<int> cpus;
  std::string_view rest = text;
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto dash = item.find('-');
    int lo = 0;
    int hi = 0;
    const bool ok = dash == std::string_view::npos ? read_cpu(item, lo) && read_cpu(item, hi)
                                                   : read_cpu(item.substr(0, dash), lo) &&
                                                         read_cpu(item.substr(dash + 1), hi) && lo <= hi;
    if (!ok)
      return fail(errc::config_invalid,
                  where + ": \"" + std::string(item) + "\" is not a CPU or a range lo-hi (expected e.g. \"0,2-3\")");
    if (hi >= cpu_count)
      return fail(errc::config_invalid, where + ": CPU " + std::to_string(hi) + " does not exist (this machine has " +
                                            std::to_string(cpu_count) + ", 0-" + std::to_string(cpu_count - 1) + ")");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

int configured_cpus() noexcept {
  const long n = ::sysconf(_SC_NPROCESSORS_CONF);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace tide::topology
