// engine_config from the environment: TIDE_<KEY>, the former TIDE_
// spellings, and Mooncake's MC_* variables read the way Mooncake reads
// them; and the warnings for names that look like settings and are none.
#include "config_values.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace tide::config_detail {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return out;
}

std::optional<bool> parse_flag(std::string_view text) {
  const std::string s = lower(text);
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view item : comma_words(text))
    if (!item.empty()) out.emplace_back(item);
  return out;
}

// A strict value for a field: the file, TIDE_* variables and the program
// all get these ranges, and an error names `where`.
template <class T>
status parse_strict(T& field, const ct::spec& s, const std::string& where, std::string_view text) {
  if constexpr (is_text<T>) {
    field = std::string(text);
  } else if constexpr (is_list<T>) {
    field = split_list(text);
  } else if constexpr (is_flag<T>) {
    auto b = parse_flag(text);
    if (!b) return fail(errc::config_invalid, where + "=\"" + std::string(text) + "\": expected 1/true/yes/on or 0/false/no/off");
    field = *b;
  } else {
    long long x = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
    if (ec != std::errc{} || p != text.data() + text.size() || x < s.lo || x > s.hi)
      return fail(errc::config_invalid, where + "=\"" + std::string(text) + "\": " + range_text(s.lo, s.hi));
    assign(field, x);
  }
  return {};
}

// Mooncake reads its numbers with atoi / stoi: leading blanks, a sign, the
// digits; whatever follows is dropped.
struct leading_int {
  long long value = 0;
  bool any = false;       ///< there were digits
  bool trailing = false;  ///< something followed them
};
leading_int read_leading_int(std::string_view s) {
  leading_int r;
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  const std::size_t digits = i;
  long long v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    if (v < (1LL << 50)) v = v * 10 + (s[i] - '0');
    ++i;
  }
  r.any = i > digits;
  r.trailing = i < s.size();
  r.value = neg ? -v : v;
  return r;
}

// A Mooncake MC_* value: what Mooncake accepts is applied, what it would
// ignore is ignored with a warning (Mooncake warns and keeps its default).
template <class T>
void apply_mc(T& field, const ct::spec& s, const std::string& var, std::string_view text, const warner& warn,
              bool& applied) {
  applied = false;
  const std::string shown = var + "=\"" + std::string(text.substr(0, 64)) + "\"";
  if constexpr (is_text<T>) {
    if (s.rule == ct::mc_rule::force_tcp) {
      if (auto b = parse_flag(text); b && !*b)
        warn(shown + ": Mooncake forces TCP whenever " + var + " is set, whatever its value, and so does tide; "
                     "unset it to use RDMA");
      field = "tcp";
    } else {
      field = std::string(text);
    }
    applied = true;
  } else if constexpr (!is_list<T> && !is_flag<T>) {
    const auto n = read_leading_int(text);
    if (!n.any) {
      warn(shown + " is not a number: ignored, as Mooncake does");
      return;
    }
    if (s.rule == ct::mc_rule::mtu) {
      if (n.value != 512 && n.value != 1024 && n.value != 2048 && n.value != 4096) {
        warn(shown + ": Mooncake takes 512, 1024, 2048 or 4096; ignored, as Mooncake does");
        return;
      }
    } else if (n.value < s.mc_lo || n.value > s.mc_hi) {
      warn(shown + ": Mooncake takes " + std::to_string(s.mc_lo) + ".." + std::to_string(s.mc_hi) +
           "; ignored, as Mooncake does");
      return;
    }
    const long long x = n.value * s.mc_scale;
    if (x < s.lo || x > s.hi) {
      warn(shown + ": tide's " + std::string(s.key) + " takes " + std::to_string(s.lo) + ".." + std::to_string(s.hi) +
           "; ignored");
      return;
    }
    if (n.trailing)
      warn(shown + ": read as " + std::to_string(n.value) + " (Mooncake reads the leading digits)");
    assign(field, x);
    applied = true;
  }
}


bool is_tide_name(std::string_view name) {
  bool known = false;
  (void)ct::each([&](const ct::spec& s, auto) -> status {
    known = known || ct::env_name(s.key) == name || s.old_env == name;
    return {};
  });
  return known;
}

bool is_read_mc_name(std::string_view name) {
  if (name == "MC_LOG_LEVEL") return true;
  bool known = false;
  (void)ct::each([&](const ct::spec& s, auto) -> status {
    known = known || s.mc == name;
    return {};
  });
  return known;
}

// Variables of tide's process (not engine settings), and the ones its own
// scripts, tests and Python package read: not misspellings.
bool is_other_tide_variable(std::string_view name) {
  static constexpr std::string_view kExact[] = {"TIDE_CONFIG", "TIDE_LOG_LEVEL", "TIDE_BUILD", "TIDE_ROOT",
                                                "TIDE_ETCD", "TIDE_METADATA_SERVER", "TIDE_PROMTOOL", "TIDE_PACKAGES"};
  static constexpr std::string_view kPrefixes[] = {"TIDE_BENCH_", "TIDE_VM_", "TIDE_TEST_", "TIDE_RXE_",
                                                   "TIDE_TSAN_", "TIDE_FUZZ_", "TIDE_STRESS_", "TIDE_PERFTEST_",
                                                   "TIDE_RUN_", "TIDE_MOONCAKE_", "TIDE_PY_"};
  for (auto e : kExact)
    if (name == e) return true;
  for (auto p : kPrefixes)
    if (name.starts_with(p)) return true;
  return false;
}

}  // namespace

// The environment onto `c`: per setting TIDE_<KEY>, else its former TIDE_
// spelling, else Mooncake's variable (and the one Mooncake falls back to).
status apply_environment(engine_config& c, const warner& warn, source_map* sources) {
  return ct::each([&](const ct::spec& s, auto member) -> status {
    auto& field = c.*member;
    using T = field_t<decltype(field)>;
    const std::string name = ct::env_name(s.key);
    if (const char* v = getenv_set(name)) {
      if (auto r = parse_strict<T>(field, s, name, v); !r) return r;
      if (sources) (*sources)[std::string(s.key)] = {config_source::environment, name};
      return {};
    }
    if (!s.old_env.empty()) {
      const std::string old(s.old_env);
      if (const char* v = getenv_set(old)) {
        warn(old + " is deprecated: tide reads it as " + name + " (the variable of \"" + std::string(s.key) +
             "\"); rename it");
        if (auto r = parse_strict<T>(field, s, old, v); !r) return r;
        if (sources) (*sources)[std::string(s.key)] = {config_source::environment, old};
        return {};
      }
    }
    for (std::string_view mc : {s.mc, s.mc_fallback}) {
      if (mc.empty()) continue;
      const std::string var(mc);
      const char* v = getenv_set(var);
      if (v == nullptr) continue;
      bool applied = false;
      apply_mc<T>(field, s, var, v, warn, applied);
      if (applied && sources) (*sources)[std::string(s.key)] = {config_source::environment, var};
      break;  // Mooncake reads the fallback only when the first is unset
    }
    return {};
  });
}

// Names in the environment that look like settings and are none: a
// misspelt TIDE_* (warned; the file refuses unknown keys, the environment
// cannot), and the MC_* spellings of tide's own settings that earlier tide
// read and Mooncake never defined.
void check_names(const warner& warn) {
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name.starts_with("TIDE_")) {
      if (!is_tide_name(name) && !is_other_tide_variable(name))
        warn(std::string(name) + " is not a tide setting: ignored (docs/configuration.md lists them)");
    } else if (name.starts_with("MC_") && !is_read_mc_name(name)) {
      const std::string tide_name = "TIDE_" + std::string(name.substr(3));
      if (is_tide_name(tide_name))
        warn(std::string(name) + " is not a Mooncake variable and tide does not read it: set " + tide_name);
    }
  }
}

}  // namespace tide::config_detail
