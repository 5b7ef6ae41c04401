#pragma once
/// tide::policy::http — Mooncake's HTTP metadata protocol:
///   GET    <url>?key=<url-escaped key>   200 + body, 404 when absent
///   PUT    <url>?key=<key>  body = JSON (Content-Type: application/json)
///   DELETE <url>?key=<key>
/// against Mooncake's metadata server or tide's own `tide-metadata-server`.
/// Keys: mooncake/[<cluster_id>/]ram/<segment>.
///
/// Connection string: "http://host:port/path" (https is not supported).
/// With config.token_file set, PUT and DELETE carry
/// "Authorization: Bearer <token>" (tide-metadata-server --token-file); GET
/// never does.  An unreadable or empty token file is errc::config_invalid.
/// Timeouts: config.timeout bounds each call (connect + request + reply).
/// Errors: errc::segment_not_found (404), errc::metadata_unavailable
/// (unreachable, timed out, other HTTP status: 401 for a missing or wrong
/// token, 413 / 507 / 503 for the server's bounds, with its reason),
/// errc::config_invalid.
/// Thread-safe: each call uses its own connection.

#include <tide/metadata/backend.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace tide::policy {

class http {
 public:
  static constexpr std::string_view kName = "http";

  explicit http(const metadata_config& config);
  http(http&&) noexcept;
  http& operator=(http&&) noexcept;
  ~http();

  [[nodiscard]] result<std::string> get_segment(std::string_view name);
  [[nodiscard]] status put_segment(std::string_view name, std::string_view json);
  [[nodiscard]] status remove_segment(std::string_view name);

  /// The same operations on a full key (no "mooncake/.../ram/" added), for
  /// the keys Mooncake keeps beside the descriptors, e.g. rpc_meta_key().
  /// Errors as the segment calls (segment_not_found: no such key).
  [[nodiscard]] result<std::string> get_key(std::string_view key);
  [[nodiscard]] status put_key(std::string_view key, std::string_view json);
  [[nodiscard]] status remove_key(std::string_view key);

  struct impl;  ///< not API

 private:
  std::unique_ptr<impl> impl_;
};

static_assert(metadata_key_store<http>);

}  // namespace tide::policy
