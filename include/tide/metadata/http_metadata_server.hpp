#pragma once
/// An in-memory metadata server speaking Mooncake's HTTP protocol:
///   GET    <path>?key=<k>  -> 200 + stored body, 404 "metadata not found"
///   PUT    <path>?key=<k>  -> 200 "metadata updated" (body stored as is)
///   DELETE <path>?key=<k>  -> 200 "metadata deleted", 404 when absent
/// Other paths 404, a missing key 400, other methods 405.  HTTP/1.1
/// keep-alive.  What `tide-metadata-server` runs; deployments without etcd
/// point tide::policy::http (or Mooncake's http:// metadata) at it.
///
///   auto srv = http_metadata_server::start({.host = "0.0.0.0", .port = 8080});
///   srv->port(); srv->stop();
///
/// One I/O thread; every connection is asynchronous with an idle timeout.
/// Beast lives in src/metadata/http_metadata_server.cpp only (pimpl).

#include <tide/result.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tide {

struct http_metadata_server_config {
  std::string host = "127.0.0.1";  ///< IP address to bind
  std::uint16_t port = 8080;       ///< 0 = the kernel picks
  std::string path = "/metadata";  ///< Mooncake's default path
  std::size_t max_body = std::size_t{64} << 20;
  /// Closes a connection idle (or trickling a request) this long.
  std::chrono::milliseconds idle_timeout{30000};
  std::size_t max_connections = 1024;
};

class http_metadata_server {
 public:
  /// Errors: errc::config_invalid (host not an IP address, path not "/..."),
  /// errc::already_exists (port in use), errc::metadata_unavailable (other
  /// socket errors).
  [[nodiscard]] static result<http_metadata_server> start(http_metadata_server_config config);

  http_metadata_server(http_metadata_server&&) noexcept;
  http_metadata_server& operator=(http_metadata_server&&) noexcept;
  http_metadata_server(const http_metadata_server&) = delete;
  http_metadata_server& operator=(const http_metadata_server&) = delete;
  ~http_metadata_server();

  [[nodiscard]] std::uint16_t port() const noexcept;
  /// Keys stored now.  Thread-safe.
  [[nodiscard]] std::size_t key_count() const;
  /// Closes everything and joins the thread.  Idempotent.
  void stop() noexcept;

  struct impl;  ///< not API

 private:
  explicit http_metadata_server(std::unique_ptr<impl> p) noexcept;
  std::unique_ptr<impl> impl_;
};

}  // namespace tide
