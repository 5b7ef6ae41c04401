#pragma once
// Private: a client-side TLS configuration (OpenSSL through Boost.Asio SSL)
// built once per backend from files, then shared by every request of that
// backend.  Beast/Asio SSL headers stay in the .cpp files.
//
// Ownership: the backend owns it (shared_ptr); after construction it is
// read-only, and OpenSSL allows SSL objects to be made from one SSL_CTX on
// several threads at once, so every thread may use it.

#include <tide/result.hpp>

#include <memory>
#include <string>

namespace boost::asio::ssl {
class context;
}

namespace tide::detail {

struct tls_files {
  /// PEM file of the CAs that sign the server's certificate; empty = the
  /// system's default store.
  std::string ca_file;
  /// PEM client certificate (chain) and its private key; both or neither.
  std::string cert_file;
  std::string key_file;
  /// Check the chain and that the certificate names the endpoint (DNS name
  /// or IP address).  Off only when the operator asks.
  bool verify_server = true;
  /// Names the fields in errors, e.g. "etcd_" gives "etcd_ca_file".
  std::string field_prefix;
};

class tls_client_context {
 public:
  /// Loads the files.  Errors: errc::config_invalid naming the field, the
  /// path and OpenSSL's reason (unreadable file, not PEM, key does not
  /// match the certificate, a certificate without a key).
  [[nodiscard]] static result<std::shared_ptr<const tls_client_context>> load(const tls_files& files);

  ~tls_client_context();
  tls_client_context(const tls_client_context&) = delete;
  tls_client_context& operator=(const tls_client_context&) = delete;

  [[nodiscard]] bool verify_server() const noexcept { return verify_server_; }
  [[nodiscard]] bool has_client_certificate() const noexcept { return has_cert_; }
  [[nodiscard]] boost::asio::ssl::context& native() const noexcept { return *ctx_; }

 private:
  tls_client_context();
  std::unique_ptr<boost::asio::ssl::context> ctx_;
  bool verify_server_ = true;
  bool has_cert_ = false;
};

}  // namespace tide::detail
