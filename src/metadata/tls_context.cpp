#include "tls_context.hpp"

#include <boost/asio/ssl/context.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <fstream>

namespace tide::detail {

namespace ssl = boost::asio::ssl;
using boost::system::error_code;

namespace {

// OpenSSL's reason for the last failure, else the error code's message.
std::string reason(const error_code& ec) {
  const unsigned long e = ERR_peek_last_error();
  std::string r;
  if (e != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    const char* why = ERR_reason_error_string(e);
    r = why != nullptr ? why : buf;
  } else {
    r = ec.message();
  }
  ERR_clear_error();
  return r;
}

status readable(const std::string& field, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errc::config_invalid, field + " \"" + path + "\": cannot be read");
  return {};
}

}  // namespace

tls_client_context::tls_client_context() : ctx_(std::make_unique<ssl::context>(ssl::context::tls_client)) {}
tls_client_context::~tls_client_context() = default;

result<std::shared_ptr<const tls_client_context>> tls_client_context::load(const tls_files& files) try {
  const std::string ca_field = files.field_prefix + "ca_file";
  const std::string cert_field = files.field_prefix + "cert_file";
  const std::string key_field = files.field_prefix + "key_file";
  if (files.cert_file.empty() != files.key_file.empty()) {
    return fail(errc::config_invalid, files.cert_file.empty() ? key_field + " is set but " + cert_field + " is not"
                                                              : cert_field + " is set but " + key_field + " is not");
  }
  std::shared_ptr<tls_client_context> c{new tls_client_context()};
  ssl::context& ctx = *c->ctx_;
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  error_code ec;
  if (!files.ca_file.empty()) {
    if (auto r = readable(ca_field, files.ca_file); !r) return fail(r.error());
    ctx.load_verify_file(files.ca_file, ec);
    if (ec) return fail(errc::config_invalid, ca_field + " \"" + files.ca_file + "\": " + reason(ec));
  } else {
    ctx.set_default_verify_paths(ec);
    if (ec) return fail(errc::config_invalid, "the system's CA store: " + reason(ec));
  }
  if (!files.cert_file.empty()) {
    if (auto r = readable(cert_field, files.cert_file); !r) return fail(r.error());
    if (auto r = readable(key_field, files.key_file); !r) return fail(r.error());
    ctx.use_certificate_chain_file(files.cert_file, ec);
    if (ec) return fail(errc::config_invalid, cert_field + " \"" + files.cert_file + "\": " + reason(ec));
    ctx.use_private_key_file(files.key_file, ssl::context::pem, ec);
    if (ec) return fail(errc::config_invalid, key_field + " \"" + files.key_file + "\": " + reason(ec));
    if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
      return fail(errc::config_invalid, key_field + " \"" + files.key_file + "\" does not match " + cert_field + " \"" +
                                            files.cert_file + "\": " + reason({}));
    }
    c->has_cert_ = true;
  }
  ctx.set_verify_mode(files.verify_server ? ssl::verify_peer : ssl::verify_none);
  c->verify_server_ = files.verify_server;
  return std::shared_ptr<const tls_client_context>(std::move(c));
} catch (const std::bad_alloc&) {
  return fail(errc::out_of_memory, "TLS context");
} catch (const std::exception& e) {
  return fail(errc::config_invalid, std::string("TLS context: ") + e.what());
}

}  // namespace tide::detail
