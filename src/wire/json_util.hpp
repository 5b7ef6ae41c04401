#pragma once
// Private helpers for the JSON codecs (descriptors.cpp, segment_codec.cpp, etcd_codec.cpp): a depth
// bound checked before parsing, and typed field readers whose errors name the
// field.  Not installed; nlohmann stays out of public headers.

#include <tide/result.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::detail {

/// Deepest nesting a decoder accepts.  Descriptors nest 4 levels; the bound
/// keeps hostile input ("[[[[...") from costing recursion anywhere.
inline constexpr int kMaxJsonDepth = 32;

[[nodiscard]] inline tl::unexpected<error> malformed(const std::string& field, const std::string& what) {
  return tl::unexpected<error>(error{errc::metadata_malformed, field + ": " + what});
}

[[nodiscard]] inline tl::unexpected<error> wrong_type(const nlohmann::json& v, const std::string& field,
                                                      const char* expected) {
  return malformed(field, std::string("expected ") + expected + ", got " + v.type_name());
}

/// Nesting depth of `text` outside string literals, or -1 past `limit`.
[[nodiscard]] inline int json_depth(std::string_view text, int limit) noexcept {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return -1;
      if (depth > max_depth) max_depth = depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

/// Parses `text` (surrounding whitespace, e.g. the trailing '\n', allowed)
/// and requires a JSON object.
[[nodiscard]] inline result<nlohmann::json> parse_object(std::string_view text) {
  if (json_depth(text, kMaxJsonDepth) < 0) {
    return malformed("json", "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return malformed("json", e.what());
  }
  if (!j.is_object()) return wrong_type(j, "json", "an object");
  return j;
}

/// An unsigned integer no larger than `max`; floats, strings and negative
/// numbers are rejected.
[[nodiscard]] inline result<std::uint64_t> read_unsigned(const nlohmann::json& v, const std::string& field,
                                                         std::uint64_t max) {
  std::uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<std::uint64_t>();
  } else if (v.is_number_integer()) {
    const std::int64_t s = v.get<std::int64_t>();
    if (s < 0) return malformed(field, "must not be negative, got " + std::to_string(s));
    x = static_cast<std::uint64_t>(s);
  } else {
    return wrong_type(v, field, "an unsigned integer");
  }
  if (x > max) {
    return malformed(field, std::to_string(x) + " is out of range (at most " + std::to_string(max) + ")");
  }
  return x;
}

/// Reads the members of one JSON object; `path` prefixes the field names in
/// error details ("buffers[2]" -> "buffers[2].addr").
class json_field {
 public:
  json_field(const nlohmann::json& obj, std::string path) : obj_(obj), path_(std::move(path)) {}

  [[nodiscard]] std::string name(const char* key) const {
    return path_.empty() ? std::string(key) : path_ + "." + key;
  }
  [[nodiscard]] const nlohmann::json* find(const char* key) const {
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  [[nodiscard]] result<const nlohmann::json*> require(const char* key) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return malformed(name(key), "missing");
    return v;
  }
  [[nodiscard]] result<std::string> string(const char* key) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return malformed(name(key), "missing");
    if (!v->is_string()) return wrong_type(*v, name(key), "a string");
    return v->get<std::string>();
  }
  [[nodiscard]] result<std::uint64_t> unsigned_int(const char* key, std::uint64_t max) const {
    const nlohmann::json* v = find(key);
    if (v == nullptr) return malformed(name(key), "missing");
    return read_unsigned(*v, name(key), max);
  }

 private:
  const nlohmann::json& obj_;
  std::string path_;
};

/// `lhs = *expr`, or returns expr's error from the enclosing function.
#define TIDE_TRY_ASSIGN(lhs, expr)                                   \
  do {                                                               \
    auto tide_r_ = (expr);                                           \
    if (!tide_r_) return tl::unexpected(std::move(tide_r_.error())); \
    lhs = std::move(*tide_r_);                                       \
  } while (0)

[[nodiscard]] inline nlohmann::json u32_array_json(const std::vector<std::uint32_t>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (auto x : v) a.push_back(x);
  return a;
}

/// Compact JSON and a newline, as Mooncake writes descriptors and handshakes.
[[nodiscard]] inline std::string dump_line(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  s.push_back('\n');
  return s;
}

[[nodiscard]] inline result<std::vector<std::uint32_t>> read_u32_array(const nlohmann::json& v,
                                                                       const std::string& field) {
  if (!v.is_array()) return wrong_type(v, field, "an array of unsigned integers");
  std::vector<std::uint32_t> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    auto x = read_unsigned(v[i], field + "[" + std::to_string(i) + "]", UINT32_MAX);
    if (!x) return tl::unexpected(std::move(x.error()));
    out.push_back(static_cast<std::uint32_t>(*x));
  }
  return out;
}

}  // namespace tide::detail
