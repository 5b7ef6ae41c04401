#pragma once
/// An in-memory metadata server speaking Mooncake's HTTP protocol:
///   GET    <path>?key=<k>  -> 200 + stored body, 404 "metadata not found"
///   PUT    <path>?key=<k>  -> 200 "metadata updated" (body stored as is)
///   DELETE <path>?key=<k>  -> 200 "metadata deleted", 404 when absent
/// Other paths 404, a missing key 400, other methods 405.  HTTP/1.1
/// keep-alive.  What `tide-metadata-server` runs; deployments without etcd
/// point tide::policy::http (or Mooncake's http:// metadata) at it.
///
/// Bounds (each named in its error reply, so an operator sees which to raise):
///   413 "value too large ... max_value_bytes"   a PUT body over max_value_bytes
///   507 "... max_keys" / "... max_total_bytes" a PUT of a new key past max_keys,
///                                               or past max_total_bytes stored
///   503 "too many connections ... max_connections" then close
///   a request (or a reply) not done within request_timeout: connection dropped
/// Memory is therefore bounded by about max_total_bytes stored plus
/// max_connections x max_value_bytes in flight.
/// Writes: with a token set, PUT and DELETE need "Authorization: Bearer
/// <token>" (401 otherwise, nothing changed); GET stays open because
/// Mooncake peers read descriptors without one.  Without a token the server
/// is Mooncake's: anyone who reaches it may write.
///
///   auto srv = http_metadata_server::start({.host = "0.0.0.0", .port = 8080});
///   srv->port(); srv->stop();
///
/// One I/O thread owns every connection and the acceptor; the key-value map
/// is under a mutex so key_count() may be called from any thread.  Beast
/// lives in src/metadata/http_metadata_server.cpp only (pimpl).

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
  /// Largest PUT body (one descriptor); Mooncake's descriptors are a few KiB
  /// plus ~150 bytes per registered buffer.
  std::size_t max_value_bytes = std::size_t{4} << 20;
  std::size_t max_keys = 100000;
  /// Keys plus values stored, in bytes.
  std::size_t max_total_bytes = std::size_t{1} << 30;
  /// Closes a connection that has not delivered a whole request (idle, or
  /// trickling it) or not taken its reply within this time.
  std::chrono::milliseconds request_timeout{10000};
  std::size_t max_connections = 256;
  /// A file holding the bearer token PUT and DELETE need; empty = no token.
  std::string token_file = {};  // initialised: designated inits that omit it stay warning-free
};

class http_metadata_server {
 public:
  /// Errors: errc::config_invalid (host not an IP address, path not "/...",
  /// a zero bound, an unreadable or empty token_file),
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
  /// Bytes of keys and values stored now.  Thread-safe.
  [[nodiscard]] std::size_t stored_bytes() const;
  /// Closes everything and joins the thread.  Idempotent.
  void stop() noexcept;

  struct impl;  ///< not API

 private:
  explicit http_metadata_server(std::unique_ptr<impl> p) noexcept;
  std::unique_ptr<impl> impl_;
};

}  // namespace tide
