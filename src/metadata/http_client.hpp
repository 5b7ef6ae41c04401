#pragma once
// Private: one HTTP/1.1 request over Boost.Beast, bounded by a deadline.
// Shared by the etcd and http backends so that Beast is compiled in one TU.

#include <tide/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tide::detail {

struct http_reply {
  unsigned status = 0;
  std::string body;
};

/// Largest reply body read (Mooncake's largest handshake frame, 128 MiB).
inline constexpr std::size_t kMaxHttpBody = std::size_t{128} << 20;

class tls_client_context;

struct http_request_options {
  /// Non-null: https.  The server's certificate is checked against `host`
  /// (a DNS name, or an IP address against the IP SANs) unless the context
  /// says not to verify; `host` also goes out as SNI when it is a name.
  std::shared_ptr<const tls_client_context> tls;
  /// Sent as the Authorization header when not empty (never logged).
  std::string authorization;
};

/// Sends `method target` with `body` to host:port and reads the reply, all
/// within `timeout`.  Any HTTP status is a success here; the caller decides.
/// Errors: errc::metadata_unavailable (resolve, connect, TLS handshake, I/O
/// or timeout; the detail names host:port and the cause; TLS failures start
/// with "TLS" and name OpenSSL's reason, e.g. "certificate verify failed").
/// Thread-safe.
[[nodiscard]] result<http_reply> http_request(std::string_view host, std::uint16_t port, std::string_view method,
                                              std::string_view target, std::string_view body,
                                              std::string_view content_type, std::chrono::milliseconds timeout,
                                              const http_request_options& options = {});

/// The first line of a password or token file, without its line end.
/// Errors: errc::config_invalid naming `field` and the path (unreadable,
/// empty, over 4 KiB); the content never appears in an error.
[[nodiscard]] result<std::string> read_secret_file(std::string_view field, const std::string& path);

/// Percent-encodes everything but A-Z a-z 0-9 - . _ ~ (as curl_easy_escape).
[[nodiscard]] std::string url_escape(std::string_view s);
/// Decodes %XX and '+' (a space); errc::invalid_argument on a bad escape.
[[nodiscard]] result<std::string> url_unescape(std::string_view s);

}  // namespace tide::detail
