#include "options.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
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

// gflags' words for a bool.
std::optional<bool> parse_bool(std::string_view v) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "true" || s == "t" || s == "yes" || s == "y" || s == "1") return true;
  if (s == "false" || s == "f" || s == "no" || s == "n" || s == "0") return false;
  return std::nullopt;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// "--name=value" / "-name value" split; nullopt for a word that is no flag.
struct flag_word {
  std::string name;
  std::optional<std::string> value;
};
std::optional<flag_word> split_flag(std::string_view arg) {
  if (arg.starts_with("--")) arg.remove_prefix(2);
  else if (arg.starts_with("-") && arg.size() > 1) arg.remove_prefix(1);
  else return std::nullopt;
  flag_word w;
  if (auto eq = arg.find('='); eq != std::string_view::npos) {
    w.name = std::string(arg.substr(0, eq));
    w.value = std::string(arg.substr(eq + 1));
  } else {
    w.name = std::string(arg);
  }
  // tide's kebab spellings (--list-policies, --print-config) and gflags' snake case are one name.
  std::replace(w.name.begin(), w.name.end(), '-', '_');
  return w;
}

// The program names a flagfile section may name (gflags matches argv[0]).
bool section_matches(const std::string& globs, const std::string& argv0) {
  const std::string base = argv0.substr(argv0.find_last_of('/') + 1);
  std::istringstream words(globs);
  std::string g;
  while (words >> g)
    for (const std::string& name : {base, std::string("transfer_engine_bench"), argv0})
      if (::fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

// argv with every --flagfile replaced by the flags its file holds.
status expand_flagfiles(const std::vector<std::string>& in, const std::string& argv0, int depth,
                        std::vector<std::string>& out) {
  for (std::size_t i = 0; i < in.size(); ++i) {
    auto w = split_flag(in[i]);
    if (!w || w->name != "flagfile") {
      out.push_back(in[i]);
      if (in[i] == "--") {
        out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(i) + 1, in.end());
        return {};
      }
      continue;
    }
    std::string path;
    if (w->value) path = *w->value;
    else if (i + 1 < in.size()) path = in[++i];
    else return fail(errc::invalid_argument, "--flagfile needs a value");
    if (depth > 8) return fail(errc::invalid_argument, "--flagfile=" + path + ": nested more than 8 deep");
    for (const auto& p : split_list(path)) {
      std::ifstream f(p);
      if (!f) return fail(errc::invalid_argument, "--flagfile: cannot read '" + p + "'");
      std::vector<std::string> lines;
      std::string line;
      bool applies = true;
      while (std::getline(f, line)) {
        const std::string t = trim(line);
        if (t.empty() || t[0] == '#') continue;
        if (t[0] != '-') {
          applies = section_matches(t, argv0);  // a section for the programs it names
          continue;
        }
        if (applies) lines.push_back(t);
      }
      if (auto r = expand_flagfiles(lines, argv0, depth + 1, out); !r) return r;
    }
  }
  return {};
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

result<std::string> normalize_metadata_server(std::string_view text) {
  if (text == "P2PHANDSHAKE" || text.starts_with("etcd://") || text.starts_with("etcds://") ||
      text.starts_with("http://"))
    return std::string(text);
  if (text.starts_with("https://"))
    return fail(errc::invalid_argument, "--metadata_server: '" + std::string(text) +
                                            "': tide's http metadata client speaks plain http only; use http://, "
                                            "or etcds:// for TLS");
  if (const auto scheme = text.find("://"); scheme != std::string_view::npos)
    return fail(errc::invalid_argument, "--metadata_server: '" + std::string(text) + "': tide has no " +
                                            std::string(text.substr(0, scheme)) +
                                            " metadata backend (P2PHANDSHAKE, etcd://, etcds://, http://, or a bare "
                                            "host:port for etcd)");
  // Mooncake reads a connection string without a scheme as etcd.
  for (const auto& member : split_list(text)) {
    const auto colon = member.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == member.size() ||
        !parse_number<std::uint16_t>("metadata_server", std::string_view(member).substr(colon + 1)))
      return fail(errc::invalid_argument, "--metadata_server: '" + std::string(text) +
                                              "' is not P2PHANDSHAKE, etcd://h:p, etcds://h:p, http://h:p/path or "
                                              "a bare host:port (etcd)");
  }
  if (text.empty()) return fail(errc::invalid_argument, "--metadata_server: empty");
  return "etcd://" + std::string(text);
}

result<bench_options> parse_options(int argc, const char* const* argv,
                                    const std::vector<std::string>& policy_names) {
  bench_options o;
  const std::string argv0 = argc > 0 && argv[0] != nullptr ? argv[0] : "tide-bench";
  std::vector<std::string> raw;
  for (int i = 1; i < argc; ++i) raw.emplace_back(argv[i]);
  std::vector<std::string> args;
  if (auto r = expand_flagfiles(raw, argv0, 0, args); !r) return fail(r.error());

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
  const std::map<std::string, setter, std::less<>> value_flags = {
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
      {"metadata_server", [&](std::string_view v) -> status {
         auto m = normalize_metadata_server(v);
         if (!m) return fail(m.error());
         o.metadata_server = *m;
         return {};
       }},
      {"local_server_name", [&](std::string_view v) -> status { o.local_server_name = v; return {}; }},
      {"auth_secret_file", [&](std::string_view v) -> status { o.auth_secret_file = v; return {}; }},
      {"segment_id", [&](std::string_view v) -> status { o.segment_id = v; return {}; }},
      {"device_name", [&](std::string_view v) -> status {
         o.device_names = split_list(v);
         if (o.device_names.empty()) return fail(errc::invalid_argument, "--device_name: empty list");
         return {};
       }},
      {"nic_priority_matrix", [&](std::string_view v) -> status {
         if (!v.empty() && !std::ifstream(std::string(v)))
           return fail(errc::invalid_argument, "--nic_priority_matrix: cannot read '" + std::string(v) + "'");
         o.nic_priority_matrix = v;
         return {};
       }},
      {"protocol", [&](std::string_view v) -> status {
         if (v != "rdma" && v != "tcp")
           return fail(errc::invalid_argument, "--protocol: rdma or tcp, not '" + std::string(v) +
                                                   "' (tide has Mooncake's RDMA and TCP transports only)");
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
      {"report_precision", [&](std::string_view v) -> status {
         auto n = parse_number<unsigned>("report_precision", v);
         if (!n) return fail(n.error());
         if (*n > 17) return fail(errc::invalid_argument, "--report_precision must be in 0..17");
         o.report_precision = *n;
         return {};
       }},
      {"backend", [&](std::string_view v) -> status {
         if (v == "classic") return {};
         if (v == "tent")
           return fail(errc::invalid_argument,
                       "--backend=tent: tide has no TENT backend; it is Mooncake's classic engine (--backend=classic)");
         return fail(errc::invalid_argument, "--backend: '" + std::string(v) + "' is not classic (or Mooncake's tent)");
       }},
      {"gpu_id", [&](std::string_view v) -> status {
         int n = -1;
         const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
         if (ec != std::errc{} || end != v.data() + v.size() || n < 0 || n > 1023)
           return fail(errc::invalid_argument, "--gpu_id: '" + std::string(v) + "' is not a CUDA device number");
         o.gpu_id = n;
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
  bool help_short = false, help_full = false;
  const std::map<std::string, bool*, std::less<>> bool_flags = {
      {"progress", &o.progress},       {"help", &o.help},
      {"helpshort", &help_short},      {"helpfull", &help_full},
      {"auto_discovery", &o.auto_discovery}, {"use_vram", &o.use_vram},
      {"init_mem", &o.init_mem},         {"list_policies", &o.list_policies},
      {"print_config", &o.print_config}};

  // gflags reads --undefok wherever it stands.
  std::set<std::string, std::less<>> undefok;
  for (const auto& a : args) {
    if (a == "--") break;
    if (auto w = split_flag(a); w && w->name == "undefok" && w->value)
      for (auto& n : split_list(*w->value)) undefok.insert(n);
  }

  // One flag; `next` gives the following word as a value where the flag takes one.
  std::function<status(const flag_word&, const std::function<std::optional<std::string>()>&)> apply;
  apply = [&](const flag_word& w, const std::function<std::optional<std::string>()>& next) -> status {
    const std::string& name = w.name == "h" ? std::string("help") : w.name;
    if (name == "undefok") {
      if (!w.value) (void)next();
      return {};
    }
    if (name == "fromenv" || name == "tryfromenv") {
      auto list = w.value ? w.value : next();
      if (!list) return fail(errc::invalid_argument, "--" + name + " needs a value");
      for (const auto& n : split_list(*list)) {
        const char* v = std::getenv(("FLAGS_" + n).c_str());
        if (v == nullptr) {
          if (name == "fromenv") return fail(errc::invalid_argument, "--fromenv: FLAGS_" + n + " is not set");
          continue;
        }
        if (auto r = apply(flag_word{n, std::string(v)}, [] { return std::optional<std::string>(); }); !r) return r;
      }
      return {};
    }
    if (auto b = bool_flags.find(name); b != bool_flags.end()) {
      if (!w.value) {
        *b->second = true;
      } else if (auto v = parse_bool(*w.value)) {
        *b->second = *v;
      } else {
        return fail(errc::invalid_argument, "--" + name + ": '" + *w.value + "' is not true or false");
      }
      o.given.insert(name);
      return {};
    }
    if (name.starts_with("no") && bool_flags.count(name.substr(2)) != 0 && !w.value) {
      *bool_flags.at(name.substr(2)) = false;
      o.given.insert(name.substr(2));
      return {};
    }
    auto f = value_flags.find(name);
    if (f == value_flags.end()) {
      const std::string base = name.starts_with("no") ? name.substr(2) : name;
      // gflags cannot know whether an undefined flag takes a value: it takes none.
      if (undefok.count(name) != 0 || undefok.count(base) != 0) return {};
      return fail(errc::invalid_argument, "unknown flag --" + name);
    }
    auto value = w.value ? w.value : next();
    if (!value) return fail(errc::invalid_argument, "--" + name + " needs a value");
    if (auto s = f->second(*value); !s) return s;
    o.given.insert(name);
    return {};
  };

  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      if (i + 1 < args.size()) return fail(errc::invalid_argument, "unexpected argument '" + args[i + 1] + "'");
      break;
    }
    auto w = split_flag(args[i]);
    if (!w) return fail(errc::invalid_argument, "unexpected argument '" + args[i] + "'");
    auto next = [&]() -> std::optional<std::string> {
      if (i + 1 >= args.size()) return std::nullopt;
      return args[++i];
    };
    if (auto s = apply(*w, next); !s) return fail(s.error());
  }

  o.help = o.help || help_short || help_full;
  if (o.help || o.list_policies) return o;
  if (o.mode == bench_mode::initiator && o.segment_id.empty() && !o.print_config)
    return fail(errc::invalid_argument, "--segment_id is required in initiator mode (the target prints it)");
  if (o.auto_discovery) {
    for (const char* f : {"device_name", "protocol", "nic_priority_matrix"})
      if (o.given.count(f) != 0)
        o.warnings.push_back(std::string("--") + f + " is not used with --auto_discovery (every device and transport), "
                                                     "as in Mooncake");
  }
  // Mooncake raises a buffer too small for every thread's region, and says so.
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(o.block_size, std::uint64_t{o.batch_size}, &need) ||
      __builtin_mul_overflow(need, std::uint64_t{o.threads}, &need) || need > (std::uint64_t{1} << 48))
    return fail(errc::invalid_argument, "--block_size x --batch_size x --threads is more than 256 TiB");
  if (o.buffer_size < need) {
    o.warnings.push_back("--buffer_size " + std::to_string(o.buffer_size) +
                         " is smaller than --block_size x --batch_size x --threads; using " + std::to_string(need) +
                         ", as Mooncake does");
    o.buffer_size = need;
  }
  return o;
}

std::string usage(const std::vector<std::string>& policy_names) {
  std::ostringstream os;
  os << "usage: tide-bench --mode=target|initiator [flags]   (the flags of Mooncake's transfer_engine_bench)\n"
        "  --mode                target (serves a buffer) or initiator (default; drives transfers)\n"
        "  --metadata_server     P2PHANDSHAKE (default), etcd://h:p[,h:p], h:p (etcd), etcds://h:p (TLS),\n"
        "                        http://h:p/path\n"
        "  --local_server_name   this process's host[:port] (default: the first non-loopback IPv4 address)\n"
        "  --segment_id          the target's segment name (initiator; the target prints it)\n"
        "  --device_name         RDMA devices to use, comma-separated (default: all)\n"
        "  --nic_priority_matrix a file holding the NIC priority matrix (JSON, Mooncake's format)\n"
        "  --auto_discovery      every device and transport the engine finds (--device_name, --protocol unused)\n"
        "  --protocol            rdma (default) or tcp (Mooncake's data-port protocol, no RDMA device needed)\n"
        "  --operation           read (default) or write\n"
        "  --buffer_size         bytes registered on each side (default 1G; raised to block x batch x threads)\n"
        "  --batch_size          requests per batch (default 128)\n"
        "  --block_size          bytes per request (default 64K)\n"
        "  --duration            seconds to run (default 10)\n"
        "  --threads             submitting threads (default 12)\n"
        "  --report_unit         GB GiB Gb MB MiB Mb KB KiB Kb (default GB)\n"
        "  --report_precision    decimals of the throughput (default 2)\n"
        "  --backend             classic (the default and only one; Mooncake's tent is refused)\n"
        "  --use_vram            GPU memory (cuMemAlloc on --gpu_id, default 0) instead of host memory (default "
        "false)\n"
        "  --init_mem            fill the buffer before use (default true)\n"
        "tide's own:\n"
        "  --policy              policy set:";
  for (const auto& p : policy_names) os << ' ' << p;
  os << "\n"
        "  --auth_secret_file    cluster secret file (>= 32 random bytes, mode 0600); both sides need it\n"
        "  --json FILE           also write the report as JSON\n"
        "  --metrics_port N      serve Prometheus metrics on http://127.0.0.1:N/metrics while running\n"
        "  --noprogress          no progress line on stderr\n"
        "  --print_config        print the engine configuration these flags give and where each value\n"
        "                        came from (defaults, TIDE_CONFIG, TIDE_*/MC_* variables, flags), then exit\n"
        "  --list_policies       the compiled policy sets, one per line\n"
        "gflags' --flagfile=FILE, --undefok=a,b, --fromenv=a,b, --tryfromenv=a,b work as there.\n"
        "Output: the target prints \"segment: <name>\" on stdout; the initiator prints Mooncake's line\n"
        "\"Test completed: duration D, batch count N, throughput T <unit>/s\" on stderr, then tide's figures.\n"
        "Exit status: 0 ok, 1 a run failed, 2 a bad flag.\n";
  return os.str();
}

}  // namespace tide::bench
