#include "options.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

namespace tide::bench {
namespace {

template <class T>
result<T> parse_number(std::string_view flag, std::string_view text) {
  T value{};
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc{} || ptr != end || text.empty())
    return fail(errc::invalid_argument, "--" + std::string(flag) + ": '" + std::string(text) + "' is not a number");
  return value;
}

result<report_unit> parse_unit(std::string_view text) {
  static const std::map<std::string_view, double> kUnits = {
      {"GB", 1e9}, {"GiB", 1073741824.0}, {"Gb", 1e9 / 8}, {"MB", 1e6}, {"MiB", 1048576.0},
      {"Mb", 1e6 / 8}, {"KB", 1e3}, {"KiB", 1024.0}, {"Kb", 1e3 / 8}};
  auto it = kUnits.find(text);
  if (it == kUnits.end())
    return fail(errc::invalid_argument, "--report_unit: '" + std::string(text) +
                                            "' is not one of GB GiB Gb MB MiB Mb KB KiB Kb");
  return report_unit{std::string(text), it->second};
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    auto item = text.substr(0, comma);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

}  // namespace

result<std::uint64_t> parse_size(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return fail(errc::invalid_argument, "'" + std::string(text) + "' is not a size");
  auto base = parse_number<std::uint64_t>("size", text.substr(0, digits));
  if (!base) return fail(errc::invalid_argument, "'" + std::string(text) + "' is not a size");
  const std::string_view suffix = text.substr(digits);
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KiB" || suffix == "k") shift = 10;
  else if (suffix == "M" || suffix == "MiB") shift = 20;
  else if (suffix == "G" || suffix == "GiB") shift = 30;
  else return fail(errc::invalid_argument, "'" + std::string(text) + "': unknown size suffix (use K, M, G)");
  if (shift > 0 && *base > (~std::uint64_t{0} >> shift))
    return fail(errc::invalid_argument, "'" + std::string(text) + "' overflows");
  return *base << shift;
}

result<bench_options> parse_options(int argc, const char* const* argv,
                                    const std::vector<std::string>& policy_names) {
  bench_options o;
  using setter = std::function<status(std::string_view)>;
  auto size_flag = [](std::string_view name, std::uint64_t& dst) {
    return [name, &dst](std::string_view v) -> status {
      auto s = parse_size(v);
      if (!s) return fail(errc::invalid_argument, "--" + std::string(name) + ": " + s.error().detail);
      if (*s == 0) return fail(errc::invalid_argument, "--" + std::string(name) + " must be > 0");
      dst = *s;
      return {};
    };
  };
  const std::map<std::string_view, setter> value_flags = {
      {"mode", [&](std::string_view v) -> status {
         if (v == "initiator") o.mode = bench_mode::initiator;
         else if (v == "target") o.mode = bench_mode::target;
         else return fail(errc::invalid_argument, "--mode: '" + std::string(v) + "' is not initiator or target");
         return {};
       }},
      {"operation", [&](std::string_view v) -> status {
         if (v == "read") o.operation = bench_operation::read;
         else if (v == "write") o.operation = bench_operation::write;
         else return fail(errc::invalid_argument, "--operation: '" + std::string(v) + "' is not read or write");
         return {};
       }},
      {"metadata_server", [&](std::string_view v) -> status { o.metadata_server = v; return {}; }},
      {"local_server_name", [&](std::string_view v) -> status { o.local_server_name = v; return {}; }},
      {"auth_secret_file", [&](std::string_view v) -> status { o.auth_secret_file = v; return {}; }},
      {"segment_id", [&](std::string_view v) -> status { o.segment_id = v; return {}; }},
      {"device_name", [&](std::string_view v) -> status {
         o.device_names = split_list(v);
         if (o.device_names.empty()) return fail(errc::invalid_argument, "--device_name: empty list");
         return {};
       }},
      {"protocol", [&](std::string_view v) -> status {
         if (v != "rdma" && v != "tcp")
           return fail(errc::invalid_argument, "--protocol: rdma or tcp, not '" + std::string(v) + "'");
         o.protocol = v;
         return {};
       }},
      {"buffer_size", size_flag("buffer_size", o.buffer_size)},
      {"block_size", size_flag("block_size", o.block_size)},
      {"batch_size", [&](std::string_view v) -> status {
         auto n = parse_number<std::uint32_t>("batch_size", v);
         if (!n) return fail(n.error());
         if (*n == 0) return fail(errc::invalid_argument, "--batch_size must be > 0");
         o.batch_size = *n;
         return {};
       }},
      {"threads", [&](std::string_view v) -> status {
         auto n = parse_number<std::uint32_t>("threads", v);
         if (!n) return fail(n.error());
         if (*n == 0 || *n > 1024) return fail(errc::invalid_argument, "--threads must be in 1..1024");
         o.threads = *n;
         return {};
       }},
      {"duration", [&](std::string_view v) -> status {
         auto n = parse_number<double>("duration", v);
         if (!n) return fail(n.error());
         if (!(*n > 0) || !std::isfinite(*n)) return fail(errc::invalid_argument, "--duration must be > 0 seconds");
         o.duration_s = *n;
         return {};
       }},
      {"report_unit", [&](std::string_view v) -> status {
         auto u = parse_unit(v);
         if (!u) return fail(u.error());
         o.unit = *u;
         return {};
       }},
      {"policy", [&](std::string_view v) -> status {
         if (std::find(policy_names.begin(), policy_names.end(), v) == policy_names.end())
           return fail(errc::invalid_argument, "--policy: no policy set named '" + std::string(v) + "'");
         o.policy = v;
         return {};
       }},
      {"json", [&](std::string_view v) -> status { o.json_path = v; return {}; }},
      {"metrics_port", [&](std::string_view v) -> status {
         auto n = parse_number<std::uint32_t>("metrics_port", v);
         if (!n) return fail(n.error());
         if (*n == 0 || *n > 65535) return fail(errc::invalid_argument, "--metrics_port must be in 1..65535");
         o.metrics_port = static_cast<std::uint16_t>(*n);
         return {};
       }},
  };
  const std::map<std::string_view, bool*> bool_flags = {{"progress", &o.progress}, {"help", &o.help}};

  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("--")) arg.remove_prefix(2);
    else if (arg.starts_with("-") && arg.size() > 1) arg.remove_prefix(1);
    else return fail(errc::invalid_argument, "unexpected argument '" + std::string(arg) + "'");
    if (arg == "h") arg = "help";

    std::string_view name = arg;
    std::optional<std::string_view> value;
    if (auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (auto b = bool_flags.find(name); b != bool_flags.end()) {
      if (!value || *value == "true" || *value == "1") *b->second = true;
      else if (*value == "false" || *value == "0") *b->second = false;
      else return fail(errc::invalid_argument, "--" + std::string(name) + ": '" + std::string(*value) + "' is not true or false");
      continue;
    }
    if (name.starts_with("no") && bool_flags.count(name.substr(2)) && !value) {
      *bool_flags.at(name.substr(2)) = false;
      continue;
    }
    auto f = value_flags.find(name);
    if (f == value_flags.end()) return fail(errc::invalid_argument, "unknown flag --" + std::string(name));
    if (!value) {
      if (i + 1 >= argc) return fail(errc::invalid_argument, "--" + std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (auto s = f->second(*value); !s) return fail(s.error());
  }
  if (o.help) return o;
  if (o.mode == bench_mode::initiator && o.segment_id.empty())
    return fail(errc::invalid_argument, "--segment_id is required in initiator mode (the target prints it)");
  if (o.block_size > o.buffer_size)
    return fail(errc::invalid_argument, "--block_size exceeds --buffer_size");
  if (o.mode == bench_mode::initiator &&
      static_cast<std::uint64_t>(o.block_size) * o.batch_size * o.threads > o.buffer_size)
    return fail(errc::invalid_argument,
                "--block_size x --batch_size x --threads exceeds --buffer_size (each thread needs its own region)");
  return o;
}

std::string usage(const std::vector<std::string>& policy_names) {
  std::ostringstream os;
  os << "usage: tide-bench --mode=target|initiator [flags]\n"
        "  --mode              target (serves a buffer) or initiator (drives transfers)\n"
        "  --metadata_server   P2PHANDSHAKE (default), etcd://host:port[,host:port], http://host:port/path\n"
        "  --local_server_name this process's host[:port] (default 127.0.0.1)\n"
        "  --auth_secret_file  cluster secret file (>= 32 random bytes, mode 0600); both sides need it\n"
        "  --segment_id        the target's segment name (initiator; the target prints it)\n"
        "  --device_name       RDMA devices to use, comma-separated (default: all)\n"
        "  --protocol          rdma (default) or tcp (Mooncake's data-port protocol, no RDMA device needed)\n"
        "  --operation         read (default) or write\n"
        "  --buffer_size       bytes registered on each side (default 1G)\n"
        "  --batch_size        requests per batch (default 128)\n"
        "  --block_size        bytes per request (default 64K)\n"
        "  --duration          seconds to run (default 10)\n"
        "  --threads           submitting threads (default 12)\n"
        "  --report_unit       GB GiB Gb MB MiB Mb KB KiB Kb (default GB)\n"
        "  --policy            policy set:";
  for (const auto& p : policy_names) os << ' ' << p;
  os << "\n"
        "  --json FILE         also write the report as JSON\n"
        "  --metrics_port N    serve Prometheus metrics on http://127.0.0.1:N/metrics while running\n"
        "  --noprogress        no progress line on stderr\n";
  return os.str();
}

}  // namespace tide::bench
