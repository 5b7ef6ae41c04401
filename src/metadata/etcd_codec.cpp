#include "etcd_codec.hpp"

#include "json_util.hpp"

#include <array>
#include <charconv>

namespace tide::detail {

using nlohmann::json;

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<std::int8_t, 256> make_table() {
  std::array<std::int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<std::int8_t>(i);
  return t;
}
constexpr auto kTable = make_table();

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// etcd writes int64 fields as JSON strings (proto3 mapping); accept numbers too.
result<std::uint64_t> read_count(const json& v, const std::string& field) {
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    std::uint64_t x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) {
      return malformed(field, "\"" + s.substr(0, 32) + "\" is not a count");
    }
    return x;
  }
  return read_unsigned(v, field, UINT64_MAX);
}

}  // namespace

std::string base64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const std::uint32_t v = (static_cast<unsigned char>(in[i]) << 16) |
                            (static_cast<unsigned char>(in[i + 1]) << 8) | static_cast<unsigned char>(in[i + 2]);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  const std::size_t rest = in.size() - i;
  if (rest > 0) {
    std::uint32_t v = static_cast<unsigned char>(in[i]) << 16;
    if (rest == 2) v |= static_cast<unsigned char>(in[i + 1]) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

result<std::string> base64_decode(std::string_view in) {
  if (in.size() % 4 != 0) return malformed("base64", "length " + std::to_string(in.size()) + " is not a multiple of 4");
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (std::size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + static_cast<std::size_t>(k)];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return malformed("base64", "data after padding");
      v[k] = kTable[static_cast<unsigned char>(c)];
      if (v[k] < 0) return malformed("base64", "invalid character at offset " + std::to_string(i + static_cast<std::size_t>(k)));
    }
    const std::uint32_t bits = (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
                               (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    // Canonical only (what etcd writes): the bits under the padding are zero.
    if ((pad == 1 && (bits & 0xff) != 0) || (pad == 2 && (bits & 0xffff) != 0)) {
      return malformed("base64", "non-zero bits under the padding");
    }
    out.push_back(static_cast<char>((bits >> 16) & 0xff));
    if (pad < 2) out.push_back(static_cast<char>((bits >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(bits & 0xff));
  }
  return out;
}

std::string etcd_key_request(std::string_view key) { return dump(json{{"key", base64_encode(key)}}); }

std::string etcd_put_request(std::string_view key, std::string_view value) {
  return dump(json{{"key", base64_encode(key)}, {"value", base64_encode(value)}});
}

std::string etcd_authenticate_request(std::string_view user, std::string_view password) {
  return dump(json{{"name", user}, {"password", password}});
}

result<std::string> parse_etcd_token(std::string_view body) try {
  auto r = parse_object(body);
  if (!r) return tl::unexpected(std::move(r.error()));
  auto token = r->find("token");
  if (token == r->end()) return malformed("token", "missing");
  if (!token->is_string() || token->get_ref<const std::string&>().empty()) return wrong_type(*token, "token", "a non-empty string");
  return token->get<std::string>();
} catch (const std::exception& e) {
  return malformed("etcd reply", e.what());
}

result<std::optional<std::string>> parse_etcd_range(std::string_view body) try {
  json root;
  {
    auto r = parse_object(body);
    if (!r) return tl::unexpected(std::move(r.error()));
    root = std::move(*r);
  }
  auto kvs = root.find("kvs");
  if (kvs == root.end()) return std::optional<std::string>{};
  if (!kvs->is_array()) return wrong_type(*kvs, "kvs", "an array");
  if (kvs->empty()) return std::optional<std::string>{};
  const json& kv = (*kvs)[0];
  if (!kv.is_object()) return wrong_type(kv, "kvs[0]", "an object");
  auto value = kv.find("value");
  if (value == kv.end()) return std::optional<std::string>{std::string()};  // proto3 omits empty values
  if (!value->is_string()) return wrong_type(*value, "kvs[0].value", "a base64 string");
  auto decoded = base64_decode(value->get_ref<const std::string&>());
  if (!decoded) return malformed("kvs[0].value", decoded.error().detail);
  return std::optional<std::string>{std::move(*decoded)};
} catch (const std::exception& e) {
  return malformed("etcd reply", e.what());
}

result<std::uint64_t> parse_etcd_deleted(std::string_view body) try {
  auto r = parse_object(body);
  if (!r) return tl::unexpected(std::move(r.error()));
  auto deleted = r->find("deleted");
  if (deleted == r->end()) return std::uint64_t{0};
  return read_count(*deleted, "deleted");
} catch (const std::exception& e) {
  return malformed("etcd reply", e.what());
}

status parse_etcd_put(std::string_view body) try {
  auto r = parse_object(body);
  if (!r) return tl::unexpected(std::move(r.error()));
  if (r->find("header") == r->end()) return malformed("header", "missing");
  return {};
} catch (const std::exception& e) {
  return malformed("etcd reply", e.what());
}

}  // namespace tide::detail
