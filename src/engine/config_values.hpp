#pragma once
// Private to src/engine: what config.cpp (the TIDE_CONFIG file, the
// program's values, the report) and config_env.cpp (the environment)
// share to read values into engine_config's fields.

#include "config_table.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace tide::config_detail {
namespace ct = config_table;

using ct::is_duration;
template <class T>
constexpr bool is_text = std::is_same_v<T, std::string>;
template <class T>
constexpr bool is_list = std::is_same_v<T, std::vector<std::string>>;
template <class T>
constexpr bool is_flag = std::is_same_v<T, bool>;

template <class T>
using field_t = std::remove_cvref_t<T>;

template <class T>
void assign(T& field, long long x) {
  if constexpr (is_duration<T>::value) field = T(x);
  else field = static_cast<T>(x);
}

inline std::string range_text(long long lo, long long hi) {
  return "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// The comma-separated words of `text`, blanks around each trimmed; an empty
// word is kept (where a list skips it, a transport set refuses it).
inline std::vector<std::string_view> comma_words(std::string_view text) {
  std::vector<std::string_view> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    std::string_view word = text.substr(at, end - at);
    while (!word.empty() && word.front() == ' ') word.remove_prefix(1);
    while (!word.empty() && word.back() == ' ') word.remove_suffix(1);
    out.push_back(word);
    at = end + 1;
  }
  return out;
}

// The value of a variable; nullptr when unset or empty (empty counts as unset).
inline const char* getenv_set(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// Warnings go to the report and to the log, each distinct text once per
// process (a program that creates many engines says it once).
class warner {
 public:
  explicit warner(config_report* report) : report_(report) {}
  void operator()(const std::string& text) const;

 private:
  config_report* report_;
};

// Where each key's value came from.
using source_map = std::map<std::string, std::pair<config_source, std::string>, std::less<>>;

/// TIDE_<KEY>, a former TIDE_ spelling, or Mooncake's MC_* variable onto
/// `c`, per setting (config_env.cpp).
status apply_environment(engine_config& c, const warner& warn, source_map* sources);
/// Warns about names in the environment that look like settings and are none.
void check_names(const warner& warn);

}  // namespace tide::config_detail
