#pragma once
/// tide::policy::etcd — descriptors in etcd through its v3 JSON gateway
/// (POST /v3/kv/range, /v3/kv/put, /v3/kv/deleterange; keys and values
/// base64), over Boost.Beast.  Keys follow Mooncake's scheme,
/// mooncake/[<cluster_id>/]ram/<segment>, so tide and Mooncake peers can
/// share one etcd.
///
/// Connection string: "etcd://host:port[,host:port...]" (or the same without
/// the scheme, as Mooncake accepts), or "etcds://..." for https.
///
/// TLS (metadata_config::etcd_*; OpenSSL through Boost.Asio SSL): on with
/// etcds:// or when any of etcd_ca_file / etcd_cert_file / etcd_key_file is
/// set.  The server's certificate is verified against etcd_ca_file (else the
/// system store) and must name the endpoint (DNS SAN, or IP SAN for an IP
/// endpoint) unless etcd_verify_server is false.  A client certificate and
/// key are presented when given (etcd --client-cert-auth).  TLS 1.2+.
/// Auth: with etcd_user and etcd_password_file, the backend gets a token from
/// /v3/auth/authenticate on first use and sends it as the Authorization
/// header; a token etcd rejects (HTTP 401: expired, member restarted) is
/// replaced once per request.  The password never appears in errors or logs.
/// etcd (3.4+) refuses gateway requests whose client certificate carries a
/// Common Name while auth is on: with both, issue the certificate without one.  Each call starts with the endpoint that
/// last answered and moves to the next on any failure (refused, timed out,
/// HTTP error), so a cluster with a dead member keeps working.
/// Timeouts: each endpoint attempt is bounded by config.timeout (connect +
/// request + reply); a call therefore takes at most endpoints x timeout.
/// Errors: errc::segment_not_found, errc::metadata_unavailable (every
/// endpoint failed; the detail lists why per endpoint, e.g. "TLS handshake
/// with 127.0.0.1:2379 failed: certificate verify failed (...)", "etcd
/// authentication as user \"root\" ... failed: HTTP 400: ..."),
/// errc::config_invalid (bad connection string; an unreadable or mismatched
/// CA / certificate / key / password file, naming the etcd_* field).
/// Thread-safe: each call uses its own connection (and, with TLS, its own
/// handshake); the auth token is shared under a mutex.

#include <tide/metadata/backend.hpp>

#include <memory>
#include <string>
#include <string_view>

namespace tide::policy {

class etcd {
 public:
  static constexpr std::string_view kName = "etcd";

  explicit etcd(const metadata_config& config);
  etcd(etcd&&) noexcept;
  etcd& operator=(etcd&&) noexcept;
  ~etcd();

  [[nodiscard]] result<std::string> get_segment(std::string_view name);
  [[nodiscard]] status put_segment(std::string_view name, std::string_view json);
  /// Errors: errc::segment_not_found when the key did not exist.
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

static_assert(metadata_key_store<etcd>);

}  // namespace tide::policy
