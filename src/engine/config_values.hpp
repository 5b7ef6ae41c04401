#pragma once
// Private to src/engine: what config.cpp (the TIDE_CONFIG file, the
// program's values, the report) and config_env.cpp (the environment)
// share to read values into engine_config's fields.

#include "config_table.hpp"

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
