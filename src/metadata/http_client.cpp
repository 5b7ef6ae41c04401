// The one TU that instantiates Beast's client side (plain and TLS).

#include "http_client.hpp"

#include "tls_context.hpp"

#include <tide/net/address.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <type_traits>
#include <vector>

namespace tide::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

// Runs `ctx` until the operation started before the call has completed; the
// caller's stream or timer bounds it, so this always returns.
void run_all(asio::io_context& ctx) {
  ctx.restart();
  ctx.run();
}

bool is_tls_error(const error_code& ec) {
  return ec.category() == asio::error::get_ssl_category() || ec == asio::ssl::error::stream_truncated;
}

// `ssl` (may be null) adds X509's reason after a failed verification.
std::string describe(const error_code& ec, SSL* ssl = nullptr) {
  if (ec == beast::error::timeout || ec == asio::error::operation_aborted) return "timed out";
  std::string m = ec.message();
  if (ssl != nullptr) {
    const long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) m += " (" + std::string(X509_verify_cert_error_string(v)) + ")";
  }
  ERR_clear_error();
  return m;
}

template <class Stream>
constexpr bool kIsTls = !std::is_same_v<Stream, beast::tcp_stream>;

// Connect, TLS handshake when Stream is an ssl_stream, write, read.
template <class Stream>
result<http_reply> exchange(asio::io_context& ctx, Stream& stream, const std::vector<tcp::endpoint>& endpoints,
                            std::string_view host, const std::string& where, const tls_client_context* tls,
                            std::chrono::steady_clock::time_point deadline, bhttp::request<bhttp::string_body>& req) {
  auto& tcp_layer = beast::get_lowest_layer(stream);
  std::optional<error_code> result_ec;
  tcp_layer.expires_at(deadline);
  tcp_layer.async_connect(endpoints, [&](const error_code& e, const tcp::endpoint&) { result_ec = e; });
  run_all(ctx);
  if (!result_ec || *result_ec) {
    return fail(errc::metadata_unavailable,
                "connect to " + where + ": " + (result_ec ? describe(*result_ec) : std::string("timed out")));
  }

  SSL* ssl = nullptr;
  if constexpr (kIsTls<Stream>) {
    ssl = stream.native_handle();
    const std::string name(host);
    error_code ip_ec;
    asio::ip::make_address(name, ip_ec);
    const bool is_ip = !ip_ec;
    // SNI carries names only (RFC 6066); the check covers both kinds.
    if (!is_ip) SSL_set_tlsext_host_name(ssl, name.c_str());
    if (tls->verify_server()) {
      X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      const int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                           : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
      if (ok != 1) return fail(errc::metadata_unavailable, "TLS: cannot check the certificate of " + where);
    }
    result_ec.reset();
    tcp_layer.expires_at(deadline);
    stream.async_handshake(asio::ssl::stream_base::client, [&](const error_code& e) { result_ec = e; });
    run_all(ctx);
    if (!result_ec || *result_ec) {
      return fail(errc::metadata_unavailable,
                  "TLS handshake with " + where + " failed: " + (result_ec ? describe(*result_ec, ssl) : "timed out"));
    }
  }

  // With TLS 1.3 the server checks the client's certificate after the
  // client's side of the handshake is done, so its refusal arrives here: as
  // an alert, or, when the server's reset overtakes the alert, as a reset.
  auto io_failure = [&](const char* what, const std::optional<error_code>& e) {
    std::string m = std::string(what) + " " + where + ": ";
    if (!e) return m + "timed out";
    const bool reset = *e == asio::error::connection_reset || *e == asio::error::broken_pipe ||
                       *e == bhttp::error::end_of_stream || *e == asio::error::eof;
    if (tls == nullptr || (!is_tls_error(*e) && !reset)) return m + describe(*e);
    if (is_tls_error(*e)) {
      // One request per connection: an alert here ends the handshake.
      m = "TLS handshake with " + where + " failed (the server refused after the client's part): " + describe(*e, ssl);
    } else {
      m = "TLS session with " + where + " ended right after the handshake, " + what + ": " + describe(*e) +
          " (servers do this when they refuse the client certificate)";
    }
    if (!tls->has_client_certificate()) m += " (no client certificate configured)";
    return m;
  };

  result_ec.reset();
  tcp_layer.expires_at(deadline);
  bhttp::async_write(stream, req, [&](const error_code& e, std::size_t) { result_ec = e; });
  run_all(ctx);
  if (!result_ec || *result_ec) return fail(errc::metadata_unavailable, io_failure("sending the request to", result_ec));

  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(kMaxHttpBody);
  result_ec.reset();
  tcp_layer.expires_at(deadline);
  bhttp::async_read(stream, buffer, parser, [&](const error_code& e, std::size_t) { result_ec = e; });
  run_all(ctx);
  if (!result_ec || *result_ec) {
    return fail(errc::metadata_unavailable, io_failure("reading the reply from", result_ec));
  }
  // No TLS close_notify exchange: the reply is complete (Content-Length or
  // chunked), and waiting for the server's close_notify would only cost time.
  error_code ignored;
  tcp_layer.socket().shutdown(tcp::socket::shutdown_both, ignored);
  auto res = parser.release();
  return http_reply{res.result_int(), std::move(res.body())};
}

}  // namespace

result<http_reply> http_request(std::string_view host, std::uint16_t port, std::string_view method,
                                std::string_view target, std::string_view body, std::string_view content_type,
                                std::chrono::milliseconds timeout, const http_request_options& options) try {
  const std::string where = net::format_peer_address(host, port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const bhttp::verb verb = bhttp::string_to_verb(beast::string_view{method.data(), method.size()});
  if (verb == bhttp::verb::unknown) return fail(errc::invalid_argument, "HTTP method " + std::string(method));

  asio::io_context ctx{1};

  std::vector<tcp::endpoint> endpoints;
  error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (!ec) {
    endpoints.emplace_back(addr, port);
  } else {
    tcp::resolver resolver{ctx};
    asio::steady_timer timer{ctx};
    std::optional<error_code> done;
    resolver.async_resolve(std::string(host), std::to_string(port),
                           [&](const error_code& e, const tcp::resolver::results_type& r) {
                             done = e;
                             timer.cancel();
                             for (const auto& entry : r) endpoints.push_back(entry.endpoint());
                           });
    timer.expires_at(deadline);
    timer.async_wait([&](const error_code& e) {
      if (!e) resolver.cancel();
    });
    run_all(ctx);
    if (!done || *done || endpoints.empty()) {
      return fail(errc::metadata_unavailable,
                  "cannot resolve " + where + ": " + (done && *done ? describe(*done) : std::string("no address")));
    }
  }

  bhttp::request<bhttp::string_body> req{verb, std::string(target), 11};
  req.set(bhttp::field::host, where);
  req.set(bhttp::field::user_agent, "tide");
  if (!content_type.empty()) req.set(bhttp::field::content_type, beast::string_view{content_type.data(), content_type.size()});
  if (!options.authorization.empty()) req.set(bhttp::field::authorization, options.authorization);
  req.keep_alive(false);
  req.body() = std::string(body);
  req.prepare_payload();

  if (options.tls) {
    beast::ssl_stream<beast::tcp_stream> stream{ctx, options.tls->native()};
    return exchange(ctx, stream, endpoints, host, where, options.tls.get(), deadline, req);
  }
  beast::tcp_stream stream{ctx};
  return exchange(ctx, stream, endpoints, host, where, nullptr, deadline, req);
} catch (const std::bad_alloc&) {
  return fail(errc::out_of_memory, "HTTP request to " + net::format_peer_address(host, port));
} catch (const std::exception& e) {
  return fail(errc::metadata_unavailable, "HTTP request to " + net::format_peer_address(host, port) + ": " + e.what());
}

result<std::string> read_secret_file(std::string_view field, const std::string& path) {
  const std::string where = std::string(field) + " \"" + path + "\"";
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(errc::config_invalid, where + ": cannot be read");
  std::string text(4097, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > 4096) return fail(errc::config_invalid, where + ": longer than 4096 bytes");
  text.erase(std::min(text.find_first_of("\r\n"), text.size()));
  if (text.empty()) return fail(errc::config_invalid, where + ": empty");
  return text;
}

std::string url_escape(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

result<std::string> url_unescape(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%') {
      if (i + 2 >= s.size()) {
        return fail(errc::invalid_argument, "truncated %-escape in \"" + std::string(s) + "\"");
      }
      const int hi = hex(s[i + 1]);
      const int lo = hex(s[i + 2]);
      if (hi < 0 || lo < 0) return fail(errc::invalid_argument, "bad %-escape in \"" + std::string(s) + "\"");
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace tide::detail
