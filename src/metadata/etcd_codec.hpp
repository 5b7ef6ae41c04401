#pragma once
// Private: the JSON of etcd's v3 gateway and base64, without I/O, so the
// fuzz target (test/fuzz/etcd_fuzz.cpp) can reach the response decoders.

#include <tide/result.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tide::detail {

[[nodiscard]] std::string base64_encode(std::string_view in);
/// Standard alphabet, padding required.  errc::metadata_malformed otherwise.
[[nodiscard]] result<std::string> base64_decode(std::string_view in);

/// {"key":"<b64>"}
[[nodiscard]] std::string etcd_key_request(std::string_view key);
/// {"key":"<b64>","value":"<b64>"}
[[nodiscard]] std::string etcd_put_request(std::string_view key, std::string_view value);

/// {"name":"<user>","password":"<password>"} for /v3/auth/authenticate.
[[nodiscard]] std::string etcd_authenticate_request(std::string_view user, std::string_view password);
/// The "token" of a /v3/auth/authenticate reply.
[[nodiscard]] result<std::string> parse_etcd_token(std::string_view body);

/// The value of the first kv in a /v3/kv/range reply; nullopt when there is
/// none.  errc::metadata_malformed when the reply is not what etcd sends.
[[nodiscard]] result<std::optional<std::string>> parse_etcd_range(std::string_view body);
/// The "deleted" count of a /v3/kv/deleterange reply (0 when omitted).
[[nodiscard]] result<std::uint64_t> parse_etcd_deleted(std::string_view body);
/// Checks a /v3/kv/put reply (an object with a "header").
[[nodiscard]] status parse_etcd_put(std::string_view body);

}  // namespace tide::detail
