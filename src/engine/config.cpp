// engine_config: the TIDE_CONFIG file, the environment (config_env.cpp)
// and the program's values, applied through one table of settings
// (config_table.hpp) in the order resolve() documents.
#include "config_values.hpp"

#include <tide/detail/log.hpp>
#include <tide/topology/priority_matrix.hpp>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

namespace tide {

std::string config_table::env_name(std::string_view key) {
  std::string s = "TIDE_";
  for (char ch : key) s += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

namespace config_detail {

// Each distinct text once per process.
void warner::operator()(const std::string& text) const {
  if (report_ != nullptr) report_->warnings.push_back(text);
  static std::mutex mu;
  static std::set<std::string, std::less<>> said;
  {
    std::lock_guard lock(mu);
    if (!said.insert(text).second) return;
  }
  TIDE_LOG_WARN(text);
}

}  // namespace config_detail

namespace {
using namespace config_detail;

// A value as JSON writes it; long text is shortened (a topology matrix).
template <class T>
std::string render(const T& v) {
  if constexpr (is_text<T>) {
    if (v.size() > 72) return nlohmann::json(v.substr(0, 60)).dump() + "... (" + std::to_string(v.size()) + " bytes)";
    return nlohmann::json(v).dump();
  } else if constexpr (is_list<T>) {
    return nlohmann::json(v).dump();
  } else if constexpr (is_flag<T>) {
    return v ? "true" : "false";
  } else if constexpr (is_duration<T>::value) {
    return std::to_string(v.count());
  } else {
    return std::to_string(static_cast<long long>(v));
  }
}

// One JSON object onto a copy of `c`, all or nothing; `keys` receives the
// keys it set.
status apply_json_object(engine_config& c, std::string_view text, const std::string& origin,
                         std::vector<std::string>* keys) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return fail(errc::config_invalid, origin + ": not JSON: " + e.what());
  }
  if (!root.is_object()) return fail(errc::config_invalid, origin + ": expected a JSON object");
  engine_config next = c;
  std::vector<std::string> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    const std::string where = origin + ": \"" + key + "\"";
    bool known = false;
    auto r = ct::each([&](const ct::spec& s, auto member) -> status {
      if (s.key != key) return {};
      known = true;
      auto& field = next.*member;
      using T = field_t<decltype(field)>;
      if constexpr (is_text<T>) {
        if (!v.is_string()) return fail(errc::config_invalid, where + ": expected a string, got " + v.dump());
        field = v.get<std::string>();
      } else if constexpr (is_list<T>) {
        if (!v.is_array()) return fail(errc::config_invalid, where + ": expected an array of names");
        T list;
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (!v[i].is_string() || v[i].get<std::string>().empty())
            return fail(errc::config_invalid,
                        where + "[" + std::to_string(i) + "]: expected a device name, got " + v[i].dump());
          list.push_back(v[i].get<std::string>());
        }
        field = std::move(list);
      } else {
        // A flag may be written true / false as well as 1 / 0.
        if constexpr (is_flag<T>) {
          if (v.is_boolean()) {
            field = v.get<bool>();
            return {};
          }
          if (!v.is_number_integer())
            return fail(errc::config_invalid, where + ": expected true, false, 0 or 1, got " + v.dump());
        }
        if (!v.is_number_integer())
          return fail(errc::config_invalid, where + ": " + range_text(s.lo, s.hi) + ", got " + v.dump());
        const long long x = v.is_number_unsigned() && v.get<unsigned long long>() > static_cast<unsigned long long>(s.hi)
                                ? s.hi + 1
                                : v.get<long long>();
        if (x < s.lo || x > s.hi)
          return fail(errc::config_invalid, where + ": " + range_text(s.lo, s.hi) + ", got " + v.dump());
        assign(field, x);
      }
      return {};
    });
    if (!r) return r;
    if (!known) return fail(errc::config_invalid, origin + ": unknown key \"" + key + "\"");
    seen.push_back(key);
  }
  c = std::move(next);
  if (keys != nullptr) keys->insert(keys->end(), seen.begin(), seen.end());
  return {};
}

status read_text_file(const std::string& path, const std::string& what, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errc::config_invalid, what + " " + path + ": cannot open (" + std::strerror(errno) + ")");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return fail(errc::config_invalid, what + " " + path + ": read error");
  out = s.str();
  return {};
}

// TIDE_CONFIG's file onto `c`.
status apply_config_file(engine_config& c, source_map* sources, std::string* path_out) {
  const char* path = getenv_set("TIDE_CONFIG");
  if (path == nullptr) return {};
  if (path_out) *path_out = path;
  std::string text;
  if (auto r = read_text_file(path, "config file", text); !r)
    return fail(errc::config_invalid, "TIDE_CONFIG: " + r.error().detail);
  std::vector<std::string> keys;
  if (auto r = apply_json_object(c, text, "config file " + std::string(path), &keys); !r)
    return fail(errc::config_invalid, "TIDE_CONFIG: " + r.error().detail);
  if (sources)
    for (const auto& k : keys) (*sources)[k] = {config_source::file, path};
  return {};
}

// This host's first non-loopback IPv4 address that is up, and its interface.
std::optional<std::pair<std::string, std::string>> first_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return std::nullopt;
  std::optional<std::pair<std::string, std::string>> found;
  for (ifaddrs* a = list; a != nullptr && !found; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) != 0 || (a->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr) found.emplace(text, a->ifa_name);
  }
  ::freeifaddrs(list);
  return found;
}

// custom_topology_file into custom_topology_json (which wins when set).
status read_topology_file(engine_config& c, source_map& sources, const warner& warn) {
  if (c.custom_topology_file.empty()) return {};
  const auto& src = sources["custom_topology_file"];
  const bool from_mooncake = src.first == config_source::environment && src.second.starts_with("MC_");
  const std::string named = "custom_topology_file (" + (src.second.empty() ? std::string(to_string(src.first)) : src.second) + ")";
  if (!c.custom_topology_json.empty()) {
    warn(named + " \"" + c.custom_topology_file + "\" is not read: custom_topology_json is set and wins");
    return {};
  }
  std::string text;
  status r = read_text_file(c.custom_topology_file, named + ":", text);
  if (r) {
    if (auto m = topology::priority_matrix::from_json(text); !m)
      r = fail(errc::config_invalid, named + " " + c.custom_topology_file + ": " + m.error().detail);
  }
  if (!r) {
    if (!from_mooncake) return r;
    warn(r.error().detail + "; the device scan is used instead, as Mooncake does");
    c.custom_topology_file.clear();
    return {};
  }
  c.custom_topology_json = std::move(text);
  sources["custom_topology_json"] = {config_source::file, c.custom_topology_file};
  return {};
}

}  // namespace

std::string_view to_string(config_source s) noexcept {
  switch (s) {
    case config_source::default_value: return "default";
    case config_source::automatic: return "automatic";
    case config_source::file: return "file";
    case config_source::environment: return "environment";
    case config_source::program: return "program";
  }
  return "?";
}

std::string config_report::to_text() const {
  std::size_t width = 0;
  for (const auto& s : settings) width = std::max(width, s.key.size() + 3 + s.value.size());
  std::string out;
  for (const auto& s : settings) {
    std::string line = s.key + " = " + s.value;
    line.resize(std::max(line.size(), width + 2), ' ');
    line += "(" + std::string(to_string(s.source));
    if (!s.origin.empty()) line += " " + s.origin;
    line += ")\n";
    out += line;
  }
  for (const auto& w : warnings) out += "warning: " + w + "\n";
  return out;
}

status engine_config::apply_file(const std::string& path) {
  std::string text;
  if (auto r = read_text_file(path, "config file", text); !r) return r;
  return apply_json(text, "config file " + path);
}

status engine_config::apply_json(std::string_view text, const std::string& origin) {
  std::vector<std::string> keys;
  if (auto r = apply_json_object(*this, text, origin, &keys); !r) return r;
  set_keys.insert(keys.begin(), keys.end());
  return {};
}

result<engine_config> engine_config::from_file(const std::string& path) {
  engine_config c;
  if (auto r = c.apply_file(path); !r) return fail(r.error());
  return c;
}

status engine_config::apply_env() {
  const warner warn(nullptr);
  if (auto r = apply_config_file(*this, nullptr, nullptr); !r) return r;
  if (auto r = apply_environment(*this, warn, nullptr); !r) return r;
  check_names(warn);
  return {};
}

result<engine_config> engine_config::resolve(config_report* report) const {
  config_report local;
  config_report& rep = report != nullptr ? *report : local;
  rep = config_report{};
  const warner warn(&rep);
  const engine_config defaults;
  engine_config out;
  source_map sources;
  if (auto r = apply_config_file(out, &sources, &rep.file); !r) return fail(r.error());
  if (auto r = apply_environment(out, warn, &sources); !r) return fail(r.error());
  for (const auto& k : set_keys) {
    bool known = false;
    (void)ct::each([&](const ct::spec& s, auto) -> status {
      known = known || s.key == k;
      return {};
    });
    if (!known) return fail(errc::config_invalid, "set_keys: unknown key \"" + k + "\"");
  }
  // The program's values last; they are checked against the same ranges.
  auto r = ct::each([&](const ct::spec& s, auto member) -> status {
    const auto& mine = this->*member;
    using T = field_t<decltype(mine)>;
    if (mine == defaults.*member && !set_keys.contains(s.key)) return {};
    if constexpr (!is_text<T> && !is_list<T>) {
      long long x = 0;
      if constexpr (is_duration<T>::value) x = static_cast<long long>(mine.count());
      else x = static_cast<long long>(mine);
      if (x < s.lo || x > s.hi)
        return fail(errc::config_invalid, std::string(s.key) + " = " + std::to_string(x) + ": " + range_text(s.lo, s.hi));
    }
    out.*member = mine;
    sources[std::string(s.key)] = {config_source::program, ""};
    return {};
  });
  if (!r) return fail(r.error());
  out.set_keys = set_keys;

  if (out.local_server_name.empty()) {
    if (auto ip = first_ipv4()) {
      out.local_server_name = ip->first;
      sources["local_server_name"] = {config_source::automatic, "first non-loopback IPv4 address, on " + ip->second};
    } else {
      out.local_server_name = "127.0.0.1";
      sources["local_server_name"] = {config_source::automatic,
                                      "no non-loopback IPv4 address: only this host can reach 127.0.0.1"};
    }
  }
  if (auto t = read_topology_file(out, sources, warn); !t) return fail(t.error());
  check_names(warn);
  // The log threshold is read now, so a bad TIDE_LOG_LEVEL is reported at create (the log
  // module says so once; the report says so every time).
  (void)get_log_level();
  for (const char* name : {"TIDE_LOG_LEVEL", "MC_LOG_LEVEL"}) {
    const char* v = getenv_set(name);
    if (v == nullptr) continue;
    if (!parse_log_level(v))
      rep.warnings.push_back(std::string(name) + "=\"" + std::string(v).substr(0, 64) +
                             "\" is not a log level (error, warn, info, debug, off); using warn");
    break;
  }

  (void)ct::each([&](const ct::spec& s, auto member) -> status {
    config_value v;
    v.key = std::string(s.key);
    v.value = render(out.*member);
    if (auto it = sources.find(s.key); it != sources.end()) {
      v.source = it->second.first;
      v.origin = it->second.second;
    }
    rep.settings.push_back(std::move(v));
    return {};
  });
  return out;
}

result<transport_set> parse_transports(std::string_view text) {
  transport_set t;
  t.rdma = t.tcp = false;
  for (std::string_view word : config_detail::comma_words(text)) {
    if (word == "rdma") t.rdma = true;
    else if (word == "tcp") t.tcp = true;
    else
      return fail(errc::config_invalid, "transports \"" + std::string(text) + "\": \"" + std::string(word) +
                                            "\" is not a transport (rdma, tcp, or both: \"rdma,tcp\")");
  }
  return t;
}

}  // namespace tide

namespace tide::detail {

void log_config_sources(const config_report& report) {
  if (!log_enabled(log_level::info)) return;
  std::string file, env, program, automatic;
  for (const auto& s : report.settings) {
    switch (s.source) {
      case config_source::file: file += (file.empty() ? "" : ", ") + s.key; break;
      case config_source::environment: env += (env.empty() ? "" : ", ") + s.origin; break;
      case config_source::program: program += (program.empty() ? "" : ", ") + s.key; break;
      case config_source::automatic: automatic += "; " + s.key + " " + s.value + " (" + s.origin + ")"; break;
      case config_source::default_value: break;
    }
  }
  std::string line = "configuration: defaults";
  if (!report.file.empty()) line += "; TIDE_CONFIG " + report.file + ": " + (file.empty() ? "nothing" : file);
  if (!env.empty()) line += "; environment: " + env;
  if (!program.empty()) line += "; program: " + program;
  line += automatic;
  log_write(log_level::info, line);
}

}  // namespace tide::detail
