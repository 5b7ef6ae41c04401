// The one TU that instantiates Beast's client side.

#include "http_client.hpp"

#include <tide/net/address.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <optional>

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

std::string describe(const error_code& ec) {
  return ec == beast::error::timeout || ec == asio::error::operation_aborted ? std::string("timed out")
                                                                             : ec.message();
}

}  // namespace

result<http_reply> http_request(std::string_view host, std::uint16_t port, std::string_view method,
                                std::string_view target, std::string_view body, std::string_view content_type,
                                std::chrono::milliseconds timeout) try {
  const std::string where = net::format_peer_address(host, port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const bhttp::verb verb = bhttp::string_to_verb(beast::string_view{method.data(), method.size()});
  if (verb == bhttp::verb::unknown) return fail(errc::invalid_argument, "HTTP method " + std::string(method));

  asio::io_context ctx{1};
  beast::tcp_stream stream{ctx};

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

  std::optional<error_code> result_ec;
  stream.expires_at(deadline);
  stream.async_connect(endpoints, [&](const error_code& e, const tcp::endpoint&) { result_ec = e; });
  run_all(ctx);
  if (!result_ec || *result_ec) {
    return fail(errc::metadata_unavailable,
                "connect to " + where + ": " + (result_ec ? describe(*result_ec) : std::string("timed out")));
  }

  bhttp::request<bhttp::string_body> req{verb, std::string(target), 11};
  req.set(bhttp::field::host, where);
  req.set(bhttp::field::user_agent, "tide");
  if (!content_type.empty()) req.set(bhttp::field::content_type, beast::string_view{content_type.data(), content_type.size()});
  req.keep_alive(false);
  req.body() = std::string(body);
  req.prepare_payload();

  result_ec.reset();
  stream.expires_at(deadline);
  bhttp::async_write(stream, req, [&](const error_code& e, std::size_t) { result_ec = e; });
  run_all(ctx);
  if (!result_ec || *result_ec) {
    return fail(errc::metadata_unavailable,
                "sending to " + where + ": " + (result_ec ? describe(*result_ec) : std::string("timed out")));
  }

  beast::flat_buffer buffer;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(kMaxHttpBody);
  result_ec.reset();
  stream.expires_at(deadline);
  bhttp::async_read(stream, buffer, parser, [&](const error_code& e, std::size_t) { result_ec = e; });
  run_all(ctx);
  if (!result_ec || *result_ec) {
    return fail(errc::metadata_unavailable,
                "reading the reply from " + where + ": " + (result_ec ? describe(*result_ec) : std::string("timed out")));
  }
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  auto res = parser.release();
  return http_reply{res.result_int(), std::move(res.body())};
} catch (const std::bad_alloc&) {
  return fail(errc::out_of_memory, "HTTP request to " + net::format_peer_address(host, port));
} catch (const std::exception& e) {
  return fail(errc::metadata_unavailable, "HTTP request to " + net::format_peer_address(host, port) + ": " + e.what());
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
